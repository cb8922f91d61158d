"""``saria bench io``: SSD store vs fio, DRAM pool vs memcpy, and LMCache, in one run.

    saria bench io --dir DIR [--json PATH] [--size 1GiB] [--block 1MiB] [--qd 16]
                   [--repeat 3] [--lmcache] [--lmcache-venv PATH] [--require-fio]

``bench_cmd.py`` owns the ``bench`` group; it adds this subcommand with
``add_io_parser(sub)``. ``register(subparsers)`` does the same from the top level (it finds
the existing ``bench`` group, or creates one) for callers that list modules in ``_COMMANDS``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from saria.units import parse_size

_DESCRIPTION = (
    "Measures, in one run on the same directory: the saria SSD store's write and read bandwidth "
    "beside fio (same I/O size and queue depth, O_DIRECT), the DRAM pool's scatter/gather copy "
    "bandwidth beside a plain memcpy, and optionally the same workload through LMCache 0.5.6's "
    "'fs' L2 adapter (installed once in its own virtual environment). Reports GB/s and the "
    "ratios ssd_write_vs_fio, ssd_read_vs_fio, dram_vs_memcpy (goal: >= 0.9 each); medians of "
    "--repeat runs.")


def add_io_parser(bench_subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds ``io`` to the ``saria bench`` subcommand group."""
    io = bench_subparsers.add_parser(
        "io", help="SSD store vs fio, DRAM pool vs memcpy (and LMCache)",
        description=_DESCRIPTION)
    io.add_argument("--dir", type=Path, required=True, metavar="DIR",
                    help="directory on the drive to measure (files are removed afterwards)")
    io.add_argument("--json", type=Path, default=None, metavar="PATH",
                    help="also write the result as JSON")
    io.add_argument("--size", default="1GiB", metavar="SIZE",
                    help="bytes written then read by each tool (default 1GiB)")
    io.add_argument("--block", default="1MiB", metavar="SIZE",
                    help="I/O size = SSD block size, a multiple of 4 KiB (default 1MiB)")
    io.add_argument("--qd", type=int, default=16, metavar="N",
                    help="queue depth: I/Os in flight / blocks per store batch (default 16)")
    io.add_argument("--repeat", type=int, default=3, metavar="N",
                    help="runs of each measurement; the medians are reported (default 3)")
    io.add_argument("--lmcache", action="store_true",
                    help="also run the workload through LMCache 0.5.6 (first use installs it "
                    "into --lmcache-venv: a few minutes)")
    io.add_argument("--lmcache-venv", type=Path, default=None, metavar="PATH",
                    help="virtual environment for LMCache (default ~/.cache/saria/lmcache-venv)")
    io.add_argument("--require-fio", action="store_true",
                    help="fail when fio is not installed (default: report fio ratios as null)")
    io.add_argument("--keep-files", action="store_true", help=argparse.SUPPRESS)
    io.set_defaults(func=run_io)
    return io


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``bench io`` from the top level: into the existing ``bench`` group if there is one."""
    bench = subparsers.choices.get("bench")
    if bench is None:
        bench = subparsers.add_parser("bench", help="benchmarks of saria's parts")
        group = bench.add_subparsers(dest="bench_command", metavar="SUBCOMMAND")
        group.required = True
    else:
        group = next(a for a in bench._actions if isinstance(a, argparse._SubParsersAction))
    if "io" not in group.choices:
        add_io_parser(group)


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "—" if x is None else format(x, spec)


def run_io(args: argparse.Namespace) -> int:
    from saria.bench.io import DEFAULT_LMCACHE_VENV, IoBenchConfig, run_io_bench, steps

    cfg = IoBenchConfig(
        dir=args.dir, size=int(parse_size(args.size, name="--size")),
        block=int(parse_size(args.block, name="--block")), qd=args.qd, repeat=args.repeat,
        lmcache=args.lmcache, lmcache_venv=args.lmcache_venv or DEFAULT_LMCACHE_VENV,
        require_fio=args.require_fio, keep_files=args.keep_files)
    cfg.validate()
    err = Console(stderr=True)
    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn())
    with Progress(*cols, console=err, transient=True) as bar:
        task = bar.add_task("starting", total=steps(cfg))
        state = {"started": False}

        def progress(desc: str, advance: bool) -> None:
            if advance and state["started"]:
                bar.advance(task)
            state["started"] = state["started"] or advance
            bar.update(task, description=desc)

        result = run_io_bench(cfg, progress=progress, notice=lambda line: err.print(
            line, markup=False, highlight=False, soft_wrap=True))
        bar.advance(task)

    print_table(result)
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return 0


def print_table(r: dict) -> None:
    p = r["params"]
    t = Table(title=f"saria bench io: {p['dir']}  size {p['size'] / 2**20:,.0f} MiB, "
                    f"block {p['block'] / 2**10:,.0f} KiB, qd {p['qd']}, median of {p['repeat']}")
    t.add_column("path")
    t.add_column("write GB/s", justify="right")
    t.add_column("read GB/s", justify="right")
    t.add_column("note")
    fio, ssd, lm, dram = r["fio"], r["saria_ssd"], r["lmcache"], r["dram"]
    t.add_row(f"fio ({fio['ioengine'] or 'direct'})" if fio["available"] else "fio",
              _fmt(fio["write_gbps"]), _fmt(fio["read_gbps"]), fio["reason"] or "")
    t.add_row("saria SSD store", _fmt(ssd["write_gbps"]), _fmt(ssd["read_gbps"]),
              ssd["reason"] or "")
    if lm["enabled"]:
        t.add_row(f"LMCache {lm['version'] or ''} fs L2 (O_DIRECT)", _fmt(lm["write_gbps"]),
                  _fmt(lm["read_gbps"]), lm["reason"] or "")
    t.add_row("ratio saria / fio", _fmt(r["ssd_write_vs_fio"]), _fmt(r["ssd_read_vs_fio"]),
              f"goal >= {r['goals']['ssd_vs_fio']}")
    if lm["enabled"]:
        t.add_row("ratio saria / LMCache", _fmt(r["ssd_write_vs_lmcache"]),
                  _fmt(r["ssd_read_vs_lmcache"]), "")
    t.add_section()
    pin = "pinned" if dram["pinned"] else "not pinned"
    t.add_row("memcpy (np.copyto)", _fmt(dram["memcpy_gbps"]), "", "one thread")
    t.add_row(f"DRAM pool scatter / gather ({pin})", _fmt(dram["scatter_gbps"]),
              _fmt(dram["gather_gbps"]), "write = scatter, read = gather")
    t.add_row("ratio pool / memcpy", _fmt(r["dram_scatter_vs_memcpy"]),
              _fmt(r["dram_gather_vs_memcpy"]),
              f"dram_vs_memcpy {_fmt(r['dram_vs_memcpy'])} (goal >= {r['goals']['dram_vs_memcpy']})")
    Console().print(t)


def main(argv: list[str] | None = None) -> int:
    """``python -m saria.cli.bench_io_cmd ...``: the subcommand on its own."""
    parser = argparse.ArgumentParser(prog="saria bench io", description=_DESCRIPTION)
    sub = parser.add_subparsers(dest="bench_command")
    add_io_parser(sub)
    args = parser.parse_args(["io", *(sys.argv[1:] if argv is None else argv)])
    from saria.errors import SariaError

    try:
        return run_io(args)
    except SariaError as exc:
        print(f"saria: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
