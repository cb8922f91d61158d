"""``saria replay --mode real``: a trace through the real tiers.

The same ``Replay`` as the simulation drives the same cache core; only the
backend and the mover differ: a real ``TieredCache`` (the DRAM pool and the
O_DIRECT SSD store on a directory) at a scaled-down block size, and
``SyntheticBytes``, which fills every slot the core hands out with bytes
derived from its block's key and checks every load byte for byte.
Capacities are set in blocks, so the real cache holds exactly the blocks the
simulated one does, and every decision (hits, SSD writes, evictions) must
come out the same: the report puts the two side by side.

Reported next to each other: the SSD bytes the store really wrote (its own
count, and the operating system's ``/proc/self/io`` ``write_bytes``) and what
the simulator predicts for the same policy with no GPU prefix cache (the real
cache has no HBM tier), converted to the real block size.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from saria.core import LoadSpec, StateSpec, StoreSpec
from saria.index import Tier, VirtualClock
from saria.runtime import CacheConfig, TieredCache
from saria.sim.engine import Replay, ReplaySetup
from saria.sim.presets import Preset
from saria.sim.replay import make_setup, open_loop_arrivals
from saria.sim.report import policy_report
from saria.tiers.ssd import DATA_OFFSET, slot_bytes_for
from saria.traces import Trace
from saria.traces.arrivals import ArrivalModel

DRAM, SSD = Tier.DRAM, Tier.SSD


def synthetic_rows(keys: np.ndarray, block_bytes: int, tag: bytes = b"") -> np.ndarray:
    """The bytes stored for each block: its key's 64-byte BLAKE2b digest,
    repeated to the block size (with the block's length, and `tag`, folded
    into the hash). Any byte of a wrong, stale or torn block differs with
    probability 1 - 2^-8 per byte, so a load is verified byte for byte."""
    k = keys.shape[0]
    tag = block_bytes.to_bytes(8, "little") + tag
    dig = np.frombuffer(b"".join(hashlib.blake2b(keys[i].tobytes() + tag, digest_size=64).digest()
                                 for i in range(k)), dtype=np.uint8).reshape(k, 64)
    reps = -(-block_bytes // 64)
    return np.ascontiguousarray(np.tile(dig, (1, reps))[:, :block_bytes])


def synthetic_state(key: np.ndarray, units: int, block_bytes: int) -> np.ndarray:
    """The bytes of a hybrid model's state checkpoint after block `key`."""
    return np.concatenate([synthetic_rows(key[None, :], block_bytes, b"state%d" % i)
                           for i in range(units)])


class SyntheticBytes:
    """The real-mode mover: fills the slots the core hands out with synthetic
    bytes and verifies every block and state it reads back."""

    def __init__(self, cache: TieredCache) -> None:
        self.cache = cache
        self.block_bytes = cache.cfg.block_bytes
        self.units = cache.cfg.state_units
        self.verified = self.mismatched = 0
        self.states_verified = self.state_failures = 0
        self._loaded: tuple[np.ndarray, np.ndarray] | None = None  # (path, rows) of the last load

    def load(self, spec: LoadSpec) -> np.ndarray:
        out = np.zeros((spec.num_blocks, self.block_bytes), np.uint8)
        failed = self.cache.read(spec, out)
        good = np.setdiff1d(np.arange(spec.start, spec.num_blocks), failed)
        want = synthetic_rows(spec.path[good], self.block_bytes)
        self.mismatched += int(np.count_nonzero((out[good] != want).any(axis=1)))
        self.verified += int(good.size)
        self._loaded = (spec.path, out)
        ck = spec.checkpoint
        if ck is not None and ck.tier in (DRAM, SSD):
            key = spec.path[ck.boundary - 1]
            state = self.cache.backend.read_state(ck.tier, ck.slot, key)
            if state is None:
                self.state_failures += 1
            else:
                self.states_verified += 1
                self.mismatched += int(not np.array_equal(
                    state, synthetic_state(key, self.units, self.block_bytes)))
        return failed

    def store(self, spec: StoreSpec) -> bool:
        if spec.num_blocks:
            self.cache.backend.pool.scatter(spec.slots, synthetic_rows(spec.keys, self.block_bytes))
        return True

    def direct_rows(self, spec: StoreSpec) -> np.ndarray:
        return synthetic_rows(spec.direct_keys, self.block_bytes)

    def promote(self, spec: StoreSpec) -> bool:
        """Promoted blocks are copied from the bytes the load read."""
        if spec.num_blocks == 0:
            return True
        path, rows = self._loaded
        if path.shape[0] <= int(spec.positions[-1]) or \
                not np.array_equal(path[spec.positions], spec.keys):
            return False  # not what the last load read: nothing to copy from
        self.cache.backend.pool.scatter(spec.slots, rows[spec.positions])
        return True

    def checkpoint(self, spec: StateSpec) -> bool:
        if spec.dram_handle is not None:
            slots = self.cache.backend.state_slots(spec.dram_handle)
            self.cache.backend.pool.scatter(
                slots, synthetic_state(spec.path[-1], self.units, self.block_bytes))
        return True


