"""``saria bench remote``: the cluster tier against Mooncake's own calls.

    saria bench remote [--sizes 1MiB,4MiB,16MiB] [--batch 8] [--reps 10]
                       [--lookup-keys 64] [--lookup-calls 500] [--compare-row-mac] [--json PATH]

Starts a ``mooncake_master`` and a holder node on loopback (needs the
``[mooncake]`` extra); see ``saria.bench.remote_bench``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson
from rich.console import Console
from rich.table import Table

from saria.errors import ConfigError
from saria.units import parse_size


def add_remote_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "remote", help="the cluster tier (Mooncake Store) beside Mooncake's own calls",
        description="Put and get of the same objects through RemoteTier and through Mooncake's "
        "zero-copy calls in one run (a local master and a holder node, loopback TCP), and "
        "batch_is_exist latency beside RemoteTier.exists.")
    p.add_argument("--sizes", default="1MiB,4MiB,16MiB",
                   help="object sizes, comma-separated (default 1MiB,4MiB,16MiB)")
    p.add_argument("--batch", type=int, default=8, help="objects per call (default 8)")
    p.add_argument("--reps", type=int, default=10, help="repetitions per size (default 10)")
    p.add_argument("--lookup-keys", type=int, default=64, help="keys per lookup (default 64)")
    p.add_argument("--lookup-calls", type=int, default=500, help="lookups per mode (default 500)")
    p.add_argument("--compare-row-mac", action="store_true",
                   help="also put and get unsigned rows (no MAC) in the same run: what signing costs")
    p.add_argument("--json", type=Path, default=None, metavar="PATH")
    p.set_defaults(func=run_remote)


def run_remote(args: argparse.Namespace) -> int:
    from saria.tiers.remote import mooncake_available

    sizes = [int(parse_size(s.strip(), name="--sizes")) for s in args.sizes.split(",") if s.strip()]
    if not sizes or min(sizes) < 4096:
        raise ConfigError("--sizes", "give object sizes of at least 4 KiB")
    for name in ("batch", "reps", "lookup_keys", "lookup_calls"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')}", f"must be at least 1, got {getattr(args, name)}")
    why = mooncake_available()
    if why is not None:
        raise ConfigError("mooncake", why)
    from saria.bench.remote_bench import run_remote_bench

    err = Console(stderr=True)
    res = run_remote_bench(sizes, batch=args.batch, reps=args.reps, lookup_keys=args.lookup_keys,
                           lookup_calls=args.lookup_calls, compare_row_mac=args.compare_row_mac,
                           progress=lambda what: err.print(f"[dim]saria bench remote: {what}[/]"))
    t = Table(title=f"saria bench remote: {res['transport']}, medians of {args.reps} (GB/s of payload)")
    for col in ("object", "raw put", "saria put", "ratio (paired)", "raw get", "saria get",
                "ratio (paired)"):
        t.add_column(col, justify="right")
    for r in res["sizes"]:
        t.add_row(f"{r['object_bytes'] / 2**20:g} MiB x {r['batch']}",
                  f"{r['raw_put_GBps']:.2f}", f"{r['saria_put_GBps']:.2f}",
                  f"{r['put_ratio']:.2f} ({r['put_paired_ratio']:.2f})",
                  f"{r['raw_get_GBps']:.2f}", f"{r['saria_get_GBps']:.2f}",
                  f"{r['get_ratio']:.2f} ({r['get_paired_ratio']:.2f})")
    Console().print(t)
    t = Table(title="row MAC (HMAC-SHA256): raw cost per block in memory"
              + ("; signed over unsigned rows, paired medians" if args.compare_row_mac else ""))
    cols = ["object", "sign µs", "verify µs", "sign GB/s", "verify GB/s"]
    if args.compare_row_mac:
        cols += ["unsigned put", "unsigned get", "put signed/unsigned", "get signed/unsigned"]
    for col in cols:
        t.add_column(col, justify="right")
    for r in res["sizes"]:
        m = r["mac"]
        row = [f"{r['object_bytes'] / 2**20:g} MiB", f"{m['sign_us']:,.0f}", f"{m['verify_us']:,.0f}",
               f"{m['sign_GBps']:.2f}", f"{m['verify_GBps']:.2f}"]
        if args.compare_row_mac:
            row += [f"{r['unsigned_put_GBps']:.2f}", f"{r['unsigned_get_GBps']:.2f}",
                    f"{r['put_mac_paired_ratio']:.2f}", f"{r['get_mac_paired_ratio']:.2f}"]
        t.add_row(*row)
    Console().print(t)
    t = Table(title="a cluster-only prefix loaded through the cache core beside the tier alone "
              "(GB/s of payload)")
    for col in ("blocks", "tier: exists + get", "core: lookup + load", "ratio (paired)"):
        t.add_column(col, justify="right")
    for r in res["core"]:
        t.add_row(f"{r['object_bytes'] / 2**20:g} MiB x {r['batch']}", f"{r['tier_GBps']:.2f}",
                  f"{r['core_GBps']:.2f}", f"{r['core_paired_ratio']:.2f}")
    Console().print(t)
    lk = res["lookup"]
    t = Table(title=f"lookup of {lk['keys']} keys ({lk['calls']} calls each, µs)")
    for col in ("path", "p50", "p99"):
        t.add_column(col, justify="right")
    for mode in ("raw", "saria"):
        t.add_row(mode, f"{lk[f'{mode}_p50_us']:,.0f}", f"{lk[f'{mode}_p99_us']:,.0f}")
    Console().print(t)
    if args.json:
        args.json.write_bytes(orjson.dumps(res, option=orjson.OPT_INDENT_2))
    return 0
