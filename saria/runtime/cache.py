"""The runtime tiered cache: the object a serving engine's connector calls.

``TieredCache`` joins the radix index (what lives where, and its history),
the admission and promotion policies, a DRAM pool of fixed-size slots and the
O_DIRECT SSD store. The same policy objects drive ``saria replay``.

Per request, the engine side calls::

    plan = cache.lookup(keys)                     # longest prefix in DRAM/SSD
    cache.record_access(keys, hits=plan.num_blocks)
    got = cache.load(keys, plan, out)             # bytes into `out`, verified
    ...                                           # prefill the rest
    cache.store(keys, data, start=got.blocks)     # new KV lands in DRAM
    cache.promote(keys, got.ssd_positions, rows)  # some SSD hits back to DRAM

Invariants:

* the index is the only authority on residency: a DRAM slot or SSD handle is
  used only while the index maps a key to it, and freed only after the index
  dropped it;
* blocks being loaded are locked in the index, so no eviction can free their
  slots mid-copy;
* SSD writes are asynchronous (``write_mode="async"``, the default): a
  bounded queue feeds one writer thread; when the queue is full the write is
  dropped and counted -- the engine is never blocked by the SSD. A victim's
  bytes are copied out of its DRAM slot when it is queued, so the slot can be
  reused at once. ``write_mode="sync"`` writes inline (tests, replay);
* a failed SSD read is a miss from that block on (``LoadResult.blocks``
  stops before it) and the block is dropped from the SSD tier: wrong KV is
  never returned; a failed SSD write leaves the block where it was.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field

import numpy as np

from saria.errors import ConfigError
from saria.index import RadixIndex, ReloadPlan, Tier
from saria.index.clock import Clock, wall_clock
from saria.policy import make_admission, make_promotion
from saria.runtime.events import CacheEvent, EventLog
from saria.tiers.dram import DramPool

_DRAM, _SSD = 1 << Tier.DRAM, 1 << Tier.SSD


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """Settings of a ``TieredCache``; sizes in bytes. ``ssd_dirs`` empty or
    ``ssd_bytes`` 0 means no SSD tier."""

    block_bytes: int
    dram_bytes: int
    ssd_dirs: tuple[str, ...] = ()
    ssd_bytes: int = 0
    admission: str = "saria"
    promotion: str = "lazy"
    promotion_r: float | None = 0.8
    min_victim_age_s: float = 60.0
    max_blocks: int = 4_000_000
    write_mode: str = "async"
    write_queue: int = 256  # pending SSD write batches before writes are dropped
    pin: bool | None = None
    events: bool = False       # keep a residency event log (take_events)
    shared_pool: str | None = None  # map the DRAM pool from this file (DramPool shared=)

    def __post_init__(self) -> None:
        if self.block_bytes <= 0:
            raise ConfigError("block_bytes", f"must be positive, got {self.block_bytes}")
        if self.dram_bytes < self.block_bytes:
            raise ConfigError("dram_bytes", f"{self.dram_bytes} B cannot hold one block of "
                              f"{self.block_bytes} B")
        if self.ssd_bytes < 0:
            raise ConfigError("ssd_bytes", f"must not be negative, got {self.ssd_bytes}")
        if self.write_mode not in ("async", "sync"):
            raise ConfigError("write_mode", f"must be 'async' or 'sync', got {self.write_mode!r}")
        if self.write_queue < 1:
            raise ConfigError("write_queue", "must be at least 1")


@dataclass(slots=True)
class LoadResult:
    """What ``load`` delivered: ``blocks`` leading blocks are in `out` and
    verified; ``ssd_positions`` are the ones that came from the SSD."""

    blocks: int
    dram_blocks: int
    ssd_blocks: int
    failed: int
    ssd_positions: np.ndarray


@dataclass(slots=True)
class CacheStats:
    lookups: int = 0
    hit_blocks: dict = field(default_factory=lambda: {"DRAM": 0, "SSD": 0})
    stored_blocks: int = 0
    promoted_blocks: int = 0
    dram_evictions: int = 0
    ssd_evictions: int = 0
    ssd_write_blocks: int = 0
    ssd_write_failures: int = 0
    ssd_read_failures: int = 0
    writes_dropped: int = 0
    adopted_blocks: int = 0


@dataclass(slots=True)
class Reservation:
    """Slots handed out by ``reserve``: block ``positions[i]`` of the
    request (key ``path[positions[i]]``) goes to ``slots[i]``; ``masks``
    are those blocks' tier masks before the reservation."""

    path: np.ndarray
    positions: np.ndarray
    slots: np.ndarray
    masks: np.ndarray

    @property
    def num_blocks(self) -> int:
        return int(self.positions.size)


