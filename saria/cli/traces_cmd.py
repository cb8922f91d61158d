"""``saria traces``: inspect request traces.

    saria traces stats [TRACE ...] [--format auto|weka|mooncake|azure] [--json PATH]

TRACE is a path or the short name of a bundled trace (weka, mooncake, azure); with none,
every bundled trace is used. Prints a table (stdout) after a progress bar (stderr).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import orjson
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from saria.traces import (BUNDLED, FORMATS, bundled_traces, load_trace, resolve_trace,
                          trace_stats)


def register(subparsers: argparse._SubParsersAction) -> None:
    traces = subparsers.add_parser("traces", help="inspect request traces", description=__doc__.split("\n\n")[0])
    sub = traces.add_subparsers(dest="traces_command", metavar="SUBCOMMAND")
    sub.required = True
    stats = sub.add_parser(
        "stats",
        help="counts and ideal infinite-cache hit ratio of traces",
        description="Counts, lengths and the ideal infinite-cache hit ratio (by blocks and "
        "token-weighted, any-earlier and prefix-contiguous) of each trace.",
    )
    stats.add_argument(
        "traces",
        nargs="*",
        metavar="TRACE",
        help=f"trace path or bundled name ({', '.join(BUNDLED)}); default: all bundled traces",
    )
    stats.add_argument("--format", default="auto", choices=FORMATS, help="trace format (default: auto)")
    stats.add_argument("--limit-sessions", type=int, default=None, metavar="N", help="WEKA: first N sessions only")
    stats.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the results as JSON")
    stats.set_defaults(func=run_stats)


def run_stats(args: argparse.Namespace) -> int:
    named = [(a, resolve_trace(a)) for a in args.traces] if args.traces else list(bundled_traces().items())
    labels = [label if label in BUNDLED else path.name for label, path in named]
    paths = [path for _, path in named]
    results = []
    err = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        for path in paths:
            task = bar.add_task(f"loading {path.name}", total=None)

            def report(done: int, total: int, task=task) -> None:
                bar.update(task, completed=done, total=total)

            t0 = time.perf_counter()
            trace = load_trace(path, args.format, limit_sessions=args.limit_sessions, progress=report)
            t1 = time.perf_counter()
            bar.update(task, description=f"stats {path.name}")
            st = trace_stats(trace)
            t2 = time.perf_counter()
            bar.remove_task(task)
            timing = {"load_s": round(t1 - t0, 3), "stats_s": round(t2 - t1, 3)}
            results.append({"path": str(path), **st.to_dict(), **timing})
    Console().print(_table(results, labels))
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return 0


# Rows are metrics and columns traces: three traces fit an 80-column terminal this way.
_ROWS = (
    ("format", lambda r: r["format"]),
    ("block size (tokens)", lambda r: str(r["block_size"] or "-")),
    ("sessions", lambda r: f"{r['sessions']:,}" if r["has_sessions"] else "none (1 pseudo)"),
    ("requests", lambda r: f"{r['requests']:,}"),
    ("  of which subagent", lambda r: f"{r['subagent_requests']:,}"),
    ("input tokens", lambda r: _si(r["input_tokens"])),
    ("  without ids (miss)", lambda r: _si(r["tokens_without_ids"])),
    ("output tokens", lambda r: _si(r["output_tokens"])),
    ("input blocks", lambda r: f"{r['blocks']:,}"),
    ("unique blocks", lambda r: f"{r['unique_blocks']:,}"),
    ("ideal hit, blocks", lambda r: _ratio(r["hit_ratio_blocks"])),
    ("ideal hit, tokens", lambda r: _ratio(r["hit_ratio_tokens"])),
    ("prefix hit, blocks", lambda r: _ratio(r["prefix_hit_ratio_blocks"])),
    ("prefix hit, tokens", lambda r: _ratio(r["prefix_hit_ratio_tokens"])),
    ("max session span (s)", lambda r: f"{r['time_span_s']:,.0f}"),
    ("median session span (s)", lambda r: f"{r['median_session_span_s']:,.0f}"),
    ("load + stats (s)", lambda r: f"{r['load_s']:.2f} + {r['stats_s']:.2f}"),
)


def _table(results: list[dict], labels: list[str]) -> Table:
    t = Table(title="Trace statistics", caption="ideal hit: id seen in an earlier request of its namespace")
    t.add_column("", no_wrap=True)
    for label in labels:
        t.add_column(label, justify="right", overflow="fold")
    for name, cell in _ROWS:
        t.add_row(name, *(cell(r) for r in results))
    return t


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def _si(n: int) -> str:
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return str(n)