def os_write_bytes() -> int | None:
    """This process's bytes sent to the storage layer (Linux), or None."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def real_cache_config(setup: ReplaySetup, policy: str, block_bytes: int,
                      ssd_dirs: list[str]) -> CacheConfig:
    """The ``TieredCache`` settings that hold exactly the blocks the
    simulated replay of `setup` holds, at `block_bytes` per block."""
    caps = setup.capacities()
    if max(caps[DRAM], caps[SSD]) >= 1 << 40:
        raise ValueError("real mode needs finite DRAM and SSD sizes")
    per_drive = caps[SSD] // max(1, len(ssd_dirs))
    promotion = setup.promotion
    return CacheConfig(
        block_bytes=block_bytes, dram_bytes=caps[DRAM] * block_bytes,
        ssd_dirs=tuple(ssd_dirs) if per_drive else (),
        ssd_bytes=DATA_OFFSET + per_drive * slot_bytes_for(block_bytes) if per_drive else 0,
        admission=policy, promotion=promotion.kind, promotion_r=getattr(promotion, "r", None),
        min_victim_age_s="auto" if promotion.wants_returns else (promotion.min_victim_age_s or 0.0),
        write_mode="sync",
        max_blocks=setup.metadata_budget(), state_bytes=setup.state_units * block_bytes,
        record_writes=True, dwpd=setup.preset.hardware.dwpd)


def run_real(trace: Trace, policy: str, preset: Preset, arrivals: ArrivalModel, *,
             block_bytes: int, ssd_dir: Path, dram_bytes: float | None = None,
             ssd_bytes: float | None = None, max_context: int | None = None,
             progress: Callable[[int], None] | None = None) -> dict:
    """Replays `trace` through real tiers and through the simulator; returns
    both sets of figures and whether every decision agreed."""
    preset = preset.with_(gpu_cache_bytes=0)

    def setup() -> ReplaySetup:  # fresh policy objects per run (some keep state)
        return make_setup(policy, preset, dram_bytes=dram_bytes, ssd_bytes=ssd_bytes,
                          trace_block_size=int(trace.block_size))

    dirs = [str(ssd_dir / f"drive{i}") for i in range(preset.hardware.ssd_count)]
    for d in dirs:
        os.makedirs(d, exist_ok=True)
    reqs = open_loop_arrivals(trace, arrivals, max_context)
    real_setup = setup()
    cfg = real_cache_config(real_setup, policy, block_bytes, dirs)
    os_before = os_write_bytes()
    t0 = time.perf_counter()
    clock = VirtualClock()
    with TieredCache(cfg, clock=clock) as cache:
        mover = SyntheticBytes(cache)
        real = Replay(real_setup, cache=cache, mover=mover, clock=clock)
        real.run(reqs, progress)
        wall = time.perf_counter() - t0
        st = cache.backend.ssd.stats() if cache.backend.ssd is not None else None
        stats = cache.stats
    os_after = os_write_bytes()
    sim = Replay(setup())
    sim.run(reqs)
    sim_rep = policy_report(sim)
    sim_block = real_setup.block_bytes
    sim_blocks = sim.cache.stats.ssd_write_blocks
    return {
        "policy": policy,
        "requests": len(reqs),
        "block_bytes": block_bytes,
        "scale": block_bytes / sim_block,
        "blocks_loaded": mover.verified,
        "blocks_verified": mover.verified,
        "mismatched_blocks": mover.mismatched,
        "states_verified": mover.states_verified,
        "ssd_read_failures": stats.ssd_read_failures,
        "ssd_write_blocks": stats.ssd_write_blocks,
        "ssd_payload_bytes_written": stats.ssd_write_blocks * block_bytes,
        "ssd_bytes_written_store": None if st is None else int(st["total"]["bytes_written"]),
        "ssd_bytes_written_os": None if os_before is None or os_after is None else os_after - os_before,
        "ssd_bytes_written_sim_scaled": sim_blocks * block_bytes,
        "sim_ssd_blocks_written": sim_blocks,
        "sim_ssd_bytes_written": sim_rep["ssd_bytes_written"],
        "dram_evictions": stats.dram_evictions,
        "dram_evictions_sim": sim.cache.stats.dram_evictions,
        "hits_equal_sim": real.stats.hit_blocks == sim.stats.hit_blocks,
        "writes_dropped": stats.writes_dropped,
        "wall_s": wall,
    }
