"""``saria bench serve``: what a node's shared cache costs over the wire.

1. **Lookup round trip**: ``lookup`` of 8 / 128 / 1024 block keys through
   ``RemoteCache`` to a ``saria serve`` process (ipc), against the same call
   on an in-process ``TieredCache`` holding the same blocks; p50 and p99 of
   ``--calls`` calls each.
2. **Load test**: ``--clients`` processes, each a ``RemoteCache`` in a loop of
   lookup -> prepare/complete load or prepare/complete store (a store fills
   its slots in the shared pool) over its own and the others' prefixes, for
   ``--seconds``; reports calls per second and the server's RSS and open
   sessions sampled every second, so a leak shows as a slope.

Both start their own server in a temporary directory and stop it at the end.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import psutil

from saria.keys import BlockHasher, keys_to_array

SLOT = 64 << 10
LAYOUT = dict(model="bench", dtype="bfloat16", block_size=16, page_bytes=SLOT, num_layers=1,
              tp_size=1, kv_layout="default", hash_algo="sha256_cbor", hash_seed="bench",
              slot_bytes=SLOT)


def chain(seed: int, n: int) -> np.ndarray:
    return keys_to_array(BlockHasher(16, seed="bench").block_keys(
        [seed * 1_000_000 + i for i in range(16 * n)]))


def start_server(tmp: str, dram: int) -> tuple[subprocess.Popen, str]:
    from saria.serve.client import ServerUnavailable, server_stats

    address = f"ipc://{tmp}/serve.sock"
    log = open(os.path.join(tmp, "serve.log"), "w")
    proc = subprocess.Popen([sys.executable, "-m", "saria.cli.main", "serve", "--dram", str(dram),
                             "--listen", address, "--lease", "5"], stdout=log, stderr=log)
    for _ in range(300):
        try:
            server_stats(address, 0.2)
            return proc, address
        except ServerUnavailable:
            if proc.poll() is not None:
                raise RuntimeError("saria serve exited at start; see " + log.name)
    raise RuntimeError("saria serve did not answer")


def _pct(xs: list[float]) -> tuple[float, float]:
    a = np.asarray(xs) * 1e6
    return float(np.percentile(a, 50)), float(np.percentile(a, 99))


def lookup_rtt(calls: int = 2000, sizes=(8, 128, 1024)) -> list[dict]:
    from saria.runtime.cache import CacheConfig, TieredCache
    from saria.serve.client import RemoteCache

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        proc, address = start_server(tmp, 2200 * SLOT)
        try:
            remote = RemoteCache(address, LAYOUT, name="bench", heartbeat=False)
            local = TieredCache(CacheConfig(block_bytes=SLOT, dram_bytes=2200 * SLOT, pin=False))
            for n in sizes:
                keys = chain(n, n)
                for cache in (remote, local):  # the same blocks in both, in DRAM
                    spec = cache.prepare_store(keys, 0)
                    cache.complete_store(spec)
                for name, cache in (("in-process", local), ("saria serve", remote)):
                    times = []
                    for _ in range(calls):
                        t0 = time.perf_counter()
                        plan = cache.lookup(keys)
                        times.append(time.perf_counter() - t0)
                    assert plan.num_blocks == n
                    p50, p99 = _pct(times)
                    rows.append({"keys": n, "path": name, "p50_us": p50, "p99_us": p99})
            remote.close()
            local.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    return rows


def _client(address: str, idx: int, clients: int, seconds: float, out) -> None:
    from saria.serve.client import RemoteCache

    c = RemoteCache(address, LAYOUT, name=f"load{idx}")
    pool = np.memmap(c.info["pool"], np.uint8, "r+",
                     shape=(c.info["pool_slots"], c.info["slot_bytes"]))
    rng = np.random.default_rng(idx)
    prefixes = [chain(1000 * i + j, 32) for i in range(clients) for j in range(8)]
    calls = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        keys = prefixes[rng.integers(len(prefixes))][: rng.integers(4, 33)]
        n = c.lookup(keys).num_blocks
        calls += 1
        if n:
            spec = c.prepare_load(keys, n)
            c.complete_load(spec)
            calls += 2
        else:
            spec = c.prepare_store(keys, 0)
            pool[spec.slots, :8] = 1  # the worker's copy, in short
            c.complete_store(spec)
            calls += 2
    c.close()
    out.put(calls)


def load_test(clients: int = 4, seconds: float = 600.0, progress=None) -> dict:
    from saria.serve.client import server_stats

    with tempfile.TemporaryDirectory() as tmp:
        proc, address = start_server(tmp, 256 * SLOT)  # smaller than the prefixes: evictions
        try:
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            procs = [ctx.Process(target=_client, args=(address, i, clients, seconds, q))
                     for i in range(clients)]
            for p in procs:
                p.start()
            srv = psutil.Process(proc.pid)
            samples = []
            t0 = time.monotonic()
            while any(p.is_alive() for p in procs):
                time.sleep(1.0)
                snap = server_stats(address, 5.0)
                samples.append((time.monotonic() - t0, srv.memory_info().rss, snap["sessions"]))
                if progress:
                    progress(min(time.monotonic() - t0, seconds), seconds)
            total = sum(q.get(timeout=10) for _ in procs)
            for p in procs:
                p.join()
            time.sleep(0.5)
            final = server_stats(address, 5.0)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    rss = [s[1] for s in samples]
    half = len(rss) // 2
    return {"clients": clients, "seconds": seconds, "calls": total,
            "calls_per_s": total / seconds,
            "rss_first_half_mib": float(np.median(rss[:max(half, 1)])) / 2**20,
            "rss_second_half_mib": float(np.median(rss[half:])) / 2**20,
            "rss_end_mib": rss[-1] / 2**20 if rss else 0.0,
            "sessions_during": max((s[2] for s in samples), default=0),
            "sessions_end": final["sessions"], "leases_expired": final["leases_expired"],
            "rpc_errors": final["rpc_errors"]}
