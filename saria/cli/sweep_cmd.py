"""``saria sweep``: a grid of replays in parallel, written as CSV + PNG.

    saria sweep [TRACE] [--policy NAME ...] [--dram SIZES] [--arrivals SPEC ...]
                [--ssd SIZES] [--ssd-count NS] [--r RS] [--coordinator MODES] [--out DIR] [--jobs N]

Lists are comma-separated (``--dram 64GB,256GB``); ``--arrivals`` repeats
(its specs contain commas). Writes ``sweep.csv``, ``sweep.json`` and
``frontier.png`` (SSD bytes written versus mean and P90 TTFT, one panel per
setting) into ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import os
import time
from pathlib import Path

import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from saria.errors import ConfigError
from saria.policy import PROMOTIONS, make_admission
from saria.sim.engine import LOOKUPS
from saria.sim.presets import DEFAULT_PRESET, get_preset
from saria.traces import FORMATS, load_trace, resolve_trace
from saria.traces.arrivals import ArrivalModel
from saria.transfer import COORDINATOR_MODES
from saria.units import parse_size

SWEEP_POLICIES = ("dram-only", "full-duplicate", "write-back", "E2", "E3", "E5", "R2", "R4",
                  "E2+R2", "hicache-selective", "kvbm-filter", "saria", "budget")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("sweep", help="a grid of replays, CSV + PNG frontier",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("trace", nargs="?", default="weka", help="trace path or bundled name")
    p.add_argument("--format", default="auto", choices=FORMATS)
    p.add_argument("--policy", action="append", default=None, metavar="NAME",
                   help=f"repeatable; default: {', '.join(SWEEP_POLICIES)}")
    p.add_argument("--preset", default=DEFAULT_PRESET)
    p.add_argument("--block-size", type=int, default=None, metavar="TOKENS")
    p.add_argument("--dram", default=None, metavar="SIZES", help="comma list, e.g. 64GB,256GB")
    p.add_argument("--arrivals", action="append", default=None, metavar="SPEC",
                   help="repeatable, e.g. --arrivals window:2h --arrivals window:12h")
    p.add_argument("--ssd", default=None, metavar="SIZES",
                   help="SSD capacity per drive, comma list, e.g. 200GB,1TB,3.84TB (sizing a drive: "
                   "each row's lifetime and write budget are that drive's)")
    p.add_argument("--ssd-count", default=None, metavar="NS", help="comma list, e.g. 1,2")
    p.add_argument("--r", default=None, metavar="RS", help="saria's DRAM share, comma list")
    p.add_argument("--coordinator", default=None, metavar="MODES",
                   help=f"comma list of {', '.join(COORDINATOR_MODES)}")
    p.add_argument("--lookup", choices=LOOKUPS, default="unified")
    p.add_argument("--promotion", choices=PROMOTIONS, default="none",
                   help="promotion for non-saria policies")
    p.add_argument("--sessions", type=int, default=90, metavar="N",
                   help="first N sessions of a WEKA bundle (default 90; 0 = all)")
    p.add_argument("--max-context", type=int, default=None, metavar="TOKENS")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help=f"worker processes (default: all cores, {os.cpu_count()})")
    p.add_argument("--out", type=Path, default=Path("results/sweep"), metavar="DIR")
    p.set_defaults(func=run)


def _list(text: str | None, flag: str, conv) -> list:
    if text is None:
        return [None]
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ConfigError(flag, "empty list")
    out = []
    for t in items:
        try:
            out.append(conv(t))
        except ConfigError:
            raise
        except (TypeError, ValueError) as exc:
            raise ConfigError(flag, f"bad value {t!r}: {exc}") from None
    return out


def _count(t: str) -> int:
    n = int(t)
    if n < 1:
        raise ValueError("must be at least 1")
    return n


def _ssd_size(t: str, preset) -> float:
    size = parse_size(t, name="--ssd", allow_unlimited=True)
    block = preset.block_size * preset.model.kv_bytes_per_token
    if 0 < size < block:
        raise ConfigError("--ssd", f"{t} is smaller than one block ({block} bytes)")
    return size


def _share(t: str) -> float:
    r = float(t)
    if not 0 <= r <= 1:
        raise ValueError("must be in [0, 1]")
    return r


def _mode(t: str) -> str:
    if t not in COORDINATOR_MODES:
        raise ValueError(f"valid: {', '.join(COORDINATOR_MODES)}")
    return t


def run(args: argparse.Namespace) -> int:
    from saria.sim.plot import frontier_plot
    from saria.sim.sweep import expand_grid, run_sweep

    policies = args.policy or list(SWEEP_POLICIES)
    for name in policies:
        make_admission(name)
    preset = get_preset(args.preset)
    if args.block_size is not None:
        if args.block_size < 1:
            raise ConfigError("--block-size", "must be positive")
        preset = preset.with_(block_size=args.block_size)
    drams = _list(args.dram, "--dram",
                  lambda t: parse_size(t, name="--dram", allow_unlimited=True))
    ssds = _list(args.ssd_count, "--ssd-count", _count)
    sizes = _list(args.ssd, "--ssd", lambda t: _ssd_size(t, preset))
    rs = _list(args.r, "--r", _share)
    coords = _list(args.coordinator, "--coordinator", _mode)
    arrivals = args.arrivals or ["window:12h"]
    for spec in arrivals:
        ArrivalModel.from_spec(spec)
    if args.jobs is not None and args.jobs < 1:
        raise ConfigError("--jobs", "must be at least 1")
    if args.sessions < 0:
        raise ConfigError("--sessions", "must not be negative")
    points = expand_grid(policies, drams, arrivals, ssds, rs, coords, sizes)
    args.out.mkdir(parents=True, exist_ok=True)

    path = resolve_trace(args.trace)
    err = Console(stderr=True)
    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    t0 = time.perf_counter()
    with Progress(*cols, console=err, transient=True) as bar:
        task = bar.add_task(f"loading {path.name}", total=None)
        trace = load_trace(path, args.format, limit_sessions=args.sessions or None)
        if trace.block_size is None:
            raise ConfigError("trace", f"{path}: has no block hash ids")
        bar.update(task, description=f"sweeping {len(points)} replays", total=len(points),
                   completed=0)
        rows = run_sweep(trace, preset, points, jobs=args.jobs, lookup=args.lookup,
                         promotion=args.promotion, max_context=args.max_context,
                         progress=lambda d: bar.update(task, completed=d))
    csv_path = args.out / "sweep.csv"
    keys = list(rows[0])
    with csv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    (args.out / "sweep.json").write_bytes(orjson.dumps(
        {"config": {"trace": str(path), "sessions": trace.num_sessions, "preset": preset.name,
                    "block_size": preset.block_size}, "rows": rows},
        option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    png = frontier_plot(rows, args.out / "frontier.png",
                        title=f"{path.name}: {trace.num_sessions} sessions, {preset.name}")
    Console().print(f"{len(rows)} replays in {time.perf_counter() - t0:.1f} s -> {csv_path}, {png}")
    return 0
