"""The replay engine: a trace through the real index and policies, on a clock.

Only the bytes are replaced by a timing model: every residency decision is
made by the cache core (``saria.core.CacheManager``) that serves the engine,
over a ``CountingBackend``; ``saria replay --mode real`` runs this same class
over the real tiers (``TieredCache``) with a mover that copies and verifies
synthetic bytes. The replay keeps only what is its own: hit accounting, the
timing model (queue, coordinator, prefill) and TTFT.

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
* Per request the core is driven exactly as the engine drives it: lookup,
  touch (early persistence), prepare/complete load, the GPU prefix cache
  (the replay's own tier: after prefill the whole prompt is in HBM),
  prepare/complete store of the computed blocks (new KV lands in DRAM;
  eviction and write-through admission), promotion of SSD hits, and for
  hybrid models the state checkpoint.
* Capacities are in blocks of ``block_size`` tokens; for byte accounting an
  SSD block lives on drive ``key % ssd_count``; full SSDs evict leaf-first
  LRU blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from saria.core import CacheManager, CountingBackend, LoadSpec, StateSpec, StoreSpec
from saria.core.backend import UNLIMITED
from saria.index import KeySet, RadixIndex, Tier, VirtualClock
from saria.keys.trace import trace_block_keys
from saria.policy import AdmissionPolicy, PromotionPolicy
from saria.policy.publish import PublishPolicy
from saria.sim.presets import Preset
from saria.sim.remote import RemoteTierModel
from saria.transfer import LinkModel, ReloadQueue, reload_time

GPU, DRAM, SSD, REMOTE = Tier.GPU, Tier.DRAM, Tier.SSD, Tier.REMOTE
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
    """Counters of one replay; ``report()`` turns them into the JSON fields.
    Evictions and promotions are the cache core's (``Replay.cache.stats``)."""

    requests: int = 0
    input_tokens: int = 0
    hit_tokens: dict = field(default_factory=lambda: {"GPU": 0, "DRAM": 0, "SSD": 0})
    state_bytes_read: dict = field(default_factory=lambda: {"DRAM": 0, "SSD": 0})  # hybrid checkpoints
    ssd_bytes_written: np.ndarray | None = None  # per drive (KV and checkpoints)
    ssd_bytes_read: np.ndarray | None = None     # per drive
    baseline_hit_blocks: int = 0   # what a tier-by-tier lookup would have hit
    unified_hit_blocks: int = 0
    ttft: list = field(default_factory=list)
    hit_blocks: list = field(default_factory=list)  # per request, in service order
    load_s: float = 0.0
    prefill_s: float = 0.0
    first_arrival: float = float("inf")
    last_arrival: float = 0.0
    last_done: float = 0.0
    queue_s: list = field(default_factory=list)  # per request: GPU work queued ahead on arrival
    arrival_s: list = field(default_factory=list)  # per request, in service order
    write_log: list = field(default_factory=list)  # (time, SSD bytes written then)


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

    @property
    def state_units(self) -> int:
        """Capacity units (block slots) one hybrid state checkpoint occupies."""
        model = self.preset.model
        return -(-int(model.state_bytes) // self.block_bytes) if model.hybrid else 0

    @property
    def ssd_bytes_per_drive(self) -> float:
        """The SSD capacity replayed, per drive (``--ssd``, else the preset's):
        what the endurance figures are computed from."""
        return self.preset.hardware.ssd_bytes if self.ssd_bytes is None else float(self.ssd_bytes)

    def capacities(self) -> dict[Tier, int]:
        """Blocks each tier holds (SSD: all drives together)."""
        hw = self.preset.hardware
        dram = hw.dram_bytes if self.dram_bytes is None else self.dram_bytes
        ssd = self.ssd_bytes_per_drive
        return {GPU: _blocks(hw.gpu_cache_bytes, self.block_bytes),
                DRAM: _blocks(dram, self.block_bytes),
                SSD: _blocks(ssd, self.block_bytes) * hw.ssd_count}

    def metadata_budget(self) -> int:
        """The index's ``max_blocks``: room for every resident block and their
        history, or only resident blocks without unified history."""
        if not self.keep_history:
            return 1  # only resident blocks stay tracked (the budget is soft for them)
        finite = [c for c in self.capacities().values() if c < UNLIMITED]
        return max(4_000_000, 4 * sum(finite)) if finite else 4_000_000


class NoBytes:
    """The simulator's mover: no bytes to move, nothing fails."""

    def load(self, spec: LoadSpec) -> np.ndarray:
        return np.zeros(0, np.int64)

    def store(self, spec: StoreSpec) -> bool:
        return True

    def direct_rows(self, spec: StoreSpec) -> np.ndarray | None:
        return None

    def promote(self, spec: StoreSpec) -> bool:
        return True

    def checkpoint(self, spec: StateSpec) -> bool:
        return True


class Replay:
    """Replays arrivals through one cache core.

    By default the core is a ``CacheManager`` over a ``CountingBackend``. A
    caller may pass another ``cache`` with the same verbs (``TieredCache``:
    the real tiers) and a ``mover`` that moves its bytes; both must share
    this replay's ``clock``.
    """

    def __init__(self, setup: ReplaySetup, *, cache=None, mover=None,
                 clock: VirtualClock | None = None, cluster=None,
                 publish: PublishPolicy | None = None) -> None:
        if setup.lookup not in LOOKUPS:
            raise ValueError(f"unknown lookup {setup.lookup!r}; valid: {', '.join(LOOKUPS)}")
        self.setup = setup
        model = setup.preset.model
        self.hybrid = model.hybrid
        self.state_bytes = int(model.state_bytes)
        hw = setup.preset.hardware
        self.block_size = setup.preset.block_size
        self.block_bytes = setup.block_bytes
        self.n_drives = hw.ssd_count
        self.link = LinkModel(hw.link_Bps, hw.dram_copy_Bps, hw.ssd_total_read_Bps,
                              hw.pacing_efficiency, hw.contention_ssd_share)
        self.clock = clock or VirtualClock()
        # The cluster tier in the core (``Tier.REMOTE``): `cluster` is a
        # (RemoteTierModel, ClusterKeys) pair a fleet shares between its nodes;
        # without it the preset's ``remote_*`` (none by default). The node's
        # link to it is one FIFO resource its gets and puts share.
        if cluster is None and not self.hybrid:
            self.cluster_model = RemoteTierModel.from_hardware(hw)
            keys = self.cluster_model.keys(self.block_bytes) if self.cluster_model else None
        elif cluster is not None:
            self.cluster_model, keys = cluster
        else:
            self.cluster_model, keys = None, None
        if cache is None:
            index = RadixIndex(setup.metadata_budget(), hybrid=self.hybrid, clock=self.clock)
            backend = CountingBackend(setup.capacities(), state_units=setup.state_units,
                                      cluster=keys)
            cache = CacheManager(index, setup.admission, setup.promotion, backend,
                                 record_writes=True, publish=publish)
        self.cache = cache
        self.cluster_free = 0.0      # the node's link to the cluster is busy until then
        self.cluster_bytes_got = 0   # bytes this node read from the cluster
        self.cluster_bytes_put = 0   # bytes its puts stored there
        self.mover = mover or NoBytes()
        self.gpu_on = cache.backend.capacity(GPU) > 0
        # Keys of SSD-written blocks and of SSD reads, a set each, added to
        # batch by batch (one native call; no per-block Python work).
        self._ssd_written_keys = KeySet()
        self._ssd_read_keys = KeySet()
        self.stats = ReplayStats(ssd_bytes_written=np.zeros(self.n_drives, np.int64),
                                 ssd_bytes_read=np.zeros(self.n_drives, np.int64))
        self.reloads = ReloadQueue(self.link, setup.coordinator)
        self.gpu_free_at = 0.0   # the GPU finishes its current prefill
        self.gpu_started = 0.0   # the current prefill started

    @property
    def ssd_on(self) -> bool:
        """An SSD tier with capacity, under a policy that writes."""
        return self.cache.ssd_on

    # -------------------------------------------------------------- driver

    def run(self, arrivals: Sequence[Arrival],
            progress: Callable[[int], None] | None = None) -> ReplayStats:
        tick = max(1, len(arrivals) // 200)
        for i, a in enumerate(arrivals):
            self.serve(a)
            if progress is not None and (i % tick == 0 or i == len(arrivals) - 1):
                progress(i + 1)
        return self.stats

    def keys_of(self, a: Arrival) -> np.ndarray:
        return trace_block_keys(a.hash_ids, namespace=a.namespace,
                                trace_block_size=self.setup.trace_block_size,
                                engine_block_size=self.block_size, num_tokens=a.input_tokens)

    def serve(self, a: Arrival, keys: np.ndarray | None = None) -> float:
        """Serves one request (its block `keys` if the caller has them);
        returns its TTFT."""
        st = self.stats
        self.clock.advance_to(max(self.clock.now, a.time))
        if keys is None:
            keys = self.keys_of(a)
        n = keys.shape[0]
        plan = self.cache.lookup(keys)
        # A full hit still recomputes the last token: at most (L-1)//bs blocks.
        limit = min(n, max(a.input_tokens - 1, 0) // self.block_size)
        masks = plan.masks
        gpu_run = _run(masks, GPU.bit, 0, min(plan.num_blocks, limit))
        unified = min(plan.num_blocks, limit)
        baseline = gpu_run
        if gpu_run < unified:
            first = DRAM if masks[gpu_run] & DRAM.bit else SSD
            baseline = gpu_run + _run(masks, first.bit, gpu_run, unified)
        ckpt_tier = None
        if self.hybrid:  # usable only up to a boundary with a state checkpoint
            cm = plan.checkpoint_masks
            unified, ckpt_unified = _checkpointed(cm, unified)
            baseline, ckpt_baseline = _checkpointed(cm, baseline)
            ckpt_tier = ckpt_unified if self.setup.lookup == "unified" else ckpt_baseline
        hit = unified if self.setup.lookup == "unified" else baseline
        gpu_run = min(gpu_run, hit)
        st.baseline_hit_blocks += baseline
        st.unified_hit_blocks += unified

        # Sources: GPU first, then DRAM, then SSD.
        seg = masks[gpu_run:hit]
        from_dram = (seg & DRAM.bit) != 0
        if self.setup.lookup == "tier-by-tier" and hit > gpu_run and not from_dram[0]:
            from_dram[:] = False  # the run came from the SSD tier alone
        from_cluster = None
        if self.cluster_model is not None:  # only the cluster holds them: fetched into DRAM
            from_cluster = ((seg & REMOTE.bit) != 0) & ((seg & (DRAM.bit | SSD.bit)) == 0)
            ssd_pos = np.flatnonzero(~from_dram & ~from_cluster) + gpu_run
        else:
            ssd_pos = np.flatnonzero(~from_dram) + gpu_run
        n_dram = int(from_dram.sum())
        n_ssd = ssd_pos.shape[0]
        dram_bytes, ssd_bytes = n_dram * self.block_bytes, n_ssd * self.block_bytes
        if ckpt_tier == DRAM:
            dram_bytes += self.state_bytes
            st.state_bytes_read["DRAM"] += self.state_bytes
        elif ckpt_tier == SSD:
            ssd_bytes += self.state_bytes
            st.state_bytes_read["SSD"] += self.state_bytes
            st.ssd_bytes_read[self._drive(keys[hit - 1:hit])[0]] += self.state_bytes
        load = reload_time(dram_bytes, ssd_bytes, self.link, self.setup.coordinator)
        # The reload is issued when the request is next in line for the GPU
        # (one request of look-ahead, as a connector loads while the previous
        # prefill runs) and shares the ingress link with earlier reloads.
        issued = max(a.time, self.gpu_started)
        st.queue_s.append(max(self.gpu_free_at - a.time, 0.0))
        st.arrival_s.append(a.time)
        fetched = issued
        if from_cluster is not None:
            fetched, dram_bytes = self._cluster_fetch(from_cluster, hit < limit, issued,
                                                      dram_bytes)
        loaded = max(fetched, self.reloads.submit(issued, dram_bytes, ssd_bytes))
        model = self.setup.preset.model
        new_tokens = a.input_tokens - hit * self.block_size
        prefill = model.prefill_flops(new_tokens, a.input_tokens) / \
            self.setup.preset.hardware.prefill_flops_per_s
        self.gpu_started = max(loaded, self.gpu_free_at)
        done = self.gpu_started + prefill
        ttft = done - a.time
        self.gpu_free_at = done

        st.requests += 1
        st.input_tokens += a.input_tokens
        st.hit_tokens["GPU"] += gpu_run * self.block_size
        st.hit_tokens["DRAM"] += n_dram * self.block_size
        st.hit_tokens["SSD"] += n_ssd * self.block_size
        if n_ssd:
            read = keys[ssd_pos]
            self._count_drives(st.ssd_bytes_read, read, self.block_bytes)
            self._ssd_read_keys.add(read)
        st.ttft.append(ttft)
        st.hit_blocks.append(hit)
        st.load_s += load
        st.prefill_s += prefill
        st.first_arrival = min(st.first_arrival, a.time)
        st.last_arrival = max(st.last_arrival, a.time)
        st.last_done = max(st.last_done, done)

        put_before = self._put_blocks()
        self._drive_cache(keys, hit, gpu_run, ckpt_tier, ssd_pos, n_dram, a.namespace,
                          plan.num_known)
        if self.cluster_model is not None:  # the request's puts leave once its prefill is done
            put = (self._put_blocks() - put_before) * self.block_bytes
            if put:
                self.cluster_free = max(done, self.cluster_free) + put / self.cluster_model.link_Bps
                self.cluster_bytes_put += put
        return ttft

    def cluster_backlog(self, t: float) -> float:
        """Seconds of transfers queued on this node's link to the cluster at `t`."""
        return max(self.cluster_free - t, 0.0)

    def _put_blocks(self) -> int:
        """Blocks this node's puts have stored in the cluster (a counting backend's)."""
        return getattr(self.cache.backend, "put_blocks", 0)

    # ---------------------------------------------------------- mechanics

    def _cluster_fetch(self, from_cluster: np.ndarray, past: bool, issued: float,
                       dram_bytes: int) -> tuple[float, int]:
        """The core's cluster tier: a request reaching past its local prefix
        pays one lookup round trip; its cluster-only blocks cross the node's
        link to the cluster (after what is queued on it: earlier gets and
        puts), then go to the GPU as DRAM blocks. Returns (when the fetch
        ends, the DRAM bytes to copy)."""
        model = self.cluster_model
        n = int(from_cluster.sum())
        core = self.cache if isinstance(self.cache, CacheManager) else self.cache.manager
        rounds = max(core.remote.lookup_rounds, 1) if past or n else 0
        end = issued + rounds * model.lookup_s()  # the lookup's round trips
        if n:
            size = n * self.block_bytes
            end = max(end, self.cluster_free) + model.transfer_s(size, n)
            self.cluster_free = end
            self.cluster_bytes_got += size
            self.stats.hit_tokens["CLUSTER"] = (self.stats.hit_tokens.get("CLUSTER", 0)
                                                + n * self.block_size)
        return end, dram_bytes + n * self.block_bytes

    def _drive_cache(self, keys, hit, gpu_run, ckpt_tier, ssd_pos, n_dram, session,
                     known) -> None:
        """The request's effect on the cache, through the core's verbs in the
        engine's order (see ``saria.core.manager``)."""
        cache, mover = self.cache, self.mover
        cache.touch(keys, hits=hit, checkpoint_at=hit if ckpt_tier is not None else 0)
        if hit > gpu_run:  # the engine loads only past its own GPU hit
            load = cache.prepare_load(keys, hit, start=gpu_run)
            if load.remote.size and isinstance(cache, CacheManager):  # the counting fetch
                ok = cache.backend.fetch_remote(load.path[load.remote], load.slots[load.remote])
                load = cache.complete_fetch(load, ok)
            cache.complete_load(load, mover.load(load))
        if self.gpu_on:
            cache.place(keys, GPU, session=session)
        store = cache.prepare_store(keys, hit, session=session, direct=True)
        cache.complete_store(store, success=mover.store(store), direct_rows=mover.direct_rows(store))
        promo = cache.prepare_promotion(keys, ssd_pos, n_dram)
        cache.complete_store(promo, success=mover.promote(promo))
        if self.hybrid:
            state = cache.prepare_checkpoint(keys, keep=known)
            if state is not None:
                cache.complete_checkpoint(state, success=mover.checkpoint(state))
        for written, is_state in cache.take_ssd_writes():
            size = self.state_bytes if is_state else self.block_bytes
            self._count_drives(self.stats.ssd_bytes_written, written, size)
            self.stats.write_log.append((self.clock.now, size * written.shape[0]))
            if not is_state:
                self._ssd_written_keys.add(written)

    def ssd_writes_never_read(self) -> tuple[int, int]:
        """(distinct blocks written to the SSD, of which never read back)."""
        written = self._ssd_written_keys
        return len(written), written.count_absent_from(self._ssd_read_keys)

    @property
    def _ssd_written(self) -> set[bytes]:
        """The distinct SSD-written keys (for tests)."""
        return {bytes(k) for k in self._ssd_written_keys.keys()}

    def _count_drives(self, per_drive: np.ndarray, keys: np.ndarray, size: int) -> None:
        """Adds `size` bytes to the drive of each of `keys`."""
        if self.n_drives == 1:
            per_drive[0] += size * keys.shape[0]
        else:
            per_drive += np.bincount(self._drive(keys), minlength=self.n_drives) * size

    def _drive(self, keys: np.ndarray) -> np.ndarray:
        """Drive of each block: its key folded to 64 bits, modulo the drives
        (trace keys keep a constant first word, so all four words count)."""
        if self.n_drives == 1:
            return np.zeros(keys.shape[0], dtype=np.int64)
        w = np.ascontiguousarray(keys).view("<u8")
        folded = w[:, 0] ^ w[:, 1] ^ w[:, 2] ^ w[:, 3]
        folded ^= folded >> np.uint64(29)
        return (folded % np.uint64(self.n_drives)).astype(np.int64)


def _blocks(size: float, block_bytes: int) -> int:
    if size == float("inf"):
        return UNLIMITED
    return int(size // block_bytes)


def _checkpointed(ckpt_masks: np.ndarray, n: int) -> tuple[int, Tier | None]:
    """Deepest boundary b <= n with a checkpoint, and its fastest tier."""
    have = np.flatnonzero(ckpt_masks[:n])
    if have.size == 0:
        return 0, None
    b = int(have[-1]) + 1
    m = int(ckpt_masks[b - 1])
    return b, next(t for t in Tier if m & t.bit)


def _run(masks: np.ndarray, bit: int, start: int, end: int) -> int:
    """Length of the run of blocks from `start` (before `end`) that have `bit`."""
    if start >= end:
        return 0
    miss = np.flatnonzero((masks[start:end] & bit) == 0)
    return int(miss[0]) if miss.size else end - start
