"""LMCache's multiprocess StorageManager in-process, driven request by
request the way its server drives it: for the tests of the adapter and
for ``experiments/10_lmcache_adapter.py``.

A request is a list of chunk hashes (prefix-chained, as LMCache's are).
``MPDriver.request`` prefetches them (LMCache looks in L1, then asks every
L2 adapter -- lookup and lock, load of the planned hits into L1), reads
the hit prefix, then writes the chunks after it into L1, which the store
controller mirrors to every L2 adapter. No engine, no GPU: the chunk bytes
come from a caller's function, so a test can check what comes back.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from lmcache.v1.distributed.api import (GroupedObjectKeys, MemoryLayoutDesc, ObjectKey,
                                        PrefetchTaskSpec)
from lmcache.v1.distributed.config import (EvictionConfig, L1ManagerConfig,
                                           L1MemoryManagerConfig, StorageManagerConfig)
from lmcache.v1.distributed.internal_api import L2AdapterListener
from lmcache.v1.distributed.l2_adapters.config import parse_args_to_l2_adapters_config
from lmcache.v1.distributed.storage_manager import StorageManager


def layout(chunk_bytes: int) -> MemoryLayoutDesc:
    """A one-tensor uint8 layout of `chunk_bytes` per chunk."""
    return MemoryLayoutDesc(shapes=[torch.Size([chunk_bytes])], dtypes=[torch.uint8])


def storage_manager(l2_adapter: dict, l1_bytes: int, *, watermark: float = 0.8,
                    ratio: float = 0.2) -> StorageManager:
    """An MP StorageManager with an `l1_bytes` DRAM L1 (LRU eviction above
    `watermark`) and one L2 adapter given as ``--l2-adapter``'s JSON."""
    l1 = L1ManagerConfig(memory_config=L1MemoryManagerConfig(
        size_in_bytes=l1_bytes, use_lazy=False, align_bytes=4096, shm_name=""))
    l2 = parse_args_to_l2_adapters_config(argparse.Namespace(l2_adapter=[json.dumps(l2_adapter)]))
    return StorageManager(StorageManagerConfig(
        l1_manager_config=l1, eviction_config=EvictionConfig("LRU", watermark, ratio),
        l2_adapter_config=l2))


def l2_adapter(sm: StorageManager):
    """The (only) L2 adapter a ``storage_manager`` built."""
    adapters = list(sm._l2_adapters.values())  # LMCache 0.5.6 keeps no public accessor
    if len(adapters) != 1:
        raise RuntimeError(f"expected one L2 adapter, found {len(adapters)}")
    return adapters[0]


class StoreCounter(L2AdapterListener):
    """What the L2 adapters report held: ``stored`` maps the keys stored and
    not deleted since to their sizes; ``deleted`` counts deletions."""

    def __init__(self) -> None:
        self.stored: dict[ObjectKey, int] = {}
        self.deleted = 0
        self.cv = threading.Condition()

    def on_l2_keys_stored(self, keys, sizes) -> None:
        with self.cv:
            for k, n in zip(keys, sizes):
                self.stored[k] = n
            self.cv.notify_all()

    def on_l2_keys_accessed(self, keys) -> None:
        pass

    def on_l2_keys_deleted(self, keys) -> None:
        with self.cv:
            self.deleted += len(keys)
            for k in keys:
                self.stored.pop(k, None)


@dataclass
class RequestResult:
    l1_hits: int
    l2_hits: int
    written: int       # chunks written into L1 after the hit prefix
    mismatched: int    # hit chunks whose bytes were not the ones stored


