"""The replay engine: a trace through the real index and policies, on a clock.

Only the bytes are replaced by a timing model (BRIEF, "The simulator is the
real code"): the ``RadixIndex``, the admission and promotion policy objects
and the coordinator's timing model are the ones the runtime uses.

Model of one GPU serving the trace (all figures from the preset):

* Requests arrive (open loop, or closed loop per session) and wait in one
  FIFO prefill queue. A request's reload is issued when it is next in line
  (while the previous prefill computes) and shares the GPU's ingress link
  with earlier reloads through the coordinator (``ReloadQueue``); its
  prefill starts when both its reload and the GPU are done. TTFT = queueing
  + reload + prefill of the missed tokens. Decode is not modelled.
* Cache state changes are applied in arrival order, at arrival time.
* Three tiers in one index: the GPU prefix cache (HBM), a DRAM pool, the
  SSDs. A request's reusable prefix is the leading run of blocks held by any
  tier (``lookup="unified"``) or, as in a tier-by-tier lookup, the GPU run
  followed by the run of the first tier holding the next block
  (``lookup="tier-by-tier"``). A full hit still recomputes the last token.
* GPU hits cost nothing to load; DRAM and SSD parts are reloaded together
  through the coordinator model (serial / overlap / paced).
* After prefill the whole prompt is in HBM; blocks the GPU computed land in
  DRAM ("new KV lands in DRAM"); admission decides SSD writes at creation,
  on access and on DRAM eviction; promotion copies some SSD hits into DRAM,
  taking only slots of DRAM blocks idle for the policy's cutoff.
* Capacities are in blocks of ``block_size`` tokens; an SSD block lives on
  drive ``key % ssd_count``; full SSDs evict leaf-first LRU blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from saria.index import RadixIndex, Tier, VirtualClock
from saria.keys.trace import trace_block_keys
from saria.policy import AdmissionPolicy, PromotionPolicy
from saria.sim.presets import Preset
from saria.transfer import LinkModel, ReloadQueue, reload_time

GPU, DRAM, SSD = Tier.GPU, Tier.DRAM, Tier.SSD
_BIT = {t: 1 << int(t) for t in Tier}
LOOKUPS = ("unified", "tier-by-tier")


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request to replay: when it arrives and what it asks for."""

    time: float
    namespace: int
    input_tokens: int
    hash_ids: np.ndarray
    session: int = 0


@dataclass(slots=True)
class ReplayStats:
    """Counters of one replay; ``report()`` turns them into the JSON fields."""

    requests: int = 0
    input_tokens: int = 0
    hit_tokens: dict = field(default_factory=lambda: {"GPU": 0, "DRAM": 0, "SSD": 0})
    ssd_bytes_written: np.ndarray | None = None  # per drive (KV and checkpoints)
    ssd_bytes_read: np.ndarray | None = None     # per drive
    dram_evictions: int = 0
    ssd_evictions: int = 0
    promoted_blocks: int = 0
    baseline_hit_blocks: int = 0   # what a tier-by-tier lookup would have hit
    unified_hit_blocks: int = 0
    ttft: list = field(default_factory=list)
    hit_blocks: list = field(default_factory=list)  # per request, in service order
    load_s: float = 0.0
    prefill_s: float = 0.0
    first_arrival: float = float("inf")
    last_done: float = 0.0


@dataclass(frozen=True, slots=True)
class ReplaySetup:
    """Everything one replay run needs besides the trace."""

    preset: Preset
    admission: AdmissionPolicy
    promotion: PromotionPolicy
    coordinator: str = "paced"
    lookup: str = "unified"
    dram_bytes: float | None = None   # None: the preset's
    ssd_bytes: float | None = None    # per drive; None: the preset's; 0: no SSD
    trace_block_size: int = 64
    # False: no unified metadata -- a block's history is forgotten as soon as
    # it leaves every tier (per-tier caches), the ablation's "base".
    keep_history: bool = True

    @property
    def block_bytes(self) -> int:
        return self.preset.block_size * self.preset.model.kv_bytes_per_token


