"""``saria bench reload``: the engine's reload paths measured on this machine.

    saria bench reload --dir DIR [--json PATH] [--page-bytes 64KiB] [--layers 32]
                       [--blocks 256] [--repeat 3] [--base h100-gen5-1ssd]

The JSON's ``hardware`` object is a replay preset: ``saria replay --preset
MODEL/PATH.json`` replays with the rates measured here.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from saria.units import parse_size


def add_reload_parser(bench_subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = bench_subparsers.add_parser(
        "reload", help="DRAM/SSD -> KV page paths and the coordinator, measured",
        description="Measures the vLLM worker's reload handlers on this machine beside memcpy "
        "and fio (same run, medians): DRAM -> KV pages, KV -> DRAM, the pool's scatter/gather, "
        "SSD -> KV pages, and loads with a share of SSD blocks under each coordinator mode "
        "beside the replay's model. --json writes a replay preset of the measured rates.")
    p.add_argument("--dir", type=Path, required=True, metavar="DIR",
                   help="directory on the drive to measure (files are removed afterwards)")
    p.add_argument("--json", type=Path, default=None, metavar="PATH",
                   help="write the result (with a replay preset under 'hardware') as JSON")
    p.add_argument("--page-bytes", default="64KiB", metavar="SIZE",
                   help="one layer's page of a block (default 64KiB: Llama-3-8B, 16 tokens)")
    p.add_argument("--layers", type=int, default=32, metavar="N", help="layers (default 32)")
    p.add_argument("--blocks", type=int, default=256, metavar="N",
                   help="blocks per load (default 256)")
    p.add_argument("--repeat", type=int, default=3, metavar="N", help="rounds (default 3)")
    p.add_argument("--tp", type=int, default=2, metavar="N",
                   help="ranks of the tensor-parallel section: each reads its part of a block "
                        "(default 2; 1 skips it)")
    p.add_argument("--base", default="h100-gen5-1ssd", metavar="HARDWARE",
                   help="preset whose other fields the measured preset keeps")
    p.set_defaults(func=run_reload)
    return p


def run_reload(args: argparse.Namespace) -> int:
    from saria.bench.reload import ReloadBenchConfig, run_reload_bench
    from saria.sim.presets import HARDWARE

    from saria.errors import ConfigError

    if args.base not in HARDWARE:
        raise ConfigError("--base", f"unknown hardware {args.base!r}; valid: {', '.join(HARDWARE)}")
    cfg = ReloadBenchConfig(dir=args.dir, page_bytes=int(parse_size(args.page_bytes,
                                                                    name="--page-bytes")),
                            layers=args.layers, blocks=args.blocks, repeat=args.repeat,
                            base=args.base, tp=args.tp)
    err = Console(stderr=True)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task("starting", total=None)
        res = run_reload_bench(cfg, progress=lambda text: bar.update(task, description=text))
    rates, ratios = res["rates_Bps"], res["ratios"]
    t = Table(title=f"saria bench reload: {res['params']['blocks']} blocks of "
                    f"{res['params']['slot_bytes'] / 2**20:.1f} MiB, {res['params']['device']}")
    t.add_column("path")
    t.add_column("GB/s", justify="right")
    t.add_column("ratio", justify="right")
    for name, ref, key in (("memcpy", None, None), ("DRAM -> KV pages", "memcpy", "dram_to_kv"),
                           ("KV -> DRAM", "memcpy", "kv_to_dram"),
                           ("pool scatter", "memcpy", "scatter"), ("pool gather", "memcpy", "gather"),
                           ("fio read", None, "fio_read"), ("SSD read (store)", "fio", "ssd_read"),
                           ("SSD -> KV pages", "fio", "ssd_to_kv")):
        v = rates.get(key or "memcpy")
        r = ratios.get(f"{key}_vs_{ref}") if ref else None
        t.add_row(name, "-" if v is None else f"{v / 1e9:.2f}",
                  "-" if r is None else f"{r:.2f} of {ref}")
    Console().print(t)
    c = Table(title="loads with a share of SSD blocks: measured / model (seconds)")
    c.add_column("SSD share")
    for mode in ("serial", "overlap", "paced"):
        c.add_column(mode, justify="right")
    by = {(row["ssd_share"], row["mode"]): row for row in res["coordinator"]}
    for share in sorted({row["ssd_share"] for row in res["coordinator"]}):
        c.add_row(f"{share:.0%}", *(f"{by[(share, m)]['measured_s']:.3f} / "
                                    f"{by[(share, m)]['model_s']:.3f}"
                                    for m in ("serial", "overlap", "paced")))
    Console().print(c)
    tpr = res.get("tensor_parallel")
    if tpr:
        p = Table(title=f"tensor parallelism: {tpr['tp']} ranks, {tpr['blocks']} blocks, SSD bytes read per rank")
        for col in ("rank", "own part: MiB", "s", "whole slots: MiB", "s"):
            p.add_column(col, justify="right")
        for r in range(tpr["tp"]):
            p.add_row(str(r), f"{tpr['bytes_read_per_rank'][r] / 2**20:.1f}", f"{tpr['part_s_per_rank'][r]:.3f}",
                      f"{tpr['whole_slot_bytes_read_per_rank'][r] / 2**20:.1f}",
                      f"{tpr['whole_slot_s_per_rank'][r]:.3f}")
        Console().print(p)
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(res, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    return 0