class MPDriver:
    """Requests through a StorageManager; `fill(chunk_hash, out)` writes a
    chunk's bytes (the same every time for the same hash)."""

    def __init__(self, sm: StorageManager, chunk_bytes: int,
                 fill: Callable[[bytes, np.ndarray], None], *, model: str = "saria-bench",
                 verify: bool = True, timeout_s: float = 60.0) -> None:
        self.sm = sm
        self.layout = layout(chunk_bytes)
        self.chunk_bytes = chunk_bytes
        self.fill = fill
        self.model = model
        self.verify = verify
        self.timeout_s = timeout_s
        self._rank = ObjectKey.ComputeKVRank(1, 0, 1, 0)
        self._n = 0
        self.written = 0   # chunks written into L1 so far (each goes to every L2 adapter)

    def key(self, chunk_hash: bytes) -> ObjectKey:
        return ObjectKey(chunk_hash=chunk_hash, model_name=self.model, kv_rank=self._rank)

    def request(self, chunk_hashes: list[bytes]) -> RequestResult:
        keys = [self.key(h) for h in chunk_hashes]
        if not keys:
            return RequestResult(0, 0, 0, 0)
        self._n += 1
        spec = PrefetchTaskSpec(key_groups=[GroupedObjectKeys(keys, 0, self.layout)],
                                fetching_policy="prefix")
        handle = self.sm.submit_prefetch_task(spec, external_request_id=f"r{self._n}")
        if not self.sm.wait_prefetch_status(handle, timeout=self.timeout_s):
            raise TimeoutError(f"prefetch of request {self._n} did not finish in {self.timeout_s} s")
        res = self.sm.query_prefetch_status(handle)
        hit = res.hit_cells[0]
        n = hit.count_leading_ones()
        l1 = sum(1 for i in range(n) if res.l1_hit_cells[0].test(i))
        held = [keys[i] for i in hit.get_indices_list()]
        bad = 0
        if held:
            with self.sm.read_prefetched_results(held) as objs:
                if self.verify and objs is not None:
                    want = np.empty(self.chunk_bytes, np.uint8)
                    for k, o in zip(held, objs):
                        self.fill(k.chunk_hash, want)
                        bad += not np.array_equal(np.frombuffer(o.byte_array, np.uint8), want)
            self.sm.finish_read_prefetched(held)
        written = self._write(keys[n:])
        return RequestResult(l1, n - l1, written, bad)

    def _write(self, keys: list[ObjectKey]) -> int:
        if not keys:
            return 0
        evict_l1_now(self.sm)
        objs = self.sm.reserve_write(keys, self.layout)
        for k, o in objs.items():
            self.fill(k.chunk_hash, np.frombuffer(o.byte_array.cast("B"), np.uint8))
        done = [k for k in keys if k in objs]
        if done:
            self.sm.finish_write(done)
        self.written += len(done)
        return len(done)

    def wait_idle(self, counter: StoreCounter, want: set, timeout_s: float = 60.0) -> bool:
        """Waits until the adapter reported every key of `want` stored."""
        end = time.monotonic() + timeout_s
        with counter.cv:
            return counter.cv.wait_for(lambda: want <= counter.stored.keys(),
                                       max(0.0, end - time.monotonic()))


def evict_l1_now(sm: StorageManager) -> None:
    """One round of LMCache's L1 eviction now, as its controller thread does
    once a second (``L1EvictionController.eviction_loop``): a replay faster
    than that would otherwise find L1 full and drop writes."""
    ctrl = sm._eviction_controller
    used, total = ctrl._l1_manager.get_memory_usage()
    cfg = ctrl._eviction_config
    if total and used / total >= cfg.trigger_watermark:
        for action in ctrl._eviction_policy.get_eviction_actions(
                cfg.eviction_ratio, key_eligible_filter=ctrl._l1_manager.is_key_evictable):
            ctrl.execute_eviction_action(action)


def fill_from_hash(chunk_hash: bytes, out: np.ndarray) -> None:
    """Deterministic bytes of a chunk: its hash, then the hash of that, ...,
    tiled (distinct per chunk, cheap enough for a replay of many chunks)."""
    seed = hashlib.sha256(chunk_hash).digest() + hashlib.sha512(chunk_hash).digest()
    out[:] = np.resize(np.frombuffer(seed, np.uint8), out.size)
