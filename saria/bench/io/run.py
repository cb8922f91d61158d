"""One ``saria bench io`` run: every tool, interleaved per repeat, into one report."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from saria.bench.io.config import (DRAM_MAX_BYTES, GOAL_VS_FIO, GOAL_VS_MEMCPY, BenchIoError,
                                   IoBenchConfig, Progress, median as _median, ratio as _ratio)
from saria.bench.io.fio import FIO_INSTALL_HINT, find_fio
from saria.bench.io.lmcache import ensure_lmcache_venv, lmcache_round
from saria.bench.io.machine import machine_info
from saria.bench.io.store import SariaSsdRunner, _aligned_buffer, dram_round


def steps(cfg: IoBenchConfig) -> int:
    return cfg.repeat * (5 + (1 if cfg.lmcache else 0))


def _attempt(res: dict, runs: str, measure, catch: type[BaseException],
             prefix: str | None = None) -> float | None:
    """One measurement of one tool, unless that tool already failed in this
    run: the figure is appended to ``res[runs]``; a failure becomes
    ``res["reason"]`` (``prefix`` + exception type and text, or the text
    alone) and later rounds skip the tool."""
    if res["reason"] is not None:
        return None
    try:
        value = measure()
    except catch as exc:  # noqa: BLE001 -- a tool's failure is reported, not raised
        res["reason"] = str(exc) if prefix is None else f"{prefix}{type(exc).__name__}: {exc}"
        return None
    res[runs].append(value)
    return value


def run_io_bench(cfg: IoBenchConfig, *, progress: Progress | None = None,
                 notice: Callable[[str], None] | None = None) -> dict:
    """Runs every measurement; returns the JSON-ready result. ``progress(desc, True)`` is called
    once per step (``steps(cfg)`` in all); ``notice(line)`` for one-line messages (fio missing)."""
    cfg.validate()
    report = progress or (lambda desc, advance: None)

    def step(desc: str) -> None:
        report(desc, True)

    say = notice or (lambda line: print(line, file=sys.stderr))
    cfg.dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(cfg.dir).free
    if free < 2.3 * cfg.size:
        raise BenchIoError(f"{cfg.dir}: {free / 2**30:.1f} GiB free, the benchmark needs about "
                           f"{2.3 * cfg.size / 2**30:.1f} GiB (fio file + SSD store)")

    result: dict = {
        "params": {"dir": str(cfg.dir), "size": cfg.size, "block": cfg.block, "qd": cfg.qd,
                   "repeat": cfg.repeat, "lmcache": cfg.lmcache,
                   "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
        "machine": machine_info(cfg.dir),
        "goals": {"ssd_vs_fio": GOAL_VS_FIO, "dram_vs_memcpy": GOAL_VS_MEMCPY},
    }

    # --- fio
    fio = find_fio()
    fio_res: dict = {"available": fio is not None, "version": fio.version if fio else None,
                     "ioengine": None, "write_runs": [], "read_runs": [], "reason": None}
    if fio is None:
        if cfg.require_fio:
            raise BenchIoError(FIO_INSTALL_HINT.replace("the fio ratios are left null; ", ""))
        say(FIO_INSTALL_HINT)
        fio_res["reason"] = FIO_INSTALL_HINT
    fio_file = cfg.dir / "saria-bench-fio.dat"

    # --- saria SSD store
    ssd_res: dict = {"available": False, "write_runs": [], "read_runs": [], "reason": None,
                     "pinned_buffers": None}
    ssd: SariaSsdRunner | None = None
    try:
        ssd = SariaSsdRunner(cfg)
        ssd_res["available"] = True
        ssd_res["pinned_buffers"] = ssd.pool.pinned
    except ImportError as exc:
        ssd_res["reason"] = f"saria.tiers.ssd.SsdStore is not importable: {exc}"
    except Exception as exc:  # noqa: BLE001 -- e.g. the native store failing to start
        ssd_res["reason"] = f"SsdStore could not start: {type(exc).__name__}: {exc}"

    # --- DRAM
    from saria.tiers.dram import DramPool

    dram_bytes = min(cfg.size, DRAM_MAX_BYTES)
    dram_bytes -= dram_bytes % cfg.block
    nslots = dram_bytes // cfg.block
    pool = DramPool(nslots, cfg.block)
    handles = np.random.default_rng(1).permutation(pool.alloc(nslots))
    _m1, src = _aligned_buffer(dram_bytes)
    _m2, dst = _aligned_buffer(dram_bytes)
    src[:] = np.random.default_rng(2).integers(0, 256, size=dram_bytes, dtype=np.uint8)
    dst[:] = 0
    src2 = src.reshape(nslots, cfg.block)
    dst2 = dst.reshape(nslots, cfg.block)
    dram_round(src2, dst2, pool, handles)  # warm-up: fault in every page, warm the caches
    dram_runs: dict[str, list[float]] = {"memcpy": [], "scatter": [], "gather": []}

    # --- LMCache
    lm_res: dict = {"enabled": cfg.lmcache, "available": False, "version": None,
                    "backend": ("lmcache.v1.distributed.l2_adapters.fs_l2_adapter.FSL2Adapter "
                                "(the MP server's 'fs' L2 adapter), use_odirect=True, one "
                                "task per batch of qd blocks"),
                    "venv": str(cfg.lmcache_venv) if cfg.lmcache else None,
                    "write_runs": [], "read_runs": [], "reason": None}
    lm_py: Path | None = None
    if cfg.lmcache:
        try:
            lm_py = ensure_lmcache_venv(cfg.lmcache_venv,
                                           progress=lambda d: report(d, False))
            lm_res["available"] = True
        except BenchIoError as exc:
            lm_res["reason"] = str(exc)
    else:
        lm_res["reason"] = "not requested (--lmcache)"

    paired: dict[str, list[float]] = {"ssd_write_vs_fio": [], "ssd_read_vs_fio": [],
                                      "ssd_write_vs_lmcache": [], "ssd_read_vs_lmcache": []}
    try:
        for r in range(cfg.repeat):
            tag = f"[{r + 1}/{cfg.repeat}]"
            step(f"{tag} fio write")
            fw = _attempt(fio_res, "write_runs", lambda: fio.run(cfg, fio_file, "write") / 1e9,
                          BenchIoError) if fio is not None else None
            step(f"{tag} saria SSD store write")
            sw = _attempt(ssd_res, "write_runs", lambda: ssd.write(r), Exception,
                          "write failed: ") if ssd is not None else None
            step(f"{tag} fio read")
            fr = _attempt(fio_res, "read_runs", lambda: fio.run(cfg, fio_file, "read") / 1e9,
                          BenchIoError) if fio is not None else None
            step(f"{tag} saria SSD store read")
            sr = _attempt(ssd_res, "read_runs", ssd.read, Exception,
                          "read failed: ") if ssd is not None and sw is not None else None
            step(f"{tag} DRAM pool vs memcpy")
            for k, v in dram_round(src2, dst2, pool, handles).items():
                dram_runs[k].append(v)
            lw = lr = None
            if cfg.lmcache:
                step(f"{tag} LMCache fs L2 adapter")
                if lm_py is not None and lm_res["reason"] is None:
                    try:
                        lm = lmcache_round(lm_py, cfg, r)
                        lw, lr = lm["write_gbps"], lm["read_gbps"]
                        lm_res["write_runs"].append(lw)
                        lm_res["read_runs"].append(lr)
                        lm_res["version"] = lm["lmcache_version"]
                    except (BenchIoError, ValueError, KeyError) as exc:
                        lm_res["reason"] = str(exc)
            for key, a, b in (("ssd_write_vs_fio", sw, fw), ("ssd_read_vs_fio", sr, fr),
                              ("ssd_write_vs_lmcache", sw, lw),
                              ("ssd_read_vs_lmcache", sr, lr)):
                if a is not None and b:
                    paired[key].append(a / b)
        pool.gather(handles, dst2)
        if not np.array_equal(dst, src):
            raise BenchIoError("DRAM pool gather returned wrong bytes")
    finally:
        if ssd is not None:
            ssd.close()
        if not cfg.keep_files:
            fio_file.unlink(missing_ok=True)
        pool.close()

    fio_res["ioengine"] = fio.engine if fio is not None else None
    ssd_res["payload_bytes_per_run"] = cfg.size
    ssd_res["device_bytes_written_last_run"] = ssd.device_bytes_written if ssd else None
    for res in (fio_res, ssd_res, lm_res):
        res["write_gbps"] = _median(res["write_runs"])
        res["read_gbps"] = _median(res["read_runs"])
    dram_res = {"bytes": dram_bytes, "slots": nslots, "slot_bytes": cfg.block,
                "pinned": pool.pinned, "pin_method": pool.pin_method, "threads": 1,
                "memcpy_gbps": _median(dram_runs["memcpy"]),
                "scatter_gbps": _median(dram_runs["scatter"]),
                "gather_gbps": _median(dram_runs["gather"]),
                "memcpy_runs": dram_runs["memcpy"], "scatter_runs": dram_runs["scatter"],
                "gather_runs": dram_runs["gather"]}
    scatter_r = _ratio(dram_res["scatter_gbps"], dram_res["memcpy_gbps"])
    gather_r = _ratio(dram_res["gather_gbps"], dram_res["memcpy_gbps"])
    result.update({
        "fio": fio_res,
        "saria_ssd": ssd_res,
        "dram": dram_res,
        "lmcache": lm_res,
        "ssd_write_vs_fio": _ratio(ssd_res["write_gbps"], fio_res["write_gbps"]),
        "ssd_read_vs_fio": _ratio(ssd_res["read_gbps"], fio_res["read_gbps"]),
        "dram_scatter_vs_memcpy": scatter_r,
        "dram_gather_vs_memcpy": gather_r,
        "dram_vs_memcpy": min(scatter_r, gather_r) if scatter_r and gather_r else None,
        "ssd_write_vs_lmcache": _ratio(ssd_res["write_gbps"], lm_res["write_gbps"]),
        "ssd_read_vs_lmcache": _ratio(ssd_res["read_gbps"], lm_res["read_gbps"]),
        "paired_ratio_runs": paired,
    })
    return result
