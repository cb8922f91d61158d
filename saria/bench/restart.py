"""``saria bench restart``: how long a filled SSD store takes to reopen, and
what it reads, from its journal against today's full and header scans.

For each size a store of one drive is created under ``dir``, filled with
blocks (every slot), closed, then reopened ``repeat`` times in each mode, the
modes taking turns in every round: ``journal`` (the default open),
``header`` (a scan of every slot header) and ``full`` (a scan of every slot,
both crcs). Each open is timed from the constructor's call to its return;
``recovery_bytes_read`` is what the store read at open. The three modes must
recover the same set of blocks (keys and handles), or the bench fails. The
store is removed before the next size (one store on the disk at a time).
"""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from saria.errors import ConfigError

MODES = ("journal", "header", "full")


@dataclass(frozen=True, slots=True)
class RestartBenchConfig:
    dir: Path
    sizes: tuple[int, ...] = (1 << 30, 8 << 30, 32 << 30)
    block_bytes: int = 1 << 20
    repeat: int = 3
    batch: int = 64  # blocks per write call while filling
    modes: tuple[str, ...] = field(default=MODES)

    def __post_init__(self) -> None:
        if not self.sizes or any(s <= 0 for s in self.sizes):
            raise ConfigError("--sizes", "give at least one positive size")
        if self.block_bytes <= 0:
            raise ConfigError("--block", "must be positive")
        if self.repeat < 1:
            raise ConfigError("--repeat", "must be at least 1")
        for m in self.modes:
            if m not in MODES:
                raise ConfigError("--modes", f"unknown mode {m!r}; valid: {', '.join(MODES)}")


def _keys(first: int, n: int) -> np.ndarray:
    keys = np.zeros((n, 32), np.uint8)
    keys[:, :8] = np.arange(first, first + n, dtype=np.uint64).view(np.uint8).reshape(n, 8)
    keys[:, 8:16] = 0x5A
    return keys


def _fill(store, block: int, batch: int) -> tuple[int, float]:
    """Writes blocks until the store is full; every block has its index in its first bytes."""
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, (batch, block), dtype=np.uint8)
    t0 = time.perf_counter()
    n = 0
    while store.free_slots > 0:
        k = min(batch, store.free_slots)
        keys = _keys(n, k)
        data[:k, :8] = keys[:, :8]
        h = store.write(keys, data[:k])
        if (h < 0).any():
            raise ConfigError("--dir", f"a write failed while filling: {store.stats()['drives'][0]['last_error']}")
        n += k
    return n, time.perf_counter() - t0


def _open(path: Path, cap: int, block: int, mode: str) -> dict:
    from saria.tiers.ssd import SsdStore

    t0 = time.perf_counter()
    s = SsdStore([path], cap, block, verify_on_open=mode)
    dt = time.perf_counter() - t0
    try:
        rec = s.take_recovered()
        d = s.stats()["drives"][0]
        order = np.argsort(rec.handles)
        digest = hash((rec.handles[order].tobytes(), rec.keys[order].tobytes()))
        return {"seconds": dt, "recovery_bytes_read": int(d["recovery_bytes_read"]),
                "journal_bytes_written": int(d["journal_bytes_written"]),
                "blocks": int(rec.handles.size), "source": d["recovery_source"], "_digest": digest}
    finally:
        s.close()


def run_restart_bench(cfg: RestartBenchConfig, progress: Callable[[str], None] = lambda s: None) -> dict:
    from saria.tiers.ssd import SsdStore, slot_bytes_for

    cfg.dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(cfg.dir).free
    slot = slot_bytes_for(cfg.block_bytes)
    results = []
    for size in cfg.sizes:
        cap = 4096 + (size // slot) * slot
        if cap > free * 0.9:
            raise ConfigError("--sizes", f"a store of {size} B does not fit the {free} B free under {cfg.dir}")
        path = cfg.dir / f"restart-{size}"
        shutil.rmtree(path, ignore_errors=True)
        try:
            progress(f"{size / 2**30:.3g} GiB: filling")
            with SsdStore([path], cap, cfg.block_bytes) as s:
                blocks, fill_s = _fill(s, cfg.block_bytes, cfg.batch)
            runs: dict[str, list[dict]] = {m: [] for m in cfg.modes}
            for r in range(cfg.repeat):
                for i in range(len(cfg.modes)):
                    m = cfg.modes[(i + r) % len(cfg.modes)]  # the modes take turns
                    progress(f"{size / 2**30:.3g} GiB: open {r + 1}/{cfg.repeat}, {m}")
                    runs[m].append(_open(path, cap, cfg.block_bytes, m))
            digests = {x["_digest"] for rs in runs.values() for x in rs}
            if len(digests) != 1:
                raise RuntimeError(f"store of {size} B: the open modes recovered different blocks")
            row = {"size_bytes": size, "capacity_bytes": cap, "blocks": blocks, "fill_seconds": fill_s,
                   "modes": {}}
            for m, rs in runs.items():
                if any(x["blocks"] != blocks for x in rs):
                    raise RuntimeError(f"store of {size} B, {m}: recovered {rs[0]['blocks']} of {blocks} blocks")
                row["modes"][m] = {
                    "seconds_median": statistics.median(x["seconds"] for x in rs),
                    "seconds": [x["seconds"] for x in rs],
                    "recovery_bytes_read": statistics.median(x["recovery_bytes_read"] for x in rs),
                    "read_share_of_capacity": statistics.median(x["recovery_bytes_read"] for x in rs) / cap,
                    "checkpoint_bytes_written": statistics.median(x["journal_bytes_written"] for x in rs),
                    "source": rs[0]["source"],
                }
            j = row["modes"].get("journal")
            if j:
                for m in ("header", "full"):
                    if m in row["modes"]:
                        row[f"{m}_vs_journal_seconds"] = row["modes"][m]["seconds_median"] / j["seconds_median"]
            results.append(row)
        finally:
            shutil.rmtree(path, ignore_errors=True)
    return {"params": {"dir": str(cfg.dir), "block_bytes": cfg.block_bytes, "slot_bytes": slot,
                       "repeat": cfg.repeat, "modes": list(cfg.modes)}, "stores": results}
