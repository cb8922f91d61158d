"""``saria store``: tools for an SSD store's drive directories.

    saria store check DIR [DIR ...] [--json] [--buffered]

``check`` scans each drive offline -- every slot read and verified (header
and payload crc), the journal read and compared with what the slots hold --
and reports what it finds. Exit 0 when every slot that holds a record
verifies and the journal is usable (or absent), 1 when it found corrupt or
torn slots or an unusable journal, 2 on bad input (no saria data file).
Run it on a store no cache has open (a running owner keeps writing).
"""

from __future__ import annotations

import argparse

import orjson
from rich.console import Console
from rich.table import Table

from saria.units import format_size


def register(subparsers: argparse._SubParsersAction) -> None:
    st = subparsers.add_parser("store", help="SSD store tools (offline check)",
                               description=__doc__.split("\n\n")[0])
    sub = st.add_subparsers(dest="store_command", metavar="SUBCOMMAND")
    sub.required = True
    c = sub.add_parser("check", help="scan drive directories offline and report what they hold",
                       description=__doc__.split("\n\n", 1)[1])
    c.add_argument("dirs", nargs="+", metavar="DIR", help="a drive directory (holds saria-ssd.data)")
    c.add_argument("--json", action="store_true", help="print the figures as JSON")
    c.add_argument("--buffered", action="store_true",
                   help="read through the page cache (a filesystem without O_DIRECT)")
    c.set_defaults(func=run_check)


def problems(r: dict) -> list[str]:
    out = []
    if r["bad_headers"]:
        out.append(f"{r['bad_headers']} slot(s) with a torn or corrupt header")
    if r["bad_payloads"]:
        out.append(f"{r['bad_payloads']} slot(s) whose payload crc fails")
    if r["read_errors"]:
        out.append(f"{r['read_errors']} slot(s) unreadable")
    if r["journal"].startswith("unusable"):
        out.append(f"journal {r['journal']}")
    return out


def run_check(args: argparse.Namespace) -> int:
    from saria.tiers.ssd import check_drive

    reports = [check_drive(d, direct=not args.buffered) for d in args.dirs]
    bad = any(problems(r) for r in reports)
    if args.json:
        print(orjson.dumps([{**r, "problems": problems(r)} for r in reports],
                           option=orjson.OPT_INDENT_2).decode())
        return 1 if bad else 0
    t = Table(title="saria store check")
    for c in ("drive", "blocks", "slots", "empty", "bad headers", "bad payloads", "superseded",
              "journal", "entries", "stale", "unlisted", "read"):
        t.add_column(c, justify="left" if c in ("drive", "journal") else "right")
    for r in reports:
        t.add_row(r["path"], f"{r['records']:,}", f"{r['capacity_slots']:,}", f"{r['empty_slots']:,}",
                  str(r["bad_headers"]), str(r["bad_payloads"]), str(r["superseded"]), r["journal"],
                  f"{r['journal_entries']:,}", str(r["journal_stale"]), str(r["journal_missing"]),
                  format_size(r["bytes_read"], binary=True))
    con = Console()
    con.print(t)
    for r in reports:
        for p in problems(r):
            con.print(f"{r['path']}: {p}")
    con.print("stale: journal entries whose slot holds something else (a miss when loaded); "
              "unlisted: records the journal does not list (a write a crash cut before its entry)")
    return 1 if bad else 0
