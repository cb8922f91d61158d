"""``saria bench restart``: reopen time and bytes read at open of filled SSD
stores, journal against full and header scans (saria/bench/restart.py).

    saria bench restart --dir DIR [--sizes 1GiB,8GiB,32GiB] [--block 1MiB]
                        [--repeat 3] [--json PATH]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from saria.units import format_size, parse_size


def add_restart_parser(bench_subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = bench_subparsers.add_parser(
        "restart", help="reopen of filled SSD stores: journal vs full and header scans",
        description="Fills a store of each size (every slot), then reopens it --repeat times "
        "in each mode (journal, header scan, full scan; the modes take turns): open time and "
        "bytes read at open, medians, and the ratios of the scans to the journal. The modes "
        "must recover the same blocks. One store on the disk at a time; removed afterwards.")
    p.add_argument("--dir", type=Path, required=True, metavar="DIR",
                   help="directory on the drive to measure")
    p.add_argument("--sizes", default="1GiB,8GiB,32GiB", metavar="LIST",
                   help="store sizes, comma-separated (default 1GiB,8GiB,32GiB)")
    p.add_argument("--block", default="1MiB", metavar="SIZE", help="block size (default 1MiB)")
    p.add_argument("--repeat", type=int, default=3, metavar="N", help="opens per mode (default 3)")
    p.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the result as JSON")
    p.set_defaults(func=run_restart)
    return p


def run_restart(args: argparse.Namespace) -> int:
    from saria.bench.restart import RestartBenchConfig, run_restart_bench

    sizes = tuple(int(parse_size(x.strip(), name="--sizes")) for x in args.sizes.split(",") if x.strip())
    cfg = RestartBenchConfig(dir=args.dir, sizes=sizes, block_bytes=int(parse_size(args.block, name="--block")),
                             repeat=args.repeat)
    err = Console(stderr=True)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task("starting", total=None)
        res = run_restart_bench(cfg, progress=lambda text: bar.update(task, description=text))
    t = Table(title=f"saria bench restart: blocks of {format_size(cfg.block_bytes, binary=True)}, "
                    f"medians of {cfg.repeat} opens per mode")
    for c in ("store", "blocks", "mode", "open", "read at open", "of capacity", "vs journal"):
        t.add_column(c, justify="left" if c in ("store", "mode") else "right")
    for row in res["stores"]:
        j = row["modes"].get("journal")
        for m, x in row["modes"].items():
            ratio = "-" if m == "journal" or not j else f"{x['seconds_median'] / j['seconds_median']:.0f}x"
            t.add_row(format_size(row["size_bytes"], binary=True), f"{row['blocks']:,}", m,
                      f"{x['seconds_median'] * 1e3:.1f} ms", format_size(x["recovery_bytes_read"], binary=True),
                      f"{100 * x['read_share_of_capacity']:.3f}%", ratio)
    Console().print(t)
    if args.json:
        args.json.write_bytes(orjson.dumps(res, option=orjson.OPT_INDENT_2))
    return 0
