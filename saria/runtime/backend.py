"""The runtime's data side: a DRAM slot pool, the O_DIRECT SSD store and its writer.

``TierBackend`` is the ``Backend`` the cache core drives in an engine (and in
``saria replay --mode real``): it hands out DRAM slots, frees them, and
carries out the SSD writes the core decided, through a bounded queue and one
writer thread (``write_mode="async"``), inline (``"sync"``: the real-mode
replay), or queued until the caller runs them (``"manual"``: ``run_writes``,
for tests that choose when each write lands). It decides nothing.

* A write of DRAM blocks is *held* (``SsdWrite.held``): the core keeps the
  blocks' DRAM copies allocated and readable until it completes, and the
  writer thread reads their bytes from the slots when it writes them (no
  copy at submission). ``write_behind`` slots, carved out of the pool, let
  that many DRAM *victims* keep their slots while their write is queued, so
  a block on its way to the SSD is never in no tier. Other writes (states,
  bytes in hand) are copied when submitted. While a write is queued its SSD
  space counts as used (``free_units``). When the queue or the write-behind
  is full the write is refused (the core counts it dropped): the engine is
  never blocked by the SSD.
* A hybrid model's state checkpoint spans ``state_units`` slots: in DRAM a
  handle names the list of its slots; on the SSD it is written as that many
  blocks under keys derived from its block's key (``state_keys``), so the
  store verifies them like any block.
* Blocks the store recovered at start-up (a restart) wait in ``recovered``
  until a lookup adopts them into the index; when the SSD is full, the core
  reclaims the ones nobody asked for first (``reclaim_ssd``). The store
  finds them in its journal, not by reading the drive (``saria.tiers.ssd``).
* ``remote`` (a ``saria.tiers.remote.RemoteTier``) is the cluster tier
  below the node: the pool's rows are registered with it (zero-copy gets),
  lookups ask it, ``fetch_remote`` gets blocks straight into DRAM slots, and
  puts run on one publisher thread through a bounded queue (refused when
  full). A slot whose get was late is kept from reuse until that get really
  ended (``GetResult.then``): the core may free it at once, the pool gets it
  back only then, so a late write can never land in a reused slot.
* ``scrub_bytes_per_s`` > 0 starts a scrub thread that re-reads the SSD's
  blocks at that rate (token bucket, outside the cache's lock) and hands the
  slots that no longer verify to ``on_scrub_bad`` (the cache drops them).
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time

import numpy as np

from saria.core.backend import Backend
from saria.core.specs import SsdWrite
from saria.index import Tier
from saria.tiers.dram import DramPool

DRAM, SSD = Tier.DRAM, Tier.SSD
log = logging.getLogger("saria.runtime")


def state_keys(key: np.ndarray | bytes, units: int) -> np.ndarray:
    """The SSD keys of a state checkpoint's `units` blocks: BLAKE2b of the
    block's key, a tag and the part number (never a block key: those are
    chained hashes of token ids)."""
    base = bytes(key) + b"saria-state"
    return np.frombuffer(b"".join(hashlib.blake2b(base + i.to_bytes(4, "little"),
                                                  digest_size=32).digest()
                                  for i in range(units)), np.uint8).reshape(units, 32)


def _run_queued(q: queue.Queue, run_one, count: int | None) -> int:
    """Runs the `count` oldest items of `q` (all by default) in this thread."""
    ran = 0
    while (count is None or ran < count) and not q.empty():
        run_one(q.get())
        ran += 1
    return ran


def _serve_queue(q: queue.Queue, run_one) -> None:
    """A worker thread's loop: runs items until a None arrives."""
    while True:
        item = q.get()
        if item is None:
            q.task_done()
            return
        run_one(item)


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
                 staging_slots: int = 0, write_behind: int | None = None,
                 scrub_bytes_per_s: float = 0.0, ssd_parts: int = 1,
                 remote=None, publish_queue: int = 64,
                 lock: threading.RLock) -> None:
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

            self.ssd = SsdStore(list(ssd_dirs), ssd_bytes, block_bytes, parts=ssd_parts)
        self._lock = lock
        self.asynchronous = self.ssd is not None and write_mode in ("async", "manual")
        # Victims readable while their write is queued: a 16th of the pool by
        # default (at 6 GB/s of writes, 256 GB of DRAM keep ~2.7 s of them).
        if not self.asynchronous:
            write_behind = 0
        elif write_behind is None:
            write_behind = dram_slots // 16
        if not 0 <= write_behind < dram_slots - staging_slots:
            raise ValueError(f"write_behind must be in [0, {dram_slots - staging_slots}), "
                             f"got {write_behind}")
        self.write_behind = write_behind
        self._retained = 0
        self._room = threading.Condition(lock)  # write-behind slots given back
        self._states = {DRAM: _Handles(), SSD: _Handles()}
        # Found on the SSD at start-up, not (yet) in the index.
        self.recovered: dict[bytes, int] = {}
        if self.ssd is not None:
            rec = self.ssd.take_recovered()
            self.recovered = {bytes(k): int(h) for k, h in zip(rec.keys, rec.handles)}
        self._pending_units = 0
        self._queue: queue.Queue | None = None
        self._writer: threading.Thread | None = None
        if self.asynchronous:
            self._queue = queue.Queue(write_queue)
        if self.asynchronous and write_mode == "async":
            self._writer = threading.Thread(target=_serve_queue, name="saria-ssd-writer",
                                            args=(self._queue, self._write_one), daemon=True)
            self._writer.start()
        # Background scrub (off at 0): re-reads the SSD's blocks at this rate
        # and hands the ones that no longer verify to `on_scrub_bad(handles,
        # keys)` (the cache drops them from its index).
        self.scrub_bytes_per_s = float(scrub_bytes_per_s)
        self.on_scrub_bad = None
        self.scrub_passes = 0
        self._scrub_stop = threading.Event()
        self._scrubber: threading.Thread | None = None
        if self.ssd is not None and self.scrub_bytes_per_s > 0:
            self._scrubber = threading.Thread(target=self._scrub_loop, name="saria-ssd-scrub",
                                              daemon=True)
            self._scrubber.start()
        self._start_remote(remote, publish_queue, mode=write_mode)

    # ---------------------------------------------------------- Backend API

    def capacity(self, tier: Tier) -> int:
        if tier == DRAM:
            return self.pool.num_slots - self.staging_slots - self.write_behind
        if tier == SSD:
            return 0 if self.ssd is None else self.ssd.capacity_slots
        return 0

    def free_units(self, tier: Tier) -> int:
        if tier == DRAM:  # the unused write-behind slots are not the cache's
            return self.pool.free_slots - (self.write_behind - self._retained)
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
            if self.remote:  # a late get may still write these: back to the pool when it ends
                slots = self._unless_fetching(slots)
            if len(slots):
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
        if not self.asynchronous:
            self._finish(job, self.ssd.write(*self._payload(job)))
            return True
        payload = None if job.held else self._payload(job)  # held: read when written
        units = job.keys.shape[0] * (self.state_units if job.state else 1)
        self._pending_units += units
        try:
            self._queue.put_nowait((job, units, payload))
        except queue.Full:
            self._pending_units -= units
            return False
        return True

    def unretain(self, count: int) -> None:
        super().unretain(count)
        self._room.notify_all()

    def wait_write_behind(self, timeout: float) -> bool:
        """Waits (the caller must not hold the cache's lock) until a
        write-behind slot is free or no write is queued; False on timeout.
        For callers that may wait for the SSD (LMCache's asynchronous stores),
        never an engine's step."""
        if not self.write_behind:
            return True
        with self._room:
            return self._room.wait_for(
                lambda: self._retained < self.write_behind or self._pending_units == 0, timeout)

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

    def adopt_state(self, handles: np.ndarray) -> int:
        """A handle for a state checkpoint whose SSD blocks were recovered."""
        return self._states[SSD].put(np.asarray(handles, np.int64))

    def state_parts(self, tier: Tier, handle: int) -> np.ndarray:
        """A state checkpoint's DRAM slots or SSD handles (a mover reads them)."""
        return self._states[tier].get(handle)

    # ------------------------------------------------------ the cluster tier

    def _start_remote(self, remote, publish_queue: int, *, mode: str) -> None:
        self.remote_tier = remote
        self.remote = remote is not None
        self._fetching: dict[int, int] = {}   # DRAM slot -> gets that may still write it
        self._free_later: set[int] = set()    # freed by the core while a get was out
        # Guards the two above, not the cache's lock: a late get ends on the
        # guard's thread, which must never wait for the cache's lock (its
        # holder may be waiting for a call on that very lane). Under it, only
        # the pool's own lock is taken.
        self._fetch_lock = threading.Lock()
        self._publish_q: queue.Queue | None = None
        self._publisher: threading.Thread | None = None
        self._publish_inline = mode == "sync"  # as SSD writes: in the call (the real-mode replay)
        if remote is None:
            return
        if remote.block_bytes != self.block_bytes:
            raise ValueError(f"remote tier blocks are {remote.block_bytes} B, "
                             f"DRAM slots {self.block_bytes} B")
        remote.register(self.pool.array)
        self._publish_q = queue.Queue(publish_queue)
        if mode == "async":  # "manual": the caller runs them (run_publishes), as it lands SSD writes
            self._publisher = threading.Thread(target=_serve_queue, name="saria-remote-put",
                                               args=(self._publish_q, self._publish_one),
                                               daemon=True)
            self._publisher.start()

    def remote_exists(self, keys: np.ndarray) -> np.ndarray:
        return self.remote_tier.exists(keys)

    def remote_down(self) -> bool:
        return self.remote_tier.guard.down

    def remote_forget(self, keys: np.ndarray) -> None:
        self.remote_tier.forget(keys)

    def copy_rows(self, slots: np.ndarray) -> np.ndarray:
        rows = np.empty((len(slots), self.block_bytes), np.uint8)
        return self.pool.gather(np.asarray(slots, np.int64), rows)

    def publish(self, job) -> bool:
        if self._publish_inline:
            self._on_published(job, self._put(job))
            return True
        try:
            self._publish_q.put_nowait(job)
        except queue.Full:
            return False
        return True

    def fetch_remote(self, keys: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """Gets `keys` from the cluster straight into DRAM `slots` (the
        caller does not hold the cache's lock); (n,) bool: arrived whole and
        verified. A slot stays out of the pool until its get really ends."""
        slots = np.asarray(slots, np.int64)
        with self._fetch_lock:
            for x in slots.tolist():
                self._fetching[x] = self._fetching.get(x, 0) + 1
        try:
            got = self.remote_tier.get(keys, self.pool.array, slots)
        except Exception:  # noqa: BLE001 -- a failed get is a miss, never an engine error
            log.exception("saria: remote get of %d blocks failed", len(slots))
            self._fetched(slots)
            return np.zeros(len(slots), bool)
        # at the get's real end, at once or on the guard's thread when a late one lands: a
        # slot the core freed meanwhile goes back to the pool then, not at some later call
        got.then(lambda: self._fetched(slots))
        return got.ok

    def _fetched(self, slots: np.ndarray) -> None:
        """A get into `slots` ended: those the core freed meanwhile go back to the pool."""
        back = []
        with self._fetch_lock:
            for x in slots.tolist():
                left = self._fetching.pop(x) - 1
                if left:
                    self._fetching[x] = left
                elif x in self._free_later:
                    self._free_later.discard(x)
                    back.append(x)
        if back:
            self.pool.free(np.array(back, np.int64))

    def _unless_fetching(self, slots: np.ndarray) -> np.ndarray:
        """`slots` (freed by the core) less those a get may still write: kept
        for ``_fetched`` to give back when the get ends."""
        slots = np.asarray(slots, np.int64)
        with self._fetch_lock:
            if not self._fetching:
                return slots
            late = np.array([int(x) in self._fetching for x in slots], bool)
            self._free_later.update(int(x) for x in slots[late])
        return slots[~late]

    def run_publishes(self, count: int | None = None) -> int:
        """``write_mode="manual"``: carries out the `count` oldest queued puts
        (all by default) in the calling thread, which must not hold the
        cache's lock; returns how many ran."""
        if self._publisher is not None or self._publish_q is None:
            raise RuntimeError("run_publishes is for write_mode='manual' with a remote tier")
        return _run_queued(self._publish_q, self._publish_one, count)

    def _publish_one(self, job) -> None:
        try:
            held = self._put(job)  # outside the cache's lock
            with self._lock:
                self._on_published(job, held)
        finally:
            self._publish_q.task_done()

    def _put(self, job) -> np.ndarray:
        """One put, bounded by the tier's deadline; (n,) bool: the cluster holds it."""
        try:
            return self.remote_tier.put(job.keys, job.rows).held
        except Exception:  # noqa: BLE001 -- a failed put, never a dead publisher
            log.exception("saria: remote put of %d blocks failed", job.keys.shape[0])
            return np.zeros(job.keys.shape[0], bool)

    def gauges(self) -> dict[str, float]:
        """Occupancy of the tiers, for metrics."""
        out = {"dram_slots": self.pool.num_slots, "dram_used_slots": self.pool.used_slots,
               "dram_write_behind_slots": self.write_behind,
               "dram_write_behind_used": self._retained,
               "ssd_recovered_unadopted": len(self.recovered),
               "ssd_write_queue": self._queue.qsize() if self._queue is not None else 0}
        if self.ssd is not None:
            st = self.ssd.stats()
            tot = st["total"]
            out.update(ssd_slots=tot["capacity_slots"], ssd_free_slots=tot["free_slots"],
                       ssd_failed_drives=tot["failed_drives"],
                       ssd_bytes_written=tot["bytes_written"], ssd_bytes_read=tot["bytes_read"],
                       ssd_recovery_bytes_read=tot["recovery_bytes_read"],
                       ssd_recovery_seconds=tot["recovery_seconds"],
                       ssd_journal_bytes_written=tot["journal_bytes_written"],
                       ssd_scrub_bytes_read=tot["scrub_bytes_read"],
                       ssd_scrub_bad_slots=tot["scrub_bad_slots"],
                       ssd_scrub_passes=self.scrub_passes)
            for i, d in enumerate(st["drives"]):
                out[f"ssd_bytes_written_drive{i}"] = int(d["bytes_written"])
                out[f"ssd_bytes_read_drive{i}"] = int(d["bytes_read"])
        return out

    # ------------------------------------------------------------ lifetime

    def flush(self) -> None:
        """Waits until every queued SSD write (and remote put) has been carried out."""
        if self._writer is None and self._queue is not None:
            self.run_writes()
        elif self._queue is not None:
            self._queue.join()
        if self._publish_q is not None and self._publisher is None:
            self.run_publishes()
        elif self._publish_q is not None:
            self._publish_q.join()

    def run_writes(self, count: int | None = None) -> int:
        """``write_mode="manual"``: carries out the `count` oldest queued
        writes (all by default) in the calling thread, as the writer thread
        would; returns how many ran. The caller must not hold the cache's lock."""
        if self._writer is not None or self._queue is None:
            raise RuntimeError("run_writes is for write_mode='manual'")
        return _run_queued(self._queue, self._write_one, count)

    def close(self) -> None:
        if self._publisher is not None:  # queued puts go out first (each bounded)
            self._publish_q.put(None)
            self._publisher.join()
            self._publisher = None
        elif self._publish_q is not None:
            self.run_publishes()
        if self._scrubber is not None:
            self._scrub_stop.set()
            self._scrubber.join()
            self._scrubber = None
        if self._queue is not None:
            if self._writer is not None:
                self._queue.put(None)
                self._writer.join()
                self._writer = None
            else:
                self.run_writes()  # nothing queued is lost at a clean close
            self._queue = None
        if self.ssd is not None:
            self.ssd.close()

    # -------------------------------------------------------------- helpers

    def _scrub_loop(self) -> None:
        """Reads `scrub_bytes_per_s` of SSD slots per second (token bucket,
        one second of room), outside the cache's lock."""
        period = 0.05
        tokens = 0.0
        slot = self.ssd.slot_bytes
        last = time.monotonic()
        while not self._scrub_stop.wait(period):
            now = time.monotonic()
            tokens = min(tokens + (now - last) * self.scrub_bytes_per_s,
                         max(self.scrub_bytes_per_s, slot))
            last = now
            n = int(tokens // slot)
            if n == 0:
                continue
            try:
                rep = self.ssd.scrub(n)
            except Exception:  # closed under us, or the drive went away: stop quietly
                return
            tokens -= rep.bytes_read if rep.checked else n * slot  # an empty store costs its tokens
            if rep.wrapped:
                self.scrub_passes += 1
            if rep.handles.size and self.on_scrub_bad is not None:
                try:
                    self.on_scrub_bad(rep.handles, rep.keys)
                except Exception:  # the next pass finds them again
                    log.exception("saria: dropping %d slots the scrub found bad failed",
                                  rep.handles.size)

    def _payload(self, job: SsdWrite) -> tuple[np.ndarray, np.ndarray]:
        """The keys and bytes to write, copied out of DRAM now (a held job's
        slots stay as they are until the core hears it completed)."""
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

    def _write_one(self, item) -> None:
        job, units, payload = item
        handles = np.full(units, -1, np.int64)
        try:
            try:  # the copy and the I/O, outside the cache's lock
                handles = self.ssd.write(*(payload or self._payload(job)))
            except Exception:  # noqa: BLE001 -- a failed write, never a dead writer
                log.exception("saria: SSD write of %d blocks failed", job.keys.shape[0])
            with self._lock:  # the core always hears of it: a held block is never stranded
                self._pending_units -= units
                self._finish(job, handles)
                self._room.notify_all()
        finally:
            self._queue.task_done()
