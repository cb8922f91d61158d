"""``saria replay --mode real``: a trace through the real tiers.

The same requests as the simulated replay go through a real ``TieredCache``
-- the DRAM pool and the O_DIRECT SSD store on a directory -- at a
scaled-down block size, with synthetic KV bytes derived from each block's key
(so every load can be checked byte for byte). Capacities scale with the block
size, so the cache holds the same number of blocks as the simulated one.

Reported next to each other: the SSD bytes the store really wrote (its own
count, and the operating system's ``/proc/self/io`` ``write_bytes``) and what
the simulator predicts for the same policy with no GPU prefix cache (the real
cache has no HBM tier), converted to the real block size.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from saria.keys.trace import trace_block_keys
from saria.runtime import CacheConfig, TieredCache
from saria.sim.engine import Replay
from saria.sim.presets import Preset
from saria.sim.replay import make_setup, open_loop_arrivals
from saria.sim.report import policy_report
from saria.traces import Trace
from saria.traces.arrivals import ArrivalModel


def synthetic_rows(keys: np.ndarray, block_bytes: int) -> np.ndarray:
    """The bytes stored for each block: its key's 64-byte BLAKE2b digest,
    repeated to the block size (with the block's length folded into the
    hash). Any byte of a wrong, stale or torn block differs with probability
    1 - 2^-8 per byte, so a load is verified byte for byte."""
    k = keys.shape[0]
    tag = block_bytes.to_bytes(8, "little")
    dig = np.frombuffer(b"".join(hashlib.blake2b(keys[i].tobytes() + tag, digest_size=64).digest()
                                 for i in range(k)), dtype=np.uint8).reshape(k, 64)
    reps = -(-block_bytes // 64)
    return np.ascontiguousarray(np.tile(dig, (1, reps))[:, :block_bytes])


def os_write_bytes() -> int | None:
    """This process's bytes sent to the storage layer (Linux), or None."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def run_real(trace: Trace, policy: str, preset: Preset, arrivals: ArrivalModel, *,
             block_bytes: int, ssd_dir: Path, dram_bytes: float | None = None,
             ssd_bytes: float | None = None, max_context: int | None = None,
             progress: Callable[[int], None] | None = None) -> dict:
    """Replays `trace` through real tiers; returns real and simulated figures."""
    hw = preset.hardware
    sim_block = preset.block_size * preset.model.kv_bytes_per_token
    scale = block_bytes / sim_block
    dram = hw.dram_bytes if dram_bytes is None else dram_bytes
    ssd = hw.ssd_bytes if ssd_bytes is None else ssd_bytes
    real_dram = int(dram * scale) if math.isfinite(dram) else None
    real_ssd = int(ssd * scale) if math.isfinite(ssd) else None
    if real_dram is None or real_ssd is None:
        raise ValueError("real mode needs finite DRAM and SSD sizes")
    setup = make_setup(policy, preset.with_(gpu_cache_bytes=0), dram_bytes=dram, ssd_bytes=ssd,
                       trace_block_size=int(trace.block_size))
    r = getattr(setup.promotion, "r", None)
    dirs = [str(ssd_dir / f"drive{i}") for i in range(hw.ssd_count)]
    for d in dirs:
        os.makedirs(d, exist_ok=True)
    cfg = CacheConfig(block_bytes=block_bytes, dram_bytes=real_dram,
                      ssd_dirs=tuple(dirs) if real_ssd > 0 else (),
                      ssd_bytes=real_ssd // max(1, hw.ssd_count), admission=policy,
                      promotion=setup.promotion.name.split("(")[0], promotion_r=r,
                      min_victim_age_s=setup.promotion.min_victim_age_s or 0.0,
                      write_mode="sync")
    reqs = open_loop_arrivals(trace, arrivals, max_context)
    bs = preset.block_size
    verified = mismatches = loaded = 0
    os_before = os_write_bytes()
    t0 = time.perf_counter()
    clock_now = [0.0]
    with TieredCache(cfg, clock=lambda: clock_now[0]) as cache:
        for i, a in enumerate(reqs):
            clock_now[0] = max(clock_now[0], a.time)
            keys = trace_block_keys(a.hash_ids, namespace=a.namespace,
                                    trace_block_size=int(trace.block_size),
                                    engine_block_size=bs, num_tokens=a.input_tokens)
            n = keys.shape[0]
            limit = min(n, max(a.input_tokens - 1, 0) // bs)
            plan = cache.lookup(keys)
            hit = min(plan.num_blocks, limit)
            cache.record_access(keys, hits=hit)
            out = np.empty((hit, block_bytes), np.uint8)
            got = cache.load(keys, plan, out, blocks=hit)
            want = synthetic_rows(keys[: got.blocks], block_bytes)
            bad = np.flatnonzero((out[: got.blocks] != want).any(axis=1))
            mismatches += int(bad.size)
            verified += got.blocks
            loaded += got.blocks
            if n > got.blocks:
                cache.store(keys, synthetic_rows(keys[got.blocks:], block_bytes),
                            start=got.blocks, session=a.namespace)
            if got.ssd_positions.size:
                cache.promote(keys, got.ssd_positions, out[got.ssd_positions], got.dram_blocks)
            if progress is not None and (i % 50 == 0 or i == len(reqs) - 1):
                progress(i + 1)
        wall = time.perf_counter() - t0
        st = cache.ssd.stats() if cache.ssd is not None else None
        stats = cache.stats
    os_after = os_write_bytes()
    sim = Replay(setup)
    sim.run(reqs)
    sim_rep = policy_report(sim)
    sim_blocks = sim_rep["ssd_bytes_written"] / sim_block
    return {
        "policy": policy,
        "requests": len(reqs),
        "block_bytes": block_bytes,
        "scale": scale,
        "blocks_loaded": loaded,
        "blocks_verified": verified,
        "mismatched_blocks": mismatches,
        "ssd_read_failures": stats.ssd_read_failures,
        "ssd_write_blocks": stats.ssd_write_blocks,
        "ssd_payload_bytes_written": stats.ssd_write_blocks * block_bytes,
        "ssd_bytes_written_store": None if st is None else int(sum(d["bytes_written"] for d in st["drives"])),
        "ssd_bytes_written_os": None if os_before is None or os_after is None else os_after - os_before,
        "ssd_bytes_written_sim_scaled": int(round(sim_blocks * block_bytes)),
        "sim_ssd_blocks_written": int(round(sim_blocks)),
        "dram_evictions": stats.dram_evictions,
        "dram_evictions_sim": sim_rep["dram_evictions"],
        "writes_dropped": stats.writes_dropped,
        "wall_s": wall,
    }