@dataclass(slots=True)
class Staged:
    """A prefix made readable by ``stage``: block i's bytes are in DRAM slot
    ``slots[i]``; ``ssd_positions`` came from the SSD into ``spare`` slots;
    ``failed`` SSD reads were dropped (the prefix stops before the first)."""

    path: np.ndarray
    slots: np.ndarray
    ssd_positions: np.ndarray
    spare: np.ndarray
    failed: int = 0

    @property
    def num_blocks(self) -> int:
        return int(self.path.shape[0])


class TieredCache:
    """DRAM + SSD KV cache behind one radix index; thread-safe."""

    def __init__(self, config: CacheConfig, *, clock: Clock | None = None) -> None:
        self.cfg = config
        self.index = RadixIndex(config.max_blocks, clock=clock or wall_clock)
        self.admission = make_admission(config.admission)
        self.promotion = make_promotion(config.promotion, r=config.promotion_r,
                                        min_victim_age_s=config.min_victim_age_s)
        self.pool = DramPool(config.dram_bytes // config.block_bytes, config.block_bytes,
                             pin=config.pin, shared=config.shared_pool)
        self.events = EventLog() if config.events else None
        self.ssd = None
        if config.ssd_dirs and config.ssd_bytes > 0 and not self.admission.writes_nothing:
            from saria.tiers.ssd import SsdStore

            self.ssd = SsdStore(list(config.ssd_dirs), config.ssd_bytes, config.block_bytes)
        # Blocks found on the SSD at start-up (a restart): adopted into the
        # index lazily, the first time a lookup's path reaches them (the store
        # does not record parents, the lookup's key chain supplies them).
        self._recovered: dict[bytes, int] = {}
        if self.ssd is not None:
            rec = self.ssd.take_recovered()
            self._recovered = {bytes(k): int(h) for k, h in zip(rec.keys, rec.handles)}
        self.stats = CacheStats()
        self._mu = threading.RLock()
        self._queue: queue.Queue | None = None
        self._writer: threading.Thread | None = None
        if self.ssd is not None and config.write_mode == "async":
            self._queue = queue.Queue(config.write_queue)
            self._writer = threading.Thread(target=self._write_loop, name="saria-ssd-writer",
                                            daemon=True)
            self._writer.start()

    # ------------------------------------------------------------ engine API

    def lookup(self, keys: np.ndarray) -> ReloadPlan:
        """The reload plan of the longest prefix of `keys` held in DRAM or SSD."""
        with self._mu:
            self.stats.lookups += 1
            return self._match(keys)

    def record_access(self, keys: np.ndarray, *, hits: int) -> None:
        """Records that a request referenced `keys` (the first `hits` served
        from cache) and lets admission persist DRAM residents early."""
        with self._mu:
            n_known = self.index.touch(keys, hits=hits)
            if self.ssd is None or n_known == 0:
                return
            plan = self.index.match(keys[:n_known])
            resident = np.flatnonzero(((plan.masks & _DRAM) != 0) & ((plan.masks & _SSD) == 0))
            if resident.size == 0:
                return
            h = self.index.history(keys[:n_known])
            want = self.admission.on_access(keys[resident], h["reuse"][resident],
                                            h["hits"][resident], self.index.now())
            pick = resident[want]
            if pick.size:
                rows = np.empty((pick.size, self.cfg.block_bytes), np.uint8)
                self.pool.gather(plan.slots[pick], rows)
                self._submit_write(keys[pick], rows)

    def load(self, keys: np.ndarray, plan: ReloadPlan, out: np.ndarray, *,
             blocks: int | None = None) -> LoadResult:
        """Copies the plan's first `blocks` blocks (default: all) into
        `out[i]` (DRAM slots directly, SSD through the store, verified by its
        checksums); the result stops at the first block that failed."""
        n = plan.num_blocks if blocks is None else min(blocks, plan.num_blocks)
        if out.shape[0] < n or out.shape[1] != self.cfg.block_bytes:
            raise ValueError(f"out must have at least {n} rows of {self.cfg.block_bytes} bytes")
        if n == 0:
            return LoadResult(0, 0, 0, 0, np.zeros(0, np.int64))
        with self._mu:
            # The caller's plan may be stale: another thread can have evicted
            # its blocks and reused their slots since lookup(). Re-plan and
            # lock under one critical section, so the slots read below stay
            # the blocks' own until unlock.
            plan = self.index.match(keys[:n])
            n = plan.num_blocks
            head = keys[:n]
            self.index.lock(head)
        try:
            dram = np.flatnonzero(plan.tiers[:n] == Tier.DRAM)
            ssd = np.flatnonzero(plan.tiers[:n] == Tier.SSD)
            if dram.size:
                rows = np.empty((dram.size, self.cfg.block_bytes), np.uint8)
                self.pool.gather(plan.slots[dram], rows)  # out[dram] would be a copy
                out[dram] = rows
            ok = np.ones(n, dtype=bool)
            if ssd.size:
                rows = np.empty((ssd.size, self.cfg.block_bytes), np.uint8)
                good = self.ssd.read(plan.slots[ssd], np.ascontiguousarray(keys[ssd]), rows)
                out[ssd[good]] = rows[good]
                ok[ssd[~good]] = False
        finally:
            with self._mu:
                self.index.unlock(head)
        bad = np.flatnonzero(~ok)
        if bad.size:
            with self._mu:
                self.stats.ssd_read_failures += int(bad.size)
                lost = [i for i in bad if self.index.slot_of(bytes(keys[i]), Tier.SSD) is not None]
                if lost:
                    self._drop_ssd(keys[lost])
        blocks = int(bad[0]) if bad.size else n
        n_ssd = int(np.count_nonzero(ssd < blocks))
        with self._mu:
            self.stats.hit_blocks["DRAM"] += blocks - n_ssd
            self.stats.hit_blocks["SSD"] += n_ssd
        return LoadResult(blocks, blocks - n_ssd, n_ssd, int(bad.size), ssd[ssd < blocks])

    def store(self, keys: np.ndarray, data: np.ndarray, *, start: int = 0,
              session: int = 0) -> int:
        """New KV of blocks ``keys[start:]`` (rows of `data`, one per block)
        lands in DRAM; admission decides on SSD writes. Returns blocks stored."""
        n = keys.shape[0]
        if data.shape != (n - start, self.cfg.block_bytes):
            raise ValueError(f"data must be ({n - start}, {self.cfg.block_bytes}) bytes")
        # The copier-facing pair with the bytes in hand: the request's path
        # stays locked until the new blocks are in, and the unlock (a use)
        # leaves the new, deeper blocks older than their ancestors.
        res = self.reserve(keys, start, session=session)
        if res.num_blocks:
            self.pool.scatter(res.slots, data[res.positions - start])
        return self.commit(res)

    def promote(self, keys: np.ndarray, ssd_positions: np.ndarray, rows: np.ndarray,
                dram_blocks: int) -> int:
        """After prefill: copies a policy-chosen part of the SSD hits (their
        bytes are `rows`, one per position) into DRAM, only into slots of
        DRAM blocks idle for the policy's cutoff. Never blocks on the SSD."""
        pick = self.promotion.select(np.asarray(ssd_positions), dram_blocks)
        if pick.size == 0:
            return 0
        row_of = {int(p): i for i, p in enumerate(ssd_positions)}
        with self._mu:
            plan = self.index.match(keys[: int(pick[-1]) + 1])
            known = pick[pick < plan.num_known]
            known = known[(plan.masks[known] & _DRAM) == 0]
            if known.size == 0:
                return 0
            slots = self._dram_slots(known.size, self.promotion.min_victim_age_s)
            known = known[: slots.size]
            if known.size == 0:
                return 0
            self.pool.scatter(slots, rows[[row_of[int(p)] for p in known]])
            self.index.add(keys[: int(known[-1]) + 1], Tier.DRAM, slots, where=known)
            if self.events is not None:
                self.events.stored(Tier.DRAM, keys, known)
            self.stats.promoted_blocks += int(known.size)
            return int(known.size)

    # ------------------------------------- engine API: copies done elsewhere
    #
    # The vLLM connector's worker copies KV pages between the engine's KV
    # cache and pool slots in another process (the pool is shared memory), so
    # the bytes never pass through these calls. The four calls below hand out
    # slots and hold index locks until the copier reports back:
    #
    #   res = cache.reserve(keys, start)   # slots for new blocks, locked
    #   ... the copier fills res.slots ...
    #   cache.commit(res)                  # unlock; admission may write SSD
    #
    #   st = cache.stage(keys, n)          # prefix -> DRAM slots (SSD read in)
    #   ... the copier reads st.slots ...
    #   cache.release(st)                  # unlock; promotion keeps some

    def reserve(self, keys: np.ndarray, start: int = 0, *, session: int = 0) -> "Reservation":
        """DRAM slots for blocks ``keys[start:]`` not yet in DRAM, added to
        the index and locked (with their path) until ``commit``. Their bytes
        are undefined until the copier fills the slots; the index may match
        them meanwhile, which is safe only for a copier that runs its copies
        in order (the connector's worker does). Fewer slots than blocks when
        DRAM is short: the reservation is the leading part that fitted."""
        n = keys.shape[0]
        with self._mu:
            plan = self.index.match(keys)
            masks = np.zeros(n, np.uint8)
            masks[:plan.num_known] = plan.masks
            pos = np.arange(start, n)
            pos = pos[(masks[pos] & _DRAM) == 0]
            self.index.lock(keys[:plan.num_known])
            try:
                slots = self._dram_slots(pos.size, None) if pos.size else pos[:0]
                pos = pos[: slots.size]
                if pos.size == 0:
                    return Reservation(keys[:0].copy(), pos, slots, masks[:0])
                path = keys[: int(pos[-1]) + 1].copy()
                self.index.add(path, Tier.DRAM, slots, where=pos, session=session)
                self.index.lock(path)
                if self.events is not None:
                    self.events.stored(Tier.DRAM, path, pos)
                return Reservation(path, pos, slots, masks[pos].copy())
            finally:
                self.index.unlock(keys[:plan.num_known])

    def commit(self, res: "Reservation", *, ok: bool = True) -> int:
        """The copier filled (``ok``) or failed to fill a reservation's slots:
        unlocks it; filled blocks go through admission (early SSD writes read
        the slots now), failed ones leave the index. Returns blocks kept."""
        if res.positions.size == 0:
            return 0
        with self._mu:
            self.index.unlock(res.path)
            keys = res.path[res.positions]
            if not ok:
                slots = self.index.remove(keys, Tier.DRAM)
                self.pool.free(slots)
                if self.events is not None:
                    self.events.removed(Tier.DRAM, keys)
                return 0
            self.stats.stored_blocks += int(res.positions.size)
            if self.ssd is not None:
                want = self.admission.on_create(keys, self.index.now())
                fresh = np.flatnonzero(want & ((res.masks & _SSD) == 0))
                if fresh.size:
                    rows = np.empty((fresh.size, self.cfg.block_bytes), np.uint8)
                    self.pool.gather(res.slots[fresh], rows)
                    self._submit_write(keys[fresh], rows)
            return int(res.positions.size)

    def stage(self, keys: np.ndarray, blocks: int | None = None, start: int = 0) -> "Staged":
        """Makes the longest cached prefix of ``keys[:blocks]`` readable from
        DRAM slots and locks it until ``release``: DRAM blocks by their own
        slots, SSD blocks read (verified) into spare slots. Stops before the
        first SSD block that fails its read (the copy is dropped from the
        SSD tier) or finds no spare slot. Blocks before `start` (the engine
        holds them already) are locked but not read: their ``slots`` entries
        are meaningless. Blocks on the SSD read, under the
        lock only for bookkeeping: call it off the engine's critical path."""
        n = keys.shape[0] if blocks is None else min(blocks, keys.shape[0])
        with self._mu:
            plan = self._match(keys[:n])
            n = plan.num_blocks
            path = keys[:n].copy()
            self.index.lock(path)
            slots = plan.slots[:n].astype(np.int64)
            ssd = np.flatnonzero(plan.tiers[:n] == Tier.SSD)
            ssd = ssd[ssd >= start]
            spare = self._dram_slots(ssd.size, None) if ssd.size else ssd[:0]
            if spare.size < ssd.size:  # DRAM full of locked blocks: stage fewer
                n = int(ssd[spare.size])
                self._relock(path, n)
                path, ssd = path[:n], ssd[: spare.size]
            handles = slots[ssd].copy()
        failed = 0
        if ssd.size:
            rows = np.empty((ssd.size, self.cfg.block_bytes), np.uint8)
            good = self.ssd.read(handles, np.ascontiguousarray(path[ssd]), rows)
            self.pool.scatter(spare, rows)
            slots[ssd] = spare
            bad = np.flatnonzero(~good)
            if bad.size:
                failed = int(bad.size)
                with self._mu:
                    self.stats.ssd_read_failures += failed
                    cut = int(ssd[bad[0]])
                    self._relock(path, cut)  # before the drop: a dropped block may leave
                    lost = [int(ssd[i]) for i in bad
                            if self.index.slot_of(bytes(path[ssd[i]]), Tier.SSD) is not None]
                    if lost:
                        self._drop_ssd(path[lost])
                    keep = ssd < cut
                    self.pool.free(spare[~keep])
                    path, ssd, spare, slots = path[:cut], ssd[keep], spare[keep], slots[:cut]
        n = path.shape[0]
        with self._mu:
            self.stats.hit_blocks["DRAM"] += max(0, n - start) - int(ssd.size)
            self.stats.hit_blocks["SSD"] += int(ssd.size)
        return Staged(path, slots[:n], ssd, spare, failed)

    def release(self, st: "Staged", *, promote: bool = True) -> int:
        """The copier is done with a staged prefix: unlocks it; the promotion
        policy picks SSD hits to keep in DRAM (their bytes are already in the
        spare slots, so promotion costs no copy); the other spare slots are
        freed. Returns blocks promoted."""
        with self._mu:
            self.index.unlock(st.path)
            pick = np.zeros(st.ssd_positions.size, bool)
            if promote and st.ssd_positions.size:
                chosen = self.promotion.select(st.ssd_positions, st.num_blocks - st.ssd_positions.size)
                pick = np.isin(st.ssd_positions, chosen)
                plan = self.index.match(st.path)
                ok = np.zeros(st.ssd_positions.size, bool)
                inside = st.ssd_positions < plan.num_known
                ok[inside] = (plan.masks[st.ssd_positions[inside]] & _DRAM) == 0
                pick &= ok
            pos = st.ssd_positions[pick]
            if pos.size:
                self.index.add(st.path[: int(pos[-1]) + 1], Tier.DRAM, st.spare[pick], where=pos)
                self.stats.promoted_blocks += int(pos.size)
                if self.events is not None:
                    self.events.stored(Tier.DRAM, st.path, pos)
            if (~pick).any():
                self.pool.free(st.spare[~pick])
            return int(pos.size)

    def take_events(self) -> list[CacheEvent]:
        """Residency events since the last call (``CacheConfig.events``)."""
        if self.events is None:
            return []
        with self._mu:
            return self.events.take()

    def flush(self, timeout: float | None = None) -> None:
        """Waits until every queued SSD write has been issued."""
        if self._queue is not None:
            self._queue.join()

    def close(self) -> None:
        if self._queue is not None:
            self._queue.put(None)
            self._writer.join()
            self._queue = None
        if self.ssd is not None:
            self.ssd.close()

    def __enter__(self) -> "TieredCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --------------------------------------------------------------- helpers

    def _match(self, keys: np.ndarray) -> ReloadPlan:
        """``index.match``, after adopting recovered SSD blocks that extend
        the available prefix (a restart). Caller holds the lock."""
        plan = self.index.match(keys)
        if self._recovered and plan.num_available < keys.shape[0]:
            if self._adopt(keys, plan):
                plan = self.index.match(keys)
        return plan

    def _adopt(self, keys: np.ndarray, plan: ReloadPlan) -> bool:
        """Puts recovered SSD blocks that extend the available prefix of
        `keys` into the index. Caller holds the lock."""
        masks = plan.masks
        pos, handles = [], []
        for i in range(plan.num_available, keys.shape[0]):
            if i < plan.num_known and masks[i] & _SSD:
                continue
            h = self._recovered.pop(bytes(keys[i]), None)
            if h is None:
                break
            if i < plan.num_known and masks[i]:
                self.ssd.free(np.array([h], np.int64))  # already cached elsewhere
                continue
            pos.append(i)
            handles.append(h)
        if not pos:
            return False
        self.index.add(keys[: pos[-1] + 1], Tier.SSD, handles, where=pos)
        self.stats.adopted_blocks += len(pos)
        if self.events is not None:
            self.events.stored(Tier.SSD, keys, np.asarray(pos))
        return True

    def _relock(self, path: np.ndarray, keep: int) -> None:
        """Shortens a locked path to its first `keep` blocks (locks are taken
        and released on whole root paths). Caller holds the lock."""
        self.index.unlock(path)
        if keep:
            self.index.lock(path[:keep])

    def _drop_ssd(self, keys: np.ndarray) -> None:
        """Drops unusable SSD copies (a failed read) so no later plan relies
        on them. Caller holds the lock."""
        handles = self.index.remove(keys, Tier.SSD)
        self.ssd.free(handles)
        if self.events is not None:
            self.events.removed(Tier.SSD, keys)

    def _free_recovered(self, count: int) -> None:
        """Reclaims SSD space held by recovered blocks nobody looked up."""
        drop = [self._recovered.popitem()[1] for _ in range(min(count, len(self._recovered)))]
        if drop:
            self.ssd.free(np.array(drop, np.int64))

    def _dram_slots(self, want: int, older_than: float | None) -> np.ndarray:
        """Up to `want` free DRAM slots, evicting index victims (admission
        decides which victims go to the SSD first). Caller holds the lock."""
        short = want - self.pool.free_slots
        if short > 0:
            ev = self.index.evict(Tier.DRAM, short, older_than=older_than)
            if len(ev):
                self.stats.dram_evictions += len(ev)
                if self.ssd is not None:
                    admit = self.admission.on_evict(ev.keys, ev.reuse, ev.hits,
                                                    ev.dram_evictions, self.index.now())
                    admit &= (ev.tiers_after & _SSD) == 0
                    if admit.any():
                        rows = np.empty((int(admit.sum()), self.cfg.block_bytes), np.uint8)
                        self.pool.gather(ev.slots[admit], rows)
                        self._submit_write(ev.keys[admit], rows)
                self.pool.free(ev.slots)
                if self.events is not None:
                    self.events.removed(Tier.DRAM, ev.keys)
        return self.pool.alloc(min(want, self.pool.free_slots))

    def _submit_write(self, keys: np.ndarray, rows: np.ndarray) -> None:
        job = (np.ascontiguousarray(keys), np.ascontiguousarray(rows))
        if self._queue is None:
            self._write(*job)
            return
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            self.stats.writes_dropped += int(keys.shape[0])

    def _write_loop(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                self._write(*job)
            finally:
                self._queue.task_done()

    def _write(self, keys: np.ndarray, rows: np.ndarray) -> None:
        with self._mu:
            short = keys.shape[0] - self.ssd.free_slots
            if short > 0:
                ev = self.index.evict(Tier.SSD, short)
                if len(ev):
                    self.stats.ssd_evictions += len(ev)
                    self.ssd.free(ev.slots)
                    if self.events is not None:
                        self.events.removed(Tier.SSD, ev.keys)
                if keys.shape[0] > self.ssd.free_slots:
                    self._free_recovered(keys.shape[0] - self.ssd.free_slots)
            room = min(keys.shape[0], self.ssd.free_slots)
            if room < keys.shape[0]:  # everything left is locked: drop the rest
                self.stats.writes_dropped += keys.shape[0] - room
                keys, rows = keys[:room], rows[:room]
        if keys.shape[0] == 0:
            return
        handles = self.ssd.write(keys, rows)  # I/O outside the lock
        with self._mu:
            for i, h in enumerate(handles.tolist()):
                if h < 0:
                    self.stats.ssd_write_failures += 1
                    continue
                key = keys[i:i + 1]
                try:
                    self.index.add_existing(key, Tier.SSD, [h])
                    self.stats.ssd_write_blocks += 1
                    if self.events is not None:
                        self.events.stored_loose(Tier.SSD, key)
                except ValueError:
                    # The block left the index or reached the SSD meanwhile.
                    self.ssd.free(np.array([h], np.int64))
