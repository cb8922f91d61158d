"""The runtime tiered cache: the object an engine's connector calls.

``TieredCache`` is the cache core (``saria.core.CacheManager``: every
residency decision) over the real tiers (``TierBackend``: a DRAM slot pool
and the O_DIRECT SSD store), behind one lock so threads can share it. It adds
what only the runtime has: adoption of SSD blocks found after a restart, and
calls that move bytes the caller holds in hand.

The core's two-phase verbs (vLLM ``kv_offload`` vocabulary), for a copier in
another process (the vLLM connector's workers)::

    plan = cache.lookup(keys)                 # adopts recovered SSD blocks
    cache.touch(keys, hits=h)
    spec = cache.prepare_load(keys, h)        # locked; DRAM slots / SSD handles
    ... the copier reads them ...
    cache.complete_load(spec, failed)         # bad SSD copies leave the tier
    spec = cache.prepare_store(keys, start)   # DRAM slots for new blocks, locked
    ... the copier fills them ...
    cache.complete_store(spec, success=ok)    # admission may write the SSD

and the same with bytes in hand: ``load``, ``store``, ``promote``.

With a cluster tier (``remote=``, a ``saria.tiers.remote.RemoteTier``) a
lookup also finds what other nodes published, and ``prepare_load`` fetches
the blocks only the cluster holds into DRAM slots (outside the lock, under
the tier's deadline) before it returns: the spec a copier gets names DRAM
and SSD only, and every fetched block was verified (``saria.core.remote``).

Invariants (the core's, plus): a failed SSD read is a miss from that block on
and the block leaves the SSD tier -- wrong KV is never returned; a failed SSD
write leaves the block where it was; a full write queue drops writes
(counted) and never blocks the caller.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from saria.core import CacheEvent, CacheManager, CacheStats, LoadSpec, StateSpec, StoreSpec
from saria.errors import ConfigError
from saria.index import ReloadPlan, RadixIndex, Tier
from saria.index.clock import Clock, wall_clock
from saria.policy import make_admission, make_promotion
from saria.policy.publish import PublishPolicy
from saria.runtime.backend import TierBackend, state_keys

DRAM, SSD, REMOTE = Tier.DRAM, Tier.SSD, Tier.REMOTE


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """Settings of a ``TieredCache``; sizes in bytes. ``ssd_dirs`` empty or
    ``ssd_bytes`` 0 means no SSD tier. ``state_bytes`` > 0 holds a hybrid
    model's state checkpoints (each takes ``ceil(state_bytes / block_bytes)``
    slots)."""

    block_bytes: int
    dram_bytes: int
    ssd_dirs: tuple[str, ...] = ()
    ssd_bytes: int = 0
    admission: str = "saria"
    promotion: str = "lazy"
    promotion_r: float | None = 0.8
    min_victim_age_s: float | str = "auto"  # lazy promotion's cutoff (seconds or auto)
    max_blocks: int = 4_000_000
    write_mode: str = "async"
    write_queue: int = 256  # pending SSD write batches before writes are dropped
    pin: bool | None = None
    events: bool = False       # keep a residency event log (take_events)
    shared_pool: str | None = None  # map the DRAM pool from this file (DramPool shared=)
    state_bytes: int = 0
    record_writes: bool = False  # keep the keys of completed SSD writes (take_ssd_writes)
    # DRAM slots set aside for blocks on their way straight to the SSD (a
    # copier's write-through of blocks DRAM does not keep); out of dram_bytes.
    staging_slots: int = 0
    # DRAM slots (out of dram_bytes) in which victims stay readable while
    # their SSD write is queued; None: a 16th of the pool (asynchronous writes)
    write_behind: int | None = None
    dwpd: float = 1.0  # the drives' rating, for the budget admission
    # Background scrub of the SSD (bytes per second; 0: off): blocks that no
    # longer verify leave the index (every load verifies anyway).
    ssd_scrub_bytes_per_s: float = 0.0
    # Parts per SSD slot (one per tensor-parallel rank: rank r reads only
    # part r of a block; block_bytes must be a multiple of it).
    ssd_parts: int = 1

    def __post_init__(self) -> None:
        if self.block_bytes <= 0:
            raise ConfigError("block_bytes", f"must be positive, got {self.block_bytes}")
        if self.dram_bytes < self.block_bytes:
            raise ConfigError("dram_bytes", f"{self.dram_bytes} B cannot hold one block of "
                              f"{self.block_bytes} B")
        if self.ssd_bytes < 0:
            raise ConfigError("ssd_bytes", f"must not be negative, got {self.ssd_bytes}")
        if self.write_mode not in ("async", "sync", "manual"):
            raise ConfigError("write_mode", f"must be 'async', 'sync' or 'manual', got "
                              f"{self.write_mode!r}")
        if self.write_queue < 1:
            raise ConfigError("write_queue", "must be at least 1")
        if self.state_bytes < 0:
            raise ConfigError("state_bytes", f"must not be negative, got {self.state_bytes}")
        if self.ssd_parts < 1 or self.block_bytes % self.ssd_parts:
            raise ConfigError("ssd_parts", f"must be >= 1 and divide block_bytes={self.block_bytes}, "
                              f"got {self.ssd_parts}")
        if not self.ssd_scrub_bytes_per_s >= 0:
            raise ConfigError("ssd_scrub_bytes_per_s", f"must be >= 0, got {self.ssd_scrub_bytes_per_s}")

    @property
    def state_units(self) -> int:
        return -(-self.state_bytes // self.block_bytes)


@dataclass(slots=True)
class LoadResult:
    """What ``load`` delivered: ``blocks`` leading blocks are in `out` and
    verified; ``ssd_positions`` are the ones that came from the SSD."""

    blocks: int
    dram_blocks: int
    ssd_blocks: int
    failed: int
    ssd_positions: np.ndarray
    remote_blocks: int = 0   # of `blocks`, fetched from the cluster tier (counted apart from DRAM)


class TieredCache:
    """DRAM + SSD KV cache behind one radix index; thread-safe."""

    def __init__(self, config: CacheConfig, *, clock: Clock | None = None, remote=None,
                 publish: PublishPolicy | None = None) -> None:
        self.cfg = config
        self._lock = threading.RLock()
        admission = make_admission(config.admission, dwpd=config.dwpd)
        promotion = make_promotion(config.promotion, r=config.promotion_r,
                                   min_victim_age_s=config.min_victim_age_s)
        writes = not admission.writes_nothing
        self.backend = TierBackend(
            block_bytes=config.block_bytes, dram_slots=config.dram_bytes // config.block_bytes,
            ssd_dirs=config.ssd_dirs if writes else (), ssd_bytes=config.ssd_bytes,
            state_units=config.state_units, write_mode=config.write_mode,
            write_queue=config.write_queue, pin=config.pin, shared_pool=config.shared_pool,
            staging_slots=config.staging_slots, write_behind=config.write_behind,
            scrub_bytes_per_s=config.ssd_scrub_bytes_per_s if writes else 0.0,
            ssd_parts=config.ssd_parts, remote=remote, lock=self._lock)
        self.backend.on_scrub_bad = self._drop_scrubbed
        index = RadixIndex(config.max_blocks, hybrid=config.state_bytes > 0,
                           clock=clock or wall_clock)
        lookup_blocks = remote.settings.max_lookup_keys if remote is not None else 64
        self.manager = CacheManager(index, admission, promotion, self.backend,
                                    events=config.events, record_writes=config.record_writes,
                                    publish=publish, remote_lookup_blocks=lookup_blocks)

    # -------------------------------------------------------------- state

    @property
    def index(self) -> RadixIndex:
        return self.manager.index

    @property
    def stats(self) -> CacheStats:
        return self.manager.stats

    @property
    def ssd_on(self) -> bool:
        return self.manager.ssd_on

    def gauges(self) -> dict[str, float]:
        """Occupancy of the tiers and the index (for metrics)."""
        with self._lock:
            out = self.backend.gauges()
            st = self.index.stats()
            out.update(index_blocks=st.nodes, index_ghosts=st.ghosts)
            if self.backend.remote:
                out.update(self._remote_gauges())
            state = self.manager.admission.state(self.index.now())
            out.update({f"admission_{k}": float(v) for k, v in state.items()})
            return out

    # ------------------------------------------------- the core's verbs

    def lookup(self, keys: np.ndarray) -> ReloadPlan:
        """The reload plan of the longest prefix of `keys` cached, after
        adopting recovered SSD blocks that extend what the node holds. The
        node's own drive comes before the cluster: adoption runs first, so a
        block the SSD recovered is never looked up (and shadowed) remotely."""
        with self._lock:
            if self.backend.recovered:
                self._adopt(keys, self.index.match(keys))
            plan = self.manager.lookup(keys)
            # past a block only the cluster holds, recovered blocks continue the prefix
            if self.backend.recovered and self._adopt(keys, plan):
                plan = self.index.match(keys)
            return plan

    def touch(self, keys: np.ndarray, *, hits: int, checkpoint_at: int = 0) -> int:
        """Records a request's access (see ``CacheManager.touch``). `hits`
        may pass the blocks this cache knows: an engine's own prefix cache
        holds blocks saria never stored (their store failed, or another
        request computes them in this very step -- vLLM caches a block when
        it allocates it); those count as hits of the known prefix only."""
        with self._lock:
            if hits:
                hits = min(hits, self.index.residency(keys[:hits])[0])
            return self.manager.touch(keys, hits=hits, checkpoint_at=checkpoint_at)

    record_access = touch

    def prepare_load(self, keys: np.ndarray, blocks: int, *, start: int = 0) -> LoadSpec:
        with self._lock:
            spec = self.manager.prepare_load(keys, blocks, start=start)
            if spec.remote.size == 0:
                return spec
        # blocks only the cluster holds: into their (filling, locked) DRAM slots, off the lock
        ok = self.backend.fetch_remote(spec.path[spec.remote], spec.slots[spec.remote])
        with self._lock:
            return self.manager.complete_fetch(spec, ok)

    def complete_load(self, spec: LoadSpec, failed: np.ndarray | None = None, *,
                      state_failed: bool = False) -> int:
        with self._lock:
            return self.manager.complete_load(spec, failed, state_failed=state_failed)

    def cancel_load(self, spec: LoadSpec) -> None:
        with self._lock:
            self.manager.cancel_load(spec)

    def prepare_store(self, keys: np.ndarray, start: int = 0, *, session: int = 0,
                      direct: bool = False) -> StoreSpec:
        with self._lock:
            return self.manager.prepare_store(keys, start, session=session, direct=direct)

    def prepare_promotion(self, keys: np.ndarray, ssd_positions: np.ndarray,
                          dram_blocks: int) -> StoreSpec:
        with self._lock:
            return self.manager.prepare_promotion(keys, ssd_positions, dram_blocks)

    def complete_store(self, spec: StoreSpec, *, success: bool = True,
                       direct_rows: np.ndarray | None = None) -> int:
        if spec.direct.size and direct_rows is None:
            raise ValueError("complete_store: the spec has direct writes; give their bytes")
        with self._lock:
            return self.manager.complete_store(spec, success=success, direct_rows=direct_rows)

    def remove(self, keys: np.ndarray) -> int:
        with self._lock:
            return self.manager.remove(keys)

    def writing(self, key: bytes) -> bool:
        with self._lock:
            return self.manager.writing(key)

    def holding(self) -> threading.RLock:
        """The cache's lock, for a caller that makes several verbs one step
        (``with cache.holding(): spec = prepare_store(...); fill; complete``):
        no other thread sees the slots in between."""
        return self._lock

    def place(self, keys: np.ndarray, tier: Tier, *, session: int = 0) -> int:
        with self._lock:
            return self.manager.place(keys, tier, session=session)

    def prepare_checkpoint(self, keys: np.ndarray, *, keep: int = 0) -> StateSpec | None:
        with self._lock:
            return self.manager.prepare_checkpoint(keys, keep=keep)

    def complete_checkpoint(self, spec: StateSpec, *, success: bool = True) -> None:
        with self._lock:
            self.manager.complete_checkpoint(spec, success=success)

    def state_slots(self, spec: StateSpec) -> np.ndarray:
        """The DRAM slots a prepared checkpoint's state is copied into."""
        with self._lock:
            return self.backend.state_slots(spec.dram_handle)

    def checkpoint_source(self, spec: LoadSpec) -> tuple[Tier, np.ndarray, np.ndarray]:
        """Where a locked load's checkpoint is read from: its tier, its DRAM
        slots or SSD handles, and (SSD) the keys the store verifies them by."""
        ck = spec.checkpoint
        with self._lock:
            parts = self.backend.state_parts(ck.tier, ck.slot).copy()
        keys = (state_keys(spec.path[ck.boundary - 1], parts.shape[0]) if ck.tier == SSD
                else np.zeros((0, 32), np.uint8))
        return ck.tier, parts, keys

    @property
    def staging_slots(self) -> int:
        return self.backend.staging_slots

    @property
    def reachable(self) -> bool:
        """In process: always (``ServerCache.reachable`` is the server's breaker)."""
        return True

    def write_direct(self, chain: np.ndarray, positions: np.ndarray,
                     staging: np.ndarray) -> int:
        """Write-through of blocks DRAM did not keep (``prepare_store(direct=True)``):
        ``chain[positions]``'s bytes were copied into the staging slots
        `staging`; admission writes them to the SSD. The slots stay taken."""
        rows = np.empty((staging.size, self.backend.pool.slot_bytes), np.uint8)
        self.backend.pool.gather(np.asarray(staging, np.int64), rows)
        spec = StoreSpec(chain[:0], positions[:0], np.zeros(0, np.int64), np.zeros(0, np.uint8),
                         direct=np.asarray(positions, np.int64), chain=chain)
        return self.complete_store(spec, direct_rows=rows)

    def wait_write_behind(self, timeout: float) -> bool:
        """Waits until a DRAM victim can stay readable while it is written
        (a write-behind slot is free, or nothing is queued); False on
        timeout. For callers that may wait for the SSD, never an engine."""
        return self.backend.wait_write_behind(timeout)

    def take_staging(self, count: int) -> np.ndarray:
        """Up to `count` staging slots for direct writes (``staging_slots``)."""
        with self._lock:
            return self.backend.take_staging(count)

    def release_staging(self, slots: np.ndarray) -> None:
        with self._lock:
            self.backend.release_staging(slots)

    def take_events(self) -> list[CacheEvent]:
        """Residency events since the last call (``CacheConfig.events``)."""
        with self._lock:
            return self.manager.take_events()

    def take_ssd_writes(self) -> list[tuple[np.ndarray, bool]]:
        with self._lock:
            return self.manager.take_ssd_writes()

    # ------------------------------------------------- bytes in hand

    def read(self, spec: LoadSpec, out: np.ndarray) -> np.ndarray:
        """Copies a locked load's blocks [start, n) into ``out[i]`` (DRAM
        slots directly, SSD blocks verified by the store); returns the
        positions whose SSD read failed (their rows are zeroed)."""
        dram, ssd = spec.positions(DRAM), spec.positions(SSD)
        if dram.size:
            rows = np.empty((dram.size, self.cfg.block_bytes), np.uint8)
            self.backend.pool.gather(spec.slots[dram], rows)
            out[dram] = rows
        if ssd.size == 0:
            return ssd
        rows = np.empty((ssd.size, self.cfg.block_bytes), np.uint8)
        good = self.backend.read_ssd(spec.slots[ssd], spec.path[ssd], rows)
        out[ssd] = rows
        return ssd[~good]

    def load(self, keys: np.ndarray, out: np.ndarray, *, blocks: int | None = None) -> LoadResult:
        """Copies the longest cached prefix of ``keys[:blocks]`` into
        ``out[i]``; the result stops before the first block that failed."""
        n = keys.shape[0] if blocks is None else min(blocks, keys.shape[0])
        if out.shape[0] < n or out.shape[1] != self.cfg.block_bytes:
            raise ValueError(f"out must have at least {n} rows of {self.cfg.block_bytes} bytes")
        spec = self.prepare_load(keys, n)
        failed = self.read(spec, out)
        served = self.complete_load(spec, failed)
        ssd = spec.positions(SSD)
        ssd = ssd[ssd < served]
        remote = spec.remote_hits(served)
        return LoadResult(served, served - ssd.size - remote, int(ssd.size), int(failed.size), ssd,
                          remote)

    def store(self, keys: np.ndarray, data: np.ndarray, *, start: int = 0,
              session: int = 0) -> int:
        """New KV of blocks ``keys[start:]`` (rows of `data`, one per block)
        lands in DRAM; admission decides on SSD writes (blocks DRAM cannot
        take are written through from `data`). Returns blocks stored in DRAM."""
        n = keys.shape[0]
        if data.shape != (n - start, self.cfg.block_bytes):
            raise ValueError(f"data must be ({n - start}, {self.cfg.block_bytes}) bytes")
        spec = self.prepare_store(keys, start, session=session, direct=True)
        if spec.num_blocks:
            self.backend.pool.scatter(spec.slots, data[spec.positions - start])
        return self.complete_store(spec, direct_rows=data[spec.direct - start])

    def promote(self, keys: np.ndarray, ssd_positions: np.ndarray, rows: np.ndarray,
                dram_blocks: int) -> int:
        """After prefill: copies the policy's pick of the SSD hits (their
        bytes are `rows`, one per position) into DRAM, only into slots of DRAM
        blocks idle for the policy's cutoff. Returns blocks promoted."""
        spec = self.prepare_promotion(keys, ssd_positions, dram_blocks)
        if spec.num_blocks:
            row_of = {int(p): i for i, p in enumerate(ssd_positions)}
            self.backend.pool.scatter(spec.slots, rows[[row_of[int(p)] for p in spec.positions]])
        return self.complete_store(spec)

    # ------------------------------------------------------------ lifetime

    def flush(self) -> None:
        """Waits until every queued SSD write has been carried out."""
        self.backend.flush()

    def run_writes(self, count: int | None = None) -> int:
        """``write_mode="manual"``: lands the `count` oldest queued SSD
        writes now (all by default); returns how many."""
        return self.backend.run_writes(count)

    def run_publishes(self, count: int | None = None) -> int:
        """``write_mode="manual"`` with a cluster tier: carries out the `count`
        oldest queued puts now (all by default); returns how many."""
        return self.backend.run_publishes(count)

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> "TieredCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --------------------------------------------------------------- helpers

    def _remote_gauges(self) -> dict[str, float]:
        """The cluster tier's counters, latencies and breaker, flattened."""
        snap = self.backend.remote_tier.snapshot()
        out = {f"remote_{k}": float(v) for k, v in snap.get("counters", {}).items()}
        for op, q in snap.get("latency", {}).items():
            for name, v in q.items():
                out[f"remote_{op}_{name}"] = float(v)
        out["remote_breaker_open"] = float(snap["breaker"] != "closed")
        st = self.stats
        out.update(remote_hit_blocks=st.remote_hit_blocks,
                   remote_found_blocks=st.remote_found_blocks,
                   remote_published_blocks=st.remote_published_blocks,
                   ssd_writes_skipped_remote=st.ssd_writes_skipped_remote,
                   ssd_bytes_saved_remote=st.ssd_writes_skipped_remote * self.cfg.block_bytes)
        return out

    def _drop_scrubbed(self, handles: np.ndarray, keys: np.ndarray) -> None:
        """The scrub found these SSD slots bad: a recovered block not yet
        adopted is forgotten, an indexed copy still in that slot is dropped
        (the block may have left the SSD or moved meanwhile)."""
        with self._lock:
            for h, k in zip(handles.tolist(), keys):
                key = bytes(k)
                if self.backend.recovered.get(key) == h:
                    del self.backend.recovered[key]
                    self.backend.free(SSD, np.array([h], np.int64))
                elif self.manager.index.slot_of(key, SSD) == h:
                    self.manager.drop_ssd(np.asarray(k, np.uint8).reshape(1, 32))

    def _adopt(self, keys: np.ndarray, plan: ReloadPlan) -> bool:
        """Puts recovered SSD blocks that extend the prefix of `keys` the
        node holds itself (DRAM, SSD) into the index; a block only the
        cluster tier holds (a REMOTE copy) takes its SSD copy too. Caller
        holds the lock."""
        masks = plan.masks[:plan.num_known] & ~np.uint8(REMOTE.bit)
        local = int(np.argmin(masks != 0)) if (masks == 0).any() else plan.num_known
        recovered = self.backend.recovered
        pos, handles = [], []
        for i in range(local, keys.shape[0]):
            if i < plan.num_known and masks[i] & SSD.bit:
                continue
            h = recovered.pop(bytes(keys[i]), None)
            if h is None:
                if i < plan.num_known and plan.masks[i] & REMOTE.bit:
                    continue  # the cluster holds it: the prefix goes on
                break
            if i < plan.num_known and masks[i]:
                self.backend.free(SSD, np.array([h], np.int64))  # already cached elsewhere
                continue
            pos.append(i)
            handles.append(h)
        self.manager.adopt_ssd(keys, pos, handles)
        states = 0
        if self.cfg.state_bytes and recovered:
            states = self._adopt_states(keys[:max(pos[-1] + 1 if pos else 0, plan.num_available)])
        return bool(pos) or states > 0

    def _adopt_states(self, keys: np.ndarray) -> int:
        """Recovered state checkpoints on the blocks of `keys` (all their
        ``state_units`` SSD blocks found) go back on their blocks."""
        recovered, units, n = self.backend.recovered, self.cfg.state_units, 0
        for i in range(keys.shape[0]):
            parts = [bytes(k) for k in state_keys(keys[i], units)]
            if not all(p in recovered for p in parts):
                continue
            handle = self.backend.adopt_state([recovered.pop(p) for p in parts])
            if self.manager.adopt_ssd_state(keys[i], handle):
                n += 1
        return n
