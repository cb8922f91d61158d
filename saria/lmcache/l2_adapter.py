"""``SariaL2Adapter``: saria as an L2 adapter of LMCache's multiprocess server.

LMCache 0.5.6 mirrors every chunk that lands in its L1 to every L2 adapter
at once; this one takes the chunks into saria's DRAM buffer and lets saria's
admission decide which of them are worth an SSD write as the buffer evicts
them (``chunks.py`` says how LMCache's calls map onto block history, and what
they do not show). Stores run on one thread in the order LMCache submits
them, lookups and loads on a small pool beside it; each kind of task signals
its own event fd, as LMCache's controllers expect.

Byte accounting: LMCache's usage counts a chunk from the moment saria holds
it (DRAM buffer or SSD) until it leaves saria, reported with the key LMCache
stored it under; chunks recovered from the drives after a restart are served
but not counted (LMCache's key is not on the drive, only its digest). The
adapter declares no capacity to LMCache: saria evicts by itself (the SSD
tier's LRU), so LMCache's global L2 eviction stays off for it (a per-salt
quota policy may still call ``delete``). Locks have no lease: a lookup
LMCache never unlocks (it aborted a request mid-way) keeps its chunks until
the adapter closes.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from lmcache.lmcache_native import Bitmap
from lmcache.logging import init_logger
from lmcache.v1.distributed.internal_api import L2StoreResult
from lmcache.v1.distributed.l2_adapters.base import L2AdapterInterface, L2TaskId
from lmcache.v1.distributed.l2_adapters.config import L2AdapterConfigBase
from lmcache.v1.platform import create_event_notifier

from saria.lmcache import params as _params
from saria.lmcache.chunks import ChunkStore
from saria.lmcache.params import AdapterParams

if TYPE_CHECKING:
    from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey
    from lmcache.v1.memory_management import MemoryObj

logger = init_logger(__name__)


def object_key_digest(key: "ObjectKey") -> bytes:
    """saria's 32-byte block key for an LMCache ``ObjectKey``: sha256 over
    every field that tells two chunks apart (length-prefixed, so no two keys
    share an encoding)."""
    h = hashlib.sha256(b"saria.lmcache.ObjectKey/1")
    for part in (key.model_name.encode(), key.cache_salt.encode(), bytes(key.chunk_hash)):
        h.update(len(part).to_bytes(4, "little"))
        h.update(part)
    h.update(int(key.kv_rank).to_bytes(8, "little", signed=True))
    h.update(int(key.object_group_id).to_bytes(8, "little", signed=True))
    return h.digest()


class SariaL2AdapterConfig(L2AdapterConfigBase):
    """``adapter_params`` of the plugin, checked by ``AdapterParams``."""

    def __init__(self, params: AdapterParams) -> None:
        self.params = params

    @classmethod
    def from_dict(cls, d: dict) -> "SariaL2AdapterConfig":
        return cls(AdapterParams.from_dict(d))

    @classmethod
    def help(cls) -> str:
        return _params.__doc__ or ""


class SariaL2Adapter(L2AdapterInterface):
    """LMCache L2 adapter over a ``ChunkStore``; thread-safe."""

    def __init__(self, config: SariaL2AdapterConfig | dict, l1_memory_desc=None) -> None:
        super().__init__(max_capacity_bytes=0)
        if not isinstance(config, SariaL2AdapterConfig):
            config = SariaL2AdapterConfig.from_dict(config)
        self.store = ChunkStore(config.params, backpressure=True)  # stores have a thread of their own
        self._store_efd = create_event_notifier()
        self._lookup_efd = create_event_notifier()
        self._load_efd = create_event_notifier()
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._stores: dict[L2TaskId, L2StoreResult] = {}
        self._lookups: dict[L2TaskId, Bitmap] = {}
        self._loads: dict[L2TaskId, Bitmap] = {}
        self._names: dict[bytes, tuple[ObjectKey, int]] = {}  # digest -> (key, bytes) held
        # Stores run one at a time, in LMCache's order (the buffer's LRU order
        # is what admission judges); lookups and loads beside them.
        self._store_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="saria-l2-store")
        self._pool = ThreadPoolExecutor(max_workers=3, thread_name_prefix="saria-l2")
        self._closed = False
        p = config.params
        logger.info("saria L2 adapter: %s, %d B on %d drive(s) %s, DRAM buffer %d B, chunk %s",
                    p.admission, p.capacity_bytes, len(p.dirs), list(p.dirs), p.dram_bytes,
                    self.store.chunk_bytes or "from the first store")

    # ------------------------------------------------------------ event fds

    def get_store_event_fd(self) -> int:
        return self._store_efd.fileno()

    def get_lookup_and_lock_event_fd(self) -> int:
        return self._lookup_efd.fileno()

    def get_load_event_fd(self) -> int:
        return self._load_efd.fileno()

    # ---------------------------------------------------------------- tasks

    def submit_store_task(self, keys: list[ObjectKey], objects: list[MemoryObj]) -> L2TaskId:
        task = next(self._ids)
        self._store_pool.submit(self._run_store, task, list(keys), list(objects))
        return task

    def pop_completed_store_tasks(self) -> dict[L2TaskId, L2StoreResult]:
        with self._lock:
            out, self._stores = self._stores, {}
        return out

    def submit_lookup_and_lock_task(self, keys: list[ObjectKey],
                                    group_layout_descs: dict[int, MemoryLayoutDesc]) -> L2TaskId:
        task = next(self._ids)
        self._pool.submit(self._run_lookup, task, list(keys))
        return task

    def query_lookup_and_lock_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._lock:
            return self._lookups.pop(task_id, None)

    def submit_unlock(self, keys: list[ObjectKey]) -> None:
        try:
            self.store.unlock([object_key_digest(k) for k in keys])
        except Exception:  # the caller never retries: an unlock must not raise
            logger.exception("saria L2 adapter: unlock failed")

    def submit_load_task(self, keys: list[ObjectKey], objects: list[MemoryObj]) -> L2TaskId:
        task = next(self._ids)
        self._pool.submit(self._run_load, task, list(keys), list(objects))
        return task

    def query_load_result(self, task_id: L2TaskId) -> Bitmap | None:
        with self._lock:
            return self._loads.pop(task_id, None)

    def delete(self, keys: list[ObjectKey]) -> None:
        """LMCache's L2 eviction (a per-cache_salt quota policy; saria declares
        no capacity, so LMCache's global eviction stays off): the chunks leave
        saria unless a lookup holds them."""
        self.store.remove([object_key_digest(k) for k in keys])
        self._publish()

    def report_status(self) -> dict:
        st = self.store.status()
        healthy = not st.get("ssd_slots") or st.get("ssd_failed_drives", 0) < len(self.store.params.dirs)
        return {"is_healthy": bool(healthy), "type": "SariaL2Adapter", **st}

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._store_pool.shutdown(wait=True)
        self._pool.shutdown(wait=True)
        self.store.close()
        for efd in (self._store_efd, self._lookup_efd, self._load_efd):
            efd.close()

    # -------------------------------------------------------------- helpers

    def _run_store(self, task: L2TaskId, keys: list, objects: list) -> None:
        ok, taken = False, 0
        try:
            digests = [object_key_digest(k) for k in keys]
            bufs = [o.byte_array for o in objects]
            with self._lock:  # named before put(): a concurrent _publish may see them enter
                new = {d for d in digests if d not in self._names}
                for d, k, b in zip(digests, keys, bufs):
                    self._names.setdefault(d, (k, len(b)))
            sizes = self.store.put(digests, bufs)
            taken = sum(sizes)
            with self._lock:
                for d, n in zip(digests, sizes):
                    if not n and d in new:
                        self._names.pop(d, None)
            ok = True
            self._publish()
        except Exception:
            logger.exception("saria L2 adapter: store task %d failed", task)
        finally:  # LMCache waits for every task's result: it always comes
            with self._lock:
                self._stores[task] = L2StoreResult(ok, taken)
            self._store_efd.notify()

    def _run_lookup(self, task: L2TaskId, keys: list) -> None:
        bitmap = Bitmap(len(keys))
        try:
            for i, hit in enumerate(self.store.lookup_lock([object_key_digest(k) for k in keys])):
                if hit:
                    bitmap.set(i)
        except Exception:  # lookup_lock released what it locked: all misses
            logger.exception("saria L2 adapter: lookup task %d failed", task)
            bitmap = Bitmap(len(keys))
        finally:
            with self._lock:
                self._lookups[task] = bitmap
            self._lookup_efd.notify()

    def _run_load(self, task: L2TaskId, keys: list, objects: list) -> None:
        bitmap = Bitmap(len(keys))
        try:
            got = self.store.get([object_key_digest(k) for k in keys],
                                 [o.byte_array for o in objects])
            for i, ok in enumerate(got):
                if ok:
                    bitmap.set(i)
            loaded = [keys[i] for i in bitmap.get_indices_list()]
            if loaded:
                self._notify_keys_accessed(loaded)
        except Exception:
            logger.exception("saria L2 adapter: load task %d failed", task)
        finally:
            with self._lock:
                self._loads[task] = bitmap
            self._load_efd.notify()

    def _publish(self) -> None:
        """LMCache's accounting follows saria's residency: chunks that entered
        saria are stored, ones that left it (admission dropped them from the
        buffer, the SSD evicted them) are deleted."""
        ch = self.store.take_changes()
        if not ch.added and not ch.removed:
            return
        with self._lock:
            added = [self._names[d] for d in ch.added if d in self._names]
            removed = [self._names.pop(d) for d in ch.removed if d in self._names]
        if added:
            self._notify_keys_stored([k for k, _ in added], [n for _, n in added])
        if removed:
            self._notify_keys_deleted([k for k, _ in removed], [n for _, n in removed])
