"""saria's side of the measurement: the SSD store written and read from a DRAM
pool, and the pool's scatter/gather beside a plain memcpy."""

from __future__ import annotations

import mmap
import shutil
import time

import numpy as np

from saria.bench.io.config import BenchIoError, IoBenchConfig, gbps as _gbps


def _store_slot_bytes(block: int) -> int:
    try:
        from saria.tiers.ssd import slot_bytes_for

        return int(slot_bytes_for(block))
    except (ImportError, AttributeError):
        return -(-(64 + block) // 4096) * 4096


def _aligned_buffer(nbytes: int) -> tuple[mmap.mmap, np.ndarray]:
    """Page-aligned anonymous memory, with the same huge-page advice as the DRAM pool, so the
    memcpy baseline and the pool copy over the same kind of pages."""
    m = mmap.mmap(-1, nbytes)
    if hasattr(mmap, "MADV_HUGEPAGE") and nbytes >= 2 << 20:
        try:
            m.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    return m, np.frombuffer(m, dtype=np.uint8)


def _block_keys(n: int, salt: int) -> np.ndarray:
    """(n, 32) uint8 keys: block index and a per-repeat salt (distinct across repeats)."""
    keys = np.zeros((n, 32), dtype=np.uint8)
    keys[:, :8] = np.arange(n, dtype=np.uint64).view(np.uint8).reshape(n, 8)
    keys[:, 8:16] = np.full(n, salt, dtype=np.uint64).view(np.uint8).reshape(n, 8)
    keys[:, 16:] = 0x5A
    return keys


class SariaSsdRunner:
    """Writes then reads the workload through ``SsdStore`` from / into a DramPool."""

    def __init__(self, cfg: IoBenchConfig) -> None:
        from saria.tiers.dram import DramPool
        from saria.tiers.ssd import SsdStore  # may not exist yet: the caller catches ImportError

        self.cfg = cfg
        self.SsdStore = SsdStore
        self.pool = DramPool(cfg.qd, cfg.block)
        self.handles = self.pool.alloc(cfg.qd)
        self.slots = self.pool.array[self.handles[0]:self.handles[0] + cfg.qd]  # contiguous
        rng = np.random.default_rng(0)
        self.pattern = rng.integers(0, 256, size=cfg.block, dtype=np.uint8)
        self.store = None
        self.store_handles: np.ndarray | None = None
        self.keys: np.ndarray | None = None
        self.device_bytes_written: int | None = None

    def _open(self, repeat: int) -> None:
        """One store for every repeat, like fio's one file: the first repeat
        writes fresh (fallocated) space, later ones overwrite freed slots --
        the steady state of a long-lived cache, and what fio's later repeats
        do to its file."""
        if self.store is not None:
            if self.store_handles is not None:
                self.store.free(self.store_handles)
                self.store_handles = None
            return
        cfg = self.cfg
        d = cfg.dir / "saria-bench-ssd"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        # Each block takes one slot (a 64-byte header + the payload, rounded up to 4 KiB) after
        # a 4 KiB superblock; room for exactly the workload.
        slot = _store_slot_bytes(cfg.block)
        capacity = 4096 + cfg.num_blocks * slot
        self.dir = d
        self.store = self.SsdStore([d], capacity_bytes=capacity, block_bytes=cfg.block)

    def write(self, repeat: int) -> float:
        cfg = self.cfg
        self._open(repeat)
        n, qd = cfg.num_blocks, cfg.qd
        self.keys = _block_keys(n, repeat)
        handles = np.empty(n, dtype=np.int64)
        headers = np.arange(n, dtype=np.uint64).view(np.uint8).reshape(n, 8)
        self.slots[:] = self.pattern
        t0 = time.perf_counter()
        for s in range(0, n, qd):
            k = min(qd, n - s)
            self.slots[:k, :8] = headers[s:s + k]  # each block's bytes differ
            h = self.store.write(self.keys[s:s + k], self.slots[:k])
            handles[s:s + k] = h
        # No sync(): like fio --direct=1, a write counts once its O_DIRECT pwrite completed
        # (the store returns a handle only then).
        dt = time.perf_counter() - t0
        if (handles < 0).any():
            raise BenchIoError(f"SsdStore.write failed for {int((handles < 0).sum())} blocks")
        self.store_handles = handles
        return _gbps(cfg.size, dt)

    def read(self) -> float:
        cfg = self.cfg
        n, qd = cfg.num_blocks, cfg.qd
        want = np.arange(n, dtype=np.uint64)
        bad = 0
        t0 = time.perf_counter()
        for s in range(0, n, qd):
            k = min(qd, n - s)
            self.slots[:k, :8] = 0
            ok = self.store.read(self.store_handles[s:s + k], self.keys[s:s + k], self.slots[:k])
            ok = np.asarray(ok, dtype=bool)
            got = self.slots[:k, :8].copy().view(np.uint64).reshape(k)
            bad += int((~ok).sum()) + int((got != want[s:s + k]).sum())
            if not np.array_equal(self.slots[0, 8:], self.pattern[8:]):
                bad += 1
        dt = time.perf_counter() - t0
        if bad:
            raise BenchIoError(f"SsdStore.read returned {bad} failed or wrong blocks")
        return _gbps(cfg.size, dt)

    def _close(self) -> None:
        if self.store is not None:
            try:
                st = self.store.stats()
                self.device_bytes_written = int(sum(d.get("bytes_written", 0)
                                                    for d in st.get("drives", [])))
            except Exception:  # noqa: BLE001 -- stats are informative only
                pass
            self.store.close()
            self.store = None
        if not self.cfg.keep_files:
            shutil.rmtree(self.dir, ignore_errors=True)

    def close(self) -> None:
        try:
            self._close()
        except Exception:  # noqa: BLE001
            pass
        self.pool.close()


def dram_round(src: np.ndarray, dst: np.ndarray, pool, handles: np.ndarray) -> dict[str, float]:
    """One round of memcpy, scatter and gather over the same bytes; GB/s each."""
    nbytes = src.nbytes
    out = {}
    t0 = time.perf_counter()
    np.copyto(dst, src)
    out["memcpy"] = _gbps(nbytes, time.perf_counter() - t0)
    t0 = time.perf_counter()
    pool.scatter(handles, src)
    out["scatter"] = _gbps(nbytes, time.perf_counter() - t0)
    t0 = time.perf_counter()
    pool.gather(handles, dst)
    out["gather"] = _gbps(nbytes, time.perf_counter() - t0)
    return out
