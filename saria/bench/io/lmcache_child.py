"""The LMCache side of ``saria bench io``, run by the Python of LMCache's own
virtual environment (LMCache 0.5.6 pins numpy<=2.2.6): the same workload
through its ``fs`` L2 adapter (``FSL2Adapter``, what its multiprocess server
uses for a file-system tier) with O_DIRECT, one task per batch of ``qd``
blocks, each awaited before the next.

    python lmcache_child.py '{"dir": ..., "size": ..., "block": ..., "qd": ..., "salt": ...}'

prints one JSON line: write/read GB/s, blocks that came back wrong, versions.
It imports nothing from saria (saria is not installed in that environment).
"""

import json, mmap, os, shutil, sys, time
os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")
import numpy as np
from importlib.metadata import version
from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import FSL2Adapter, FSL2AdapterConfig


class Obj:
    """Stands in for LMCache's MemoryObj: the adapter reads and fills only .byte_array."""
    def __init__(self, mv):
        self.byte_array = mv


def wait(poll, timeout=3600.0):
    t = time.monotonic()
    while True:
        r = poll()
        if r is not None:
            return r
        if time.monotonic() - t > timeout:
            raise TimeoutError("LMCache task did not complete")
        time.sleep(0.0001)


p = json.loads(sys.argv[1])
base, size, block, qd, salt = p["dir"], p["size"], p["block"], p["qd"], p["salt"]
n = size // block
buf = mmap.mmap(-1, qd * block)  # page-aligned, as O_DIRECT needs
arr = np.frombuffer(buf, np.uint8).reshape(qd, block)
pattern = np.random.default_rng(0).integers(0, 256, size=block, dtype=np.uint8)
headers = np.arange(n, dtype=np.uint64).view(np.uint8).reshape(n, 8)
shutil.rmtree(base, ignore_errors=True)
ad = FSL2Adapter(FSL2AdapterConfig(base_path=base, use_odirect=True))
keys = [ObjectKey(chunk_hash=i.to_bytes(8, "little") + salt.to_bytes(8, "little"),
                  model_name="saria-bench", kv_rank=0) for i in range(n)]
objs = [Obj(memoryview(buf)[j * block:(j + 1) * block]) for j in range(qd)]
arr[:] = pattern
t0 = time.perf_counter()
for s in range(0, n, qd):
    k = min(qd, n - s)
    arr[:k, :8] = headers[s:s + k]
    tid = ad.submit_store_task(keys[s:s + k], objs[:k])
    res = wait(lambda: ad.pop_completed_store_tasks().get(tid))
    if int(res) < 0:
        raise RuntimeError("LMCache store task failed")
t1 = time.perf_counter()
bad = 0
for s in range(0, n, qd):
    k = min(qd, n - s)
    arr[:k, :8] = 0
    tid = ad.submit_load_task(keys[s:s + k], objs[:k])
    bm = wait(lambda: ad.query_load_result(tid))
    bad += k - len(bm.get_indices_list())
    bad += int((arr[:k, :8] != headers[s:s + k]).any(axis=1).sum())
    bad += int(not np.array_equal(arr[0, 8:], pattern[8:]))
t2 = time.perf_counter()
ad.close()
if not p.get("keep"):
    shutil.rmtree(base, ignore_errors=True)
print(json.dumps({"write_gbps": size / (t1 - t0) / 1e9, "read_gbps": size / (t2 - t1) / 1e9,
                  "bad_blocks": bad, "lmcache_version": version("lmcache"),
                  "numpy_version": np.__version__}))
