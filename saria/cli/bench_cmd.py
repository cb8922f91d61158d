"""``saria bench``: benchmarks of saria's own parts.

    saria bench index [--trace TRACE] [--json PATH] [--dram-fraction F]
                      [--window-hours H] [--seed N] [--limit-sessions N]
    saria bench io --dir DIR ...       (bench_io_cmd.py)
    saria bench reload --dir DIR ...   (bench_reload_cmd.py)
    saria bench restart --dir DIR ...  (bench_restart_cmd.py)
    saria bench remote ...             (bench_remote_cmd.py)

``index`` streams a trace (default: the bundled WEKA bundle, 94 M block
visits) through match/touch/evict/add on the real radix index and reports
block visits per second, peak memory and memory per tracked block.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from saria.errors import ConfigError
from saria.traces import BUNDLED, load_trace, resolve_trace


def register(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser("bench", help="benchmarks of saria's parts",
                                  description=__doc__.split("\n\n")[0])
    sub = bench.add_subparsers(dest="bench_command", metavar="SUBCOMMAND")
    sub.required = True
    ix = sub.add_parser(
        "index", help="stream a trace through the radix index",
        description="Streams every request of a trace through match / touch / evict / add on "
        "the radix index with DRAM holding a fraction of the unique blocks; reports block "
        "visits per second, peak RSS and memory per tracked block.")
    ix.add_argument("--trace", default="weka",
                    help=f"trace path or bundled name ({', '.join(BUNDLED)}); default: weka")
    ix.add_argument("--json", type=Path, default=None, metavar="PATH",
                    help="also write the result as JSON")
    ix.add_argument("--dram-fraction", type=float, default=0.10, metavar="F",
                    help="DRAM capacity as a fraction of the trace's unique blocks (default 0.10)")
    ix.add_argument("--window-hours", type=float, default=12.0, metavar="H",
                    help="sessions start uniformly at random in this window (default 12)")
    ix.add_argument("--seed", type=int, default=0, help="seed of the session start times")
    ix.add_argument("--limit-sessions", type=int, default=None, metavar="N",
                    help="WEKA: first N sessions only")
    ix.set_defaults(func=run_index)
    from saria.cli.bench_io_cmd import add_io_parser
    from saria.cli.bench_reload_cmd import add_reload_parser
    from saria.cli.bench_remote_cmd import add_remote_parser
    from saria.cli.bench_restart_cmd import add_restart_parser
    from saria.cli.bench_steps_cmd import add_steps_parser

    add_io_parser(sub)
    add_reload_parser(sub)
    add_restart_parser(sub)
    add_remote_parser(sub)
    add_steps_parser(sub)
    sv = sub.add_parser("serve", help="saria serve: lookup round trip and a load test",
                        description="Lookup round trip (8/64/128/1024 keys) to a saria serve "
                        "process against the in-process call and an empty ZMQ round trip, "
                        "then a load test of N client "
                        "processes with the server's RSS and sessions sampled each second.")
    sv.add_argument("--calls", type=int, default=2000, help="lookups per size (default 2000)")
    sv.add_argument("--clients", type=int, default=4, help="load-test processes (default 4)")
    sv.add_argument("--seconds", type=float, default=600.0,
                    help="load-test duration (default 600; 0 skips it)")
    sv.add_argument("--curve", action="store_true", help="also over tcp:// with CurveZMQ and "
                    "with --insecure-tcp, in the same run")
    sv.add_argument("--repeats", type=int, default=1, help="lookup rounds, interleaved across "
                    "paths; figures are the medians (default 1)")
    sv.add_argument("--json", type=Path, default=None, metavar="PATH")
    sv.set_defaults(func=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from saria.bench.serve_bench import load_test, lookup_rtt

    if args.calls < 10:
        raise ConfigError("--calls", f"must be at least 10, got {args.calls}")
    if args.clients < 1 or args.seconds < 0:
        raise ConfigError("--clients", "needs at least one client and seconds >= 0")
    con = Console()
    if args.repeats < 1:
        raise ConfigError("--repeats", f"must be at least 1, got {args.repeats}")
    rows = lookup_rtt(args.calls, curve=args.curve, repeats=args.repeats)
    t = Table(title="lookup round trip (µs)")
    for col in ("keys", "path", "p50", "p99"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(str(r["keys"] or "-"), r["path"], f"{r['p50_us']:,.0f}",
                  f"{r['p99_us']:,.0f}")
    con.print(t)
    out = {"lookup": rows}
    if args.seconds > 0:
        cols = (TextColumn("load test"), BarColumn(), TimeElapsedColumn())
        with Progress(*cols, console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task("load", total=args.seconds)
            res = load_test(args.clients, args.seconds,
                            progress=lambda done, total: bar.update(task, completed=done))
        out["load"] = res
        t = Table(title=f"load test: {args.clients} clients, {args.seconds:g} s")
        t.add_column("figure")
        t.add_column("value", justify="right")
        for k, v in res.items():
            t.add_row(k, f"{v:,.1f}" if isinstance(v, float) else str(v))
        con.print(t)
    if args.json:
        args.json.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))
    return 0


def run_index(args: argparse.Namespace) -> int:
    from saria.bench.index_stream import run_index_bench

    if not 0 < args.dram_fraction <= 1:
        raise ConfigError("--dram-fraction", f"must be in (0, 1], got {args.dram_fraction}")
    if args.window_hours < 0:
        raise ConfigError("--window-hours", f"must not be negative, got {args.window_hours}")
    if args.limit_sessions is not None and args.limit_sessions < 1:
        raise ConfigError("--limit-sessions", f"must be at least 1, got {args.limit_sessions}")
    path = resolve_trace(args.trace)
    err = Console(stderr=True)
    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn())
    with Progress(*cols, console=err, transient=True) as bar:
        task = bar.add_task(f"loading {path.name}", total=None)
        t0 = time.perf_counter()
        trace = load_trace(path, "auto", limit_sessions=args.limit_sessions,
                           progress=lambda done, total: bar.update(task, completed=done,
                                                                   total=total))
        load_s = time.perf_counter() - t0
        bar.update(task, description="streaming through the index", completed=0,
                   total=trace.num_requests)
        result = run_index_bench(
            trace, load_seconds=load_s, dram_fraction=args.dram_fraction,
            window_hours=args.window_hours, seed=args.seed,
            progress=lambda done: bar.update(task, completed=done))
    d = result.to_dict()
    t = Table(title=f"saria bench index: {result.trace}")
    t.add_column("metric")
    t.add_column("value", justify="right")
    rows = (
        ("requests", f"{result.requests:,}"),
        ("block visits", f"{result.block_visits:,}"),
        ("unique blocks", f"{result.unique_blocks:,}"),
        ("DRAM capacity (blocks)", f"{result.dram_blocks:,}"),
        ("stream time (s)", f"{result.seconds:.2f}"),
        ("block visits / s", f"{result.block_visits_per_s / 1e6:.2f} M"),
        ("stream CPU time (s)", f"{result.cpu_seconds:.2f}"),
        ("block visits / CPU s", f"{result.block_visits_per_cpu_s / 1e6:.2f} M"),
        ("trace load time (s)", f"{result.load_seconds:.2f}"),
        ("hit ratio (blocks)", f"{result.hit_ratio_blocks:.4f}"),
        ("DRAM evictions", f"{result.dram_evictions:,}"),
        ("tracked blocks", f"{result.tracked_blocks:,}"),
        ("index memory", f"{result.index_memory_bytes / 2**20:,.0f} MiB"),
        ("bytes / tracked block", f"{result.bytes_per_tracked_block:.0f} (node {result.node_bytes})"),
        ("peak RSS", f"{result.peak_rss_bytes / 2**20:,.0f} MiB"),
    )
    for name, value in rows:
        t.add_row(name, value)
    Console().print(t)
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(d, option=orjson.OPT_INDENT_2))
    return 0
