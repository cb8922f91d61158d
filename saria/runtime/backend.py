"""The runtime's data side: a DRAM slot pool, the O_DIRECT SSD store and its writer.

``TierBackend`` is the ``Backend`` the cache core drives in an engine (and in
``saria replay --mode real``): it hands out DRAM slots, frees them, and
carries out the SSD writes the core decided, through a bounded queue and one
writer thread (``write_mode="async"``) or inline (``"sync"``: tests and the
real-mode replay). It decides nothing.

* A write's bytes are copied out of their DRAM slots when the write is
  submitted, so the core may free or reuse the slots at once; while it is
  queued its SSD space counts as used (``free_units``). When the queue is
  full the write is refused (the core counts it dropped): the engine is never
  blocked by the SSD.
* A hybrid model's state checkpoint spans ``state_units`` slots: in DRAM a
  handle names the list of its slots; on the SSD it is written as that many
  blocks under keys derived from its block's key (``state_keys``), so the
  store verifies them like any block.
* Blocks the store recovered at start-up (a restart) wait in ``recovered``
  until a lookup adopts them into the index; when the SSD is full, the core
  reclaims the ones nobody asked for first (``reclaim_ssd``).
"""

from __future__ import annotations

import hashlib
import queue
import threading

import numpy as np

from saria.core.backend import Backend
from saria.core.specs import SsdWrite
from saria.index import Tier
from saria.tiers.dram import DramPool

DRAM, SSD = Tier.DRAM, Tier.SSD


def state_keys(key: np.ndarray | bytes, units: int) -> np.ndarray:
    """The SSD keys of a state checkpoint's `units` blocks: BLAKE2b of the
    block's key, a tag and the part number (never a block key: those are
    chained hashes of token ids)."""
    base = bytes(key) + b"saria-state"
    return np.frombuffer(b"".join(hashlib.blake2b(base + i.to_bytes(4, "little"),
                                                  digest_size=32).digest()
                                  for i in range(units)), np.uint8).reshape(units, 32)


class _Handles:
    """Small integer handles for multi-slot states (index slots are u32)."""

    def __init__(self) -> None:
        self._items: dict[int, np.ndarray] = {}
        self._free: list[int] = []

    def put(self, value: np.ndarray) -> int:
        h = self._free.pop() if self._free else len(self._items)
        self._items[h] = value
        return h

    def get(self, handle: int) -> np.ndarray:
        return self._items[handle]

    def pop(self, handle: int) -> np.ndarray:
        self._free.append(handle)
        return self._items.pop(handle)

    def __len__(self) -> int:
        return len(self._items)