class Replay:
    """Replays arrivals through one index and one set of policies."""

    def __init__(self, setup: ReplaySetup) -> None:
        if setup.lookup not in LOOKUPS:
            raise ValueError(f"unknown lookup {setup.lookup!r}; valid: {', '.join(LOOKUPS)}")
        self.s = setup
        model = setup.preset.model
        self.hybrid = model.hybrid
        self.state_bytes = int(model.state_bytes)
        hw = setup.preset.hardware
        self.bs = setup.preset.block_size
        self.block_bytes = setup.block_bytes
        dram = hw.dram_bytes if setup.dram_bytes is None else setup.dram_bytes
        ssd = hw.ssd_bytes if setup.ssd_bytes is None else setup.ssd_bytes
        self.cap = {
            GPU: _blocks(hw.gpu_cache_bytes, self.block_bytes),
            DRAM: _blocks(dram, self.block_bytes),
            SSD: _blocks(ssd, self.block_bytes) * hw.ssd_count,
        }
        # A checkpoint occupies whole block slots of its tier (capacity unit).
        self.ckpt_units = -(-self.state_bytes // self.block_bytes) if self.hybrid else 0
        self.n_drives = hw.ssd_count
        self.ssd_on = self.cap[SSD] > 0 and not setup.admission.writes_nothing
        self.used = {GPU: 0, DRAM: 0, SSD: 0}
        self.link = LinkModel(hw.link_Bps, hw.dram_copy_Bps, hw.ssd_total_read_Bps,
                              hw.pacing_efficiency, hw.contention_ssd_share)
        self.clock = VirtualClock()
        finite = [c for c in self.cap.values() if c < _UNLIMITED]
        budget = max(4_000_000, 4 * sum(finite)) if finite else 4_000_000
        if not setup.keep_history:
            budget = 1  # only resident blocks stay tracked (the budget is soft for them)
        self.index = RadixIndex(budget, hybrid=self.hybrid, clock=self.clock)
        # SSD-written blocks, and those of them read back at least once.
        self._ssd_written: set[bytes] = set()
        self._ssd_read: set[bytes] = set()
        self.stats = ReplayStats(ssd_bytes_written=np.zeros(self.n_drives, np.int64),
                                 ssd_bytes_read=np.zeros(self.n_drives, np.int64))
        self.reloads = ReloadQueue(self.link, setup.coordinator)
        self.gpu_free_at = 0.0   # the GPU finishes its current prefill
        self.gpu_started = 0.0   # the current prefill started

    # -------------------------------------------------------------- driver

    def run(self, arrivals: Sequence[Arrival],
            progress: Callable[[int], None] | None = None) -> ReplayStats:
        tick = max(1, len(arrivals) // 200)
        for i, a in enumerate(arrivals):
            self.serve(a)
            if progress is not None and (i % tick == 0 or i == len(arrivals) - 1):
                progress(i + 1)
        return self.stats

    def serve(self, a: Arrival) -> float:
        """Serves one request; returns its TTFT."""
        st = self.stats
        self.clock.advance_to(max(self.clock.now, a.time))
        keys = trace_block_keys(a.hash_ids, namespace=a.namespace,
                                trace_block_size=self.s.trace_block_size,
                                engine_block_size=self.bs, num_tokens=a.input_tokens)
        n = keys.shape[0]
        plan = self.index.match(keys)
        # A full hit still recomputes the last token: at most (L-1)//bs blocks.
        limit = min(n, max(a.input_tokens - 1, 0) // self.bs)
        masks = plan.masks
        gpu_run = _run(masks, _BIT[GPU], 0, min(plan.num_blocks, limit))
        unified = min(plan.num_blocks, limit)
        baseline = gpu_run
        if gpu_run < unified:
            first = DRAM if masks[gpu_run] & _BIT[DRAM] else SSD
            baseline = gpu_run + _run(masks, _BIT[first], gpu_run, unified)
        ck_tier = None
        if self.hybrid:  # usable only up to a boundary with a state checkpoint
            cm = plan.checkpoint_masks
            unified, ck_u = _checkpointed(cm, unified)
            baseline, ck_b = _checkpointed(cm, baseline)
            ck_tier = ck_u if self.s.lookup == "unified" else ck_b
        hit = unified if self.s.lookup == "unified" else baseline
        gpu_run = min(gpu_run, hit)
        st.baseline_hit_blocks += baseline
        st.unified_hit_blocks += unified

        # Sources: GPU first, then DRAM, then SSD.
        seg = masks[gpu_run:hit]
        from_dram = (seg & _BIT[DRAM]) != 0
        if self.s.lookup == "tier-by-tier" and hit > gpu_run and not from_dram[0]:
            from_dram[:] = False  # the run came from the SSD tier alone
        ssd_pos = np.flatnonzero(~from_dram) + gpu_run
        n_dram = int(from_dram.sum())
        n_ssd = ssd_pos.shape[0]
        dram_bytes, ssd_bytes = n_dram * self.block_bytes, n_ssd * self.block_bytes
        if ck_tier == DRAM:
            dram_bytes += self.state_bytes
        elif ck_tier == SSD:
            ssd_bytes += self.state_bytes
            st.ssd_bytes_read[self._drive(keys[hit - 1:hit])[0]] += self.state_bytes
        load = reload_time(dram_bytes, ssd_bytes, self.link, self.s.coordinator)
        # The reload is issued when the request is next in line for the GPU
        # (one request of look-ahead, as a connector loads while the previous
        # prefill runs) and shares the ingress link with earlier reloads.
        loaded = self.reloads.submit(max(a.time, self.gpu_started), dram_bytes, ssd_bytes)
        model = self.s.preset.model
        new_tokens = a.input_tokens - hit * self.bs
        prefill = model.prefill_flops(new_tokens, a.input_tokens) / \
            self.s.preset.hardware.prefill_flops_per_s
        self.gpu_started = max(loaded, self.gpu_free_at)
        done = self.gpu_started + prefill
        ttft = done - a.time
        self.gpu_free_at = done

        st.requests += 1
        st.input_tokens += a.input_tokens
        st.hit_tokens["GPU"] += gpu_run * self.bs
        st.hit_tokens["DRAM"] += n_dram * self.bs
        st.hit_tokens["SSD"] += n_ssd * self.bs
        if n_ssd:
            np.add.at(st.ssd_bytes_read, self._drive(keys[ssd_pos]), self.block_bytes)
            self._ssd_read.update(map(bytes, keys[ssd_pos]))
        st.ttft.append(ttft)
        st.hit_blocks.append(hit)
        st.load_s += load
        st.prefill_s += prefill
        st.first_arrival = min(st.first_arrival, a.time)
        st.last_done = max(st.last_done, done)

        self.index.touch(keys, hits=hit, checkpoint_at=hit if ck_tier is not None else 0)
        self._after_prefill(keys, plan, hit, ssd_pos, n_dram, a.namespace)
        return ttft

    # ---------------------------------------------------------- mechanics

    def _after_prefill(self, keys, plan, hit, ssd_pos, n_dram, session) -> None:
        # The request's known blocks are in use: locked, no step below can
        # evict them, so `full` (the path's residency) stays true.
        n_known = plan.num_known
        self.index.lock(keys[:n_known])
        try:
            full = np.zeros(keys.shape[0], dtype=np.uint8)
            full[:n_known] = plan.masks
            self._ck = np.zeros(keys.shape[0], dtype=np.uint8)  # checkpoint masks of the path
            self._ck[:n_known] = plan.checkpoint_masks
            self._store(keys, full, n_known, hit, ssd_pos, n_dram, session)
            if self.hybrid:
                self._checkpoint(keys, full)
        finally:
            self.index.unlock(keys[:n_known])

    def _store(self, keys, full, n_known, hit, ssd_pos, n_dram, session) -> None:
        n = keys.shape[0]
        adm = self.s.admission
        # Early persistence of DRAM residents the request referenced.
        if self.ssd_on and n_known:
            resident = np.flatnonzero((full[:n_known] & _BIT[DRAM]) != 0)
            if resident.size:
                h = self.index.history(keys[:n_known])
                want = adm.on_access(keys[resident], h["reuse"][resident],
                                     h["hits"][resident], self.clock.now)
                self._write_ssd(keys, resident[want], full)
        # The whole prompt is in HBM after prefill.
        self._place(keys, np.flatnonzero((full & _BIT[GPU]) == 0), GPU, full, session)
        # Computed blocks (not hits) land in DRAM; write-through admission.
        computed = np.zeros(n, dtype=bool)
        computed[hit:] = True
        new_dram = np.flatnonzero(computed & ((full & _BIT[DRAM]) == 0))
        self._place(keys, new_dram, DRAM, full, session)
        if self.ssd_on and new_dram.size:
            want = adm.on_create(keys[new_dram], self.clock.now)
            self._write_ssd(keys, new_dram[want], full)
        # Promotion of SSD hits into DRAM, bounded by idle DRAM victims.
        pick = self.s.promotion.select(ssd_pos, n_dram)
        pick = pick[(full[pick] & _BIT[DRAM]) == 0]
        if pick.size:
            room = self._make_room(DRAM, pick.size, self.s.promotion.min_victim_age_s)
            pick = pick[:room]
            if pick.size:
                self._add(keys, pick, DRAM, full, session)
                self.stats.promoted_blocks += int(pick.size)

    def _place(self, keys, pos, tier, full, session) -> None:
        """Adds `pos` to `tier`, evicting LRU blocks; if the tier cannot hold
        them all, the earliest positions (the shared prefix) win."""
        if pos.size == 0 or self.cap[tier] == 0:
            return
        room = self._make_room(tier, pos.size, None)
        self._add(keys, pos[:room], tier, full, session)

    def _add(self, keys, pos, tier, full, session) -> None:
        if pos.size == 0:
            return
        last = int(pos[-1]) + 1
        self.index.add(keys[:last], tier, np.zeros(pos.size, np.uint32), where=pos,
                       session=session)
        full[pos] |= _BIT[tier]
        self.used[tier] += int(pos.size)

    def _make_room(self, tier, want, older_than) -> int:
        """Frees capacity units in `tier` for up to `want`; returns how many
        fit. A victim's checkpoint in the tier leaves with it."""
        free = self.cap[tier] - self.used[tier]
        while free < want:
            ev = self.index.evict(tier, want - free, older_than=older_than)
            k = len(ev)
            if k == 0:
                break
            self.used[tier] -= k
            if tier == DRAM:
                self.stats.dram_evictions += k
                self._admit_victims(ev)
            elif tier == SSD:
                self.stats.ssd_evictions += k
            if self.hybrid:
                for key in ev.keys[(ev.checkpoints & _BIT[tier]) != 0]:
                    self.index.remove_checkpoint(bytes(key), tier)
                    self.used[tier] -= self.ckpt_units
            free = self.cap[tier] - self.used[tier]
        return max(0, min(want, free))

    def _admit_victims(self, ev) -> None:
        if not self.ssd_on:
            return
        want = self.s.admission.on_evict(ev.keys, ev.reuse, ev.hits, ev.dram_evictions,
                                         self.clock.now)
        blocks = want & ((ev.tiers_after & _BIT[SSD]) == 0)
        if blocks.any():
            self._write_blocks(ev.keys[blocks])
        if self.hybrid:  # the checkpoint shares its block's admission decision
            ck = want & ((ev.checkpoints & _BIT[DRAM]) != 0) & ((ev.checkpoints & _BIT[SSD]) == 0)
            for key in ev.keys[ck]:
                self._write_checkpoint(key)

    def _write_ssd(self, keys, pos, full) -> None:
        """Writes path blocks at `pos` (not yet on SSD) to the SSD tier, with
        the DRAM checkpoints they carry."""
        pos = pos[(full[pos] & _BIT[SSD]) == 0]
        if pos.size == 0:
            return
        room = self._make_room(SSD, pos.size, None)
        pos = pos[:room]
        if pos.size:
            self._add(keys, pos, SSD, full, 0)
            np.add.at(self.stats.ssd_bytes_written, self._drive(keys[pos]), self.block_bytes)
            self._ssd_written.update(map(bytes, keys[pos]))
            if self.hybrid:
                ck = self._ck[pos]
                for p in pos[((ck & _BIT[DRAM]) != 0) & ((ck & _BIT[SSD]) == 0)]:
                    if self._write_checkpoint(keys[p]):
                        self._ck[p] |= _BIT[SSD]

    def _write_blocks(self, blocks: np.ndarray) -> None:
        """Writes DRAM victims (indexed blocks, not a path) to the SSD."""
        room = self._make_room(SSD, blocks.shape[0], None)
        blocks = blocks[:room]
        if blocks.shape[0]:
            self.index.add_existing(blocks, SSD, np.zeros(blocks.shape[0], np.uint32))
            self.used[SSD] += int(blocks.shape[0])
            np.add.at(self.stats.ssd_bytes_written, self._drive(blocks), self.block_bytes)
            self._ssd_written.update(map(bytes, blocks))

    # ------------------------------------------------ hybrid checkpoints

    def _checkpoint(self, keys, full) -> None:
        """After prefill the state at the prompt's last full block is kept in
        HBM and DRAM; it supersedes this path's shallower checkpoints there
        (a session's earlier turns), which would only hold memory."""
        n = keys.shape[0]
        if n == 0 or not full[n - 1]:
            return
        key = bytes(keys[n - 1])
        for tier in (GPU, DRAM):
            older = np.flatnonzero((self._ck[: n - 1] & _BIT[tier]) != 0)
            if tier == DRAM and older.size and self.ssd_on:
                # A superseded DRAM checkpoint is a DRAM victim: admission
                # decides on its block's history, as for an evicted block.
                h = self.index.history(keys[: int(older[-1]) + 1])
                want = self.s.admission.on_evict(keys[older], h["reuse"][older], h["hits"][older],
                                                 h["dram_evictions"][older], self.clock.now)
                for p in older[want & ((self._ck[older] & _BIT[SSD]) == 0)]:
                    if self._write_checkpoint(keys[p]):
                        self._ck[p] |= _BIT[SSD]
            for p in older:
                self.index.remove_checkpoint(bytes(keys[p]), tier)
                self.used[tier] -= self.ckpt_units
                self._ck[p] &= 0xFF ^ _BIT[tier]
            if self._ck[n - 1] & _BIT[tier] or self.cap[tier] == 0:
                continue
            if self._make_room(tier, self.ckpt_units, None) >= self.ckpt_units:
                self.index.add_checkpoint(key, tier, 0)
                self.used[tier] += self.ckpt_units
                self._ck[n - 1] |= _BIT[tier]
        if (self.ssd_on and self._ck[n - 1] & _BIT[DRAM] and not self._ck[n - 1] & _BIT[SSD]
                and self.s.admission.on_create(keys[n - 1:n], self.clock.now)[0]):
            self._write_checkpoint(keys[n - 1])

    def _write_checkpoint(self, key: np.ndarray) -> bool:
        if self._make_room(SSD, self.ckpt_units, None) < self.ckpt_units:
            return False
        self.index.add_checkpoint(bytes(key), SSD, 0)
        self.used[SSD] += self.ckpt_units
        self.stats.ssd_bytes_written[self._drive(key[None, :])[0]] += self.state_bytes
        return True

    def ssd_writes_never_read(self) -> tuple[int, int]:
        """(distinct blocks written to the SSD, of which never read back)."""
        return len(self._ssd_written), len(self._ssd_written - self._ssd_read)

    def _drive(self, keys: np.ndarray) -> np.ndarray:
        """Drive of each block: its key folded to 64 bits, modulo the drives
        (trace keys keep a constant first word, so all four words count)."""
        if self.n_drives == 1:
            return np.zeros(keys.shape[0], dtype=np.int64)
        w = np.ascontiguousarray(keys).view("<u8")
        folded = w[:, 0] ^ w[:, 1] ^ w[:, 2] ^ w[:, 3]
        folded ^= folded >> np.uint64(29)
        return (folded % np.uint64(self.n_drives)).astype(np.int64)


_UNLIMITED = 1 << 40


def _blocks(size: float, block_bytes: int) -> int:
    if size == float("inf"):
        return _UNLIMITED
    return int(size // block_bytes)


def _checkpointed(ckpt_masks: np.ndarray, n: int) -> tuple[int, Tier | None]:
    """Deepest boundary b <= n with a checkpoint, and its fastest tier."""
    have = np.flatnonzero(ckpt_masks[:n])
    if have.size == 0:
        return 0, None
    b = int(have[-1]) + 1
    m = int(ckpt_masks[b - 1])
    return b, next(t for t in Tier if m & _BIT[t])


def _run(masks: np.ndarray, bit: int, start: int, end: int) -> int:
    """Length of the run of blocks from `start` (before `end`) that have `bit`."""
    if start >= end:
        return 0
    miss = np.flatnonzero((masks[start:end] & bit) == 0)
    return int(miss[0]) if miss.size else end - start
