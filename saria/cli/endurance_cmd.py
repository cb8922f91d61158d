"""``saria endurance``: SSD write-endurance budget.

    saria endurance [--capacity SIZE] [--dwpd X] [--years Y] [--drives N]
                    (--write-rate RATE | --replay-json PATH) [--target-days D] [--json PATH]

How long a drive lives under a write rate, how much SSD a GPU needs for the rated life at that
rate (86.4 x B / DWPD TB for B GB/s), and what write rate the budget allows. Sizes and rates are
written as people write them: 4TB, 3.84T, 512GiB, 1.2GB/s, 300MB/s, 2TB/day.
Defaults: one 3.84 TB drive at 1 DWPD over 5 years (a DGX H100 GPU's share).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import orjson
from rich.console import Console
from rich.table import Table

from saria.endurance import DEFAULT_DWPD, DEFAULT_YEARS, DGX_H100_DRIVE_BYTES, EnduranceReport, reports_from_replay
from saria.errors import ConfigError
from saria.units import format_rate, format_size, parse_duration, parse_rate, parse_size


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("endurance", help="SSD write-endurance budget (DWPD)",
                              description=__doc__.split("\n\n", 2)[2])
    # Values stay strings here and are parsed in run(), so a bad value is a ConfigError that
    # names the flag (one line, exit 2) rather than an argparse usage dump.
    p.add_argument("--capacity", default=None, metavar="SIZE",
                   help="capacity of each drive (default: the replay's drive with --replay-json, "
                   "else 3.84TB, the DGX H100 drive per GPU)")
    p.add_argument("--dwpd", default=str(DEFAULT_DWPD), metavar="X",
                   help="rated drive writes per day (default: 1)")
    p.add_argument("--years", default=str(DEFAULT_YEARS), metavar="Y",
                   help="years the DWPD rating covers, the warranty (default: 5)")
    p.add_argument("--drives", default=None, metavar="N",
                   help="drives per GPU sharing the writes evenly (default: 1, or the replay's count)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--write-rate", metavar="RATE", help="sustained SSD writes per GPU, e.g. 1.2GB/s")
    src.add_argument("--replay-json", type=Path, metavar="PATH",
                     help="the --json output of saria replay: one column per policy")
    p.add_argument("--target-days", default=None, metavar="D",
                   help="also print the write rate allowed for this lifetime (days, or 2y, 6w, 90d)")
    p.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the results as JSON")
    p.set_defaults(func=run)


def _number(text: str, flag: str, *, positive: bool = True) -> float:
    try:
        x = float(text)
    except ValueError:
        raise ConfigError(flag, f"expected a number, got {text!r}") from None
    if math.isnan(x) or math.isinf(x) or x < 0 or (positive and x == 0):
        raise ConfigError(flag, f"expected a {'positive' if positive else 'non-negative'} finite number, got {text!r}")
    return x


def _drives(text: str | None) -> int | None:
    if text is None:
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise ConfigError("--drives", f"expected a positive whole number, got {text!r}")
    return int(text)


def _target_days(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        days = _number(text, "--target-days")  # a bare number is days here
    except ConfigError:
        days = parse_duration(text, name="--target-days") / 86_400
        if days <= 0:
            raise ConfigError("--target-days", f"must be positive, got {text!r}") from None
    return days


def _default_capacity(replay_json: Path | None) -> str:
    """The drive the replay replayed (its ``--ssd``), else the DGX H100's."""
    if replay_json is not None:
        try:
            ssd = orjson.loads(replay_json.read_bytes()).get("config", {}).get("ssd_bytes_per_drive")
        except (OSError, orjson.JSONDecodeError, AttributeError):
            ssd = None  # reports_from_replay names what is wrong with the file
        if isinstance(ssd, (int, float)) and ssd > 0:
            return str(ssd)
    return str(DGX_H100_DRIVE_BYTES)


def run(args: argparse.Namespace) -> int:
    capacity = parse_size(args.capacity or _default_capacity(args.replay_json), name="--capacity")
    if capacity <= 0:
        raise ConfigError("--capacity", f"must be positive, got {args.capacity!r}")
    dwpd = _number(args.dwpd, "--dwpd")
    years = _number(args.years, "--years")
    drives = _drives(args.drives)
    target = _target_days(args.target_days)
    if args.replay_json is not None:
        reports = reports_from_replay(args.replay_json, capacity_bytes=capacity, dwpd=dwpd, years=years,
                                      drives=drives, target_days=target)
        if not reports:
            raise ConfigError("--replay-json", f"{args.replay_json}: no policies in the file")
    else:
        rate = parse_rate(args.write_rate, name="--write-rate")
        reports = {"": EnduranceReport(capacity, dwpd, years, rate, drives=drives or 1, target_days=target)}
    Console().print(_table(list(reports.values()), capacity, dwpd, years))
    if args.json is not None:
        args.json.write_bytes(orjson.dumps([r.to_dict() for r in reports.values()], option=orjson.OPT_INDENT_2))
    return 0


def _days(r: EnduranceReport) -> str:
    d = r.days_to_exhaustion
    return "never (no writes)" if math.isinf(d) else f"{d:,.1f} days ({d / 365:.2f} years)"


def _pct(x: float) -> str:
    return "-" if math.isinf(x) else f"{100 * x:,.1f}%"


def _table(reports: list[EnduranceReport], capacity: float, dwpd: float, years: float) -> Table:
    drives = reports[0].drives
    title = f"SSD endurance: {drives} x {format_size(capacity)}, {dwpd:g} DWPD over {years:g} years"
    t = Table(title=title, caption="1 year = 365 days; writable = capacity x DWPD x 365 x years")
    t.add_column("", no_wrap=True)
    for r in reports:
        t.add_column(r.label or "value", justify="right", overflow="fold")
    rows = [
        ("SSD write rate", lambda r: format_rate(r.write_rate_Bps)),
        ("days to exhaustion", _days),
        ("writable over the rated life", lambda r: f"{format_size(r.writable_bytes)} ({r.writable_bytes / 1e12:,.0f} TBW)"),
        ("daily write budget", lambda r: f"{format_size(r.daily_budget_bytes)}/day"),
        ("fraction of the budget used", lambda r: _pct(r.budget_fraction)),
        (f"min SSD per GPU for {years:g} y (86.4*B/DWPD TB)", lambda r: format_size(r.min_capacity_bytes)),
        (f"write rate allowed for {years:g} y", lambda r: format_rate(r.allowed_write_rate_Bps)),
    ]
    if reports[0].target_days is not None:
        days = reports[0].target_days
        rows += [
            (f"write rate allowed for {days:,.4g} days", lambda r: format_rate(r.target_write_rate_Bps)),
            (f"min SSD per GPU for {days:,.4g} days", lambda r: format_size(r.target_min_capacity_bytes)),
        ]
    for name, cell in rows:
        t.add_row(name, *(cell(r) for r in reports))
    return t