class TierBackend(Backend):
    """DRAM pool + SSD store under a ``CacheManager``; see the module docstring.

    `lock` is the cache's lock: the writer thread takes it to report a
    finished write, so the core sees completions one at a time.
    """

    def __init__(self, *, block_bytes: int, dram_slots: int, ssd_dirs: tuple[str, ...] = (),
                 ssd_bytes: int = 0, state_units: int = 0, write_mode: str = "async",
                 write_queue: int = 256, pin: bool | None = None, shared_pool: str | None = None,
                 staging_slots: int = 0, lock: threading.RLock) -> None:
        self.block_bytes = block_bytes
        self.state_units = state_units
        self.pool = DramPool(dram_slots, block_bytes, pin=pin, shared=shared_pool)
        if not 0 <= staging_slots < dram_slots:
            raise ValueError(f"staging_slots must be in [0, {dram_slots}), got {staging_slots}")
        # Slots a copier fills with blocks on their way straight to the SSD
        # (write-through of blocks DRAM does not keep): out of the cache's capacity.
        self.staging_slots = staging_slots
        self._staging = list(self.pool.alloc(staging_slots)) if staging_slots else []
        self.ssd = None
        if ssd_dirs and ssd_bytes > 0:
            from saria.tiers.ssd import SsdStore

            self.ssd = SsdStore(list(ssd_dirs), ssd_bytes, block_bytes)
        self._lock = lock
        self._states = {DRAM: _Handles(), SSD: _Handles()}
        # Found on the SSD at start-up, not (yet) in the index.
        self.recovered: dict[bytes, int] = {}
        if self.ssd is not None:
            rec = self.ssd.take_recovered()
            self.recovered = {bytes(k): int(h) for k, h in zip(rec.keys, rec.handles)}
        self._pending_units = 0
        self._queue: queue.Queue | None = None
        self._writer: threading.Thread | None = None
        self.asynchronous = self.ssd is not None and write_mode == "async"
        if self.asynchronous:
            self._queue = queue.Queue(write_queue)
            self._writer = threading.Thread(target=self._write_loop, name="saria-ssd-writer",
                                            daemon=True)
            self._writer.start()

    # ---------------------------------------------------------- Backend API

    def capacity(self, tier: Tier) -> int:
        if tier == DRAM:
            return self.pool.num_slots - self.staging_slots
        if tier == SSD:
            return 0 if self.ssd is None else self.ssd.capacity_slots
        return 0

    def free_units(self, tier: Tier) -> int:
        if tier == DRAM:
            return self.pool.free_slots
        if tier == SSD and self.ssd is not None:
            return self.ssd.free_slots - self._pending_units
        return 0

    def alloc(self, tier: Tier, count: int) -> np.ndarray:
        if tier != DRAM:
            raise ValueError(f"the runtime allocates only DRAM slots, not {tier.name}")
        return self.pool.alloc(count)

    def free(self, tier: Tier, slots: np.ndarray) -> None:
        if len(slots) == 0:
            return
        if tier == DRAM:
            self.pool.free(slots)
        elif tier == SSD:
            self.ssd.free(np.asarray(slots, np.int64))

    def alloc_state(self, tier: Tier) -> int:
        if tier != DRAM:
            raise ValueError(f"the runtime keeps states only in DRAM and on the SSD, not {tier.name}")
        return self._states[DRAM].put(self.pool.alloc(self.state_units))

    def free_state(self, tier: Tier, handle: int) -> None:
        slots = self._states[tier].pop(handle)
        self.free(tier, slots)

    def write_ssd(self, job: SsdWrite) -> bool:
        keys, rows = self._payload(job)
        units = keys.shape[0]
        if not self.asynchronous:
            self._finish(job, self.ssd.write(keys, rows))
            return True
        self._pending_units += units
        try:
            self._queue.put_nowait((job, keys, rows))
        except queue.Full:
            self._pending_units -= units
            return False
        return True

    def reclaim_ssd(self, units: int) -> int:
        drop = [self.recovered.popitem()[1] for _ in range(min(units, len(self.recovered)))]
        if drop:
            self.ssd.free(np.asarray(drop, np.int64))
        return len(drop)

    def take_staging(self, count: int) -> np.ndarray:
        """Up to `count` staging slots (see ``staging_slots``)."""
        k = min(count, len(self._staging))
        out, self._staging = self._staging[:k], self._staging[k:]
        return np.asarray(out, np.int64)

    def release_staging(self, slots: np.ndarray) -> None:
        self._staging.extend(int(x) for x in slots)

    # ------------------------------------------------------------ the bytes

    def read_ssd(self, handles: np.ndarray, keys: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Reads SSD blocks into `out` (verified: header, crc32c, key);
        False where a block failed (its row is zeroed, never wrong bytes)."""
        return self.ssd.read(np.asarray(handles, np.int64), np.ascontiguousarray(keys), out)

    def read_state(self, tier: Tier, handle: int, key: np.ndarray) -> np.ndarray | None:
        """A state checkpoint's bytes (``state_units`` rows), or None when an
        SSD part failed its verification."""
        parts = self._states[tier].get(handle)
        out = np.empty((parts.shape[0], self.block_bytes), np.uint8)
        if tier == DRAM:
            return self.pool.gather(parts, out)
        ok = self.read_ssd(parts, state_keys(key, parts.shape[0]), out)
        return out if ok.all() else None

    def state_slots(self, handle: int) -> np.ndarray:
        """The DRAM slots of a state checkpoint (a mover fills them)."""
        return self._states[DRAM].get(handle)

    def gauges(self) -> dict[str, float]:
        """Occupancy of the tiers, for metrics."""
        out = {"dram_slots": self.pool.num_slots, "dram_used_slots": self.pool.used_slots,
               "ssd_recovered_unadopted": len(self.recovered),
               "ssd_write_queue": self._queue.qsize() if self._queue is not None else 0}
        if self.ssd is not None:
            st = self.ssd.stats()
            tot = st["total"]
            out.update(ssd_slots=tot["capacity_slots"], ssd_free_slots=tot["free_slots"],
                       ssd_failed_drives=tot["failed_drives"],
                       ssd_bytes_written=tot["bytes_written"], ssd_bytes_read=tot["bytes_read"])
            for i, d in enumerate(st["drives"]):
                out[f"ssd_bytes_written_drive{i}"] = int(d["bytes_written"])
                out[f"ssd_bytes_read_drive{i}"] = int(d["bytes_read"])
        return out

    # ------------------------------------------------------------ lifetime

    def flush(self) -> None:
        """Waits until every queued SSD write has been carried out."""
        if self._queue is not None:
            self._queue.join()

    def close(self) -> None:
        if self._queue is not None:
            self._queue.put(None)
            self._writer.join()
            self._queue = None
        if self.ssd is not None:
            self.ssd.close()

    # -------------------------------------------------------------- helpers

    def _payload(self, job: SsdWrite) -> tuple[np.ndarray, np.ndarray]:
        """The keys and bytes to write, copied out of DRAM now."""
        if job.rows is not None:
            return np.ascontiguousarray(job.keys), np.ascontiguousarray(job.rows)
        if not job.state:
            rows = np.empty((job.keys.shape[0], self.block_bytes), np.uint8)
            self.pool.gather(job.sources, rows)
            return np.ascontiguousarray(job.keys), rows
        parts = [self._states[DRAM].get(int(h)) for h in job.sources]
        rows = np.empty((sum(p.shape[0] for p in parts), self.block_bytes), np.uint8)
        self.pool.gather(np.concatenate(parts), rows)
        keys = np.concatenate([state_keys(k, p.shape[0]) for k, p in zip(job.keys, parts)])
        return keys, rows

    def _finish(self, job: SsdWrite, handles: np.ndarray) -> None:
        """Reports a write to the core: a state is written only when all its
        parts are (the others go back)."""
        if job.state:
            per = self.state_units
            out = np.full(job.keys.shape[0], -1, np.int64)
            for i in range(job.keys.shape[0]):
                parts = handles[i * per:(i + 1) * per]
                if (parts >= 0).all():
                    out[i] = self._states[SSD].put(parts.copy())
                elif (parts >= 0).any():
                    self.ssd.free(parts[parts >= 0])
            handles = out
        self._on_written(job, handles)

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                job, keys, rows = item
                handles = self.ssd.write(keys, rows)  # the I/O, outside the cache's lock
                with self._lock:
                    self._pending_units -= keys.shape[0]
                    self._finish(job, handles)
            finally:
                self._queue.task_done()
