"""``saria replay --nodes N``: a fleet of nodes behind a router.

    saria replay --nodes 4 --routing tier-aware --routing prefix --cluster 4TB

One admission policy (default ``saria``) on every node; each ``--routing``
is one fleet replay of the same arrivals. ``--cluster SIZE`` shares a
cluster tier of SIZE between the nodes (default: islands).
"""

from __future__ import annotations

import argparse
import functools
import time

import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from saria.errors import ConfigError
from saria.sim.fleet import ROUTINGS, Fleet, FleetSpec
from saria.sim.parallel import available_cpus, parallel_map
from saria.sim.remote import RemoteTierModel
from saria.sim.replay import ReadPath, make_setup, open_loop_arrivals
from saria.traces.arrivals import ArrivalModel
from saria.units import format_size, parse_size


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=None, metavar="N",
                   help="replay a fleet of N nodes behind a router (see --routing, --cluster)")
    p.add_argument("--routing", action="append", default=None, choices=ROUTINGS,
                   help=f"fleet routing (repeatable; default: all of {', '.join(ROUTINGS)})")
    p.add_argument("--cluster", default=None, metavar="SIZE",
                   help="a cluster tier of SIZE shared by the fleet's nodes (default: islands)")
    p.add_argument("--cluster-net", default=None, metavar="RATE",
                   help="each node's network rate to the cluster tier, bytes/s (default: the "
                        "preset's, 40GB)")
    p.add_argument("--fail", action="append", default=[], metavar="NODE@FROM-UNTIL",
                   help="node NODE is down from FROM to UNTIL seconds of the trace (repeatable)")


def fleet_spec(args: argparse.Namespace, routing: str, hw) -> FleetSpec:
    cluster = None
    if args.cluster_net is not None and args.cluster is None:
        raise ConfigError("--cluster-net", "needs --cluster SIZE")
    if args.cluster is not None:
        size = parse_size(args.cluster, name="--cluster")
        net = None
        if args.cluster_net is not None:
            net = parse_size(args.cluster_net, name="--cluster-net")
            if not net > 0:
                raise ConfigError("--cluster-net", f"must be positive, got {args.cluster_net!r}")
        cluster = RemoteTierModel.shared(hw, size, net)
    down = []
    for f in args.fail:
        try:
            node, span = f.split("@")
            lo, hi = span.split("-")
            down.append((int(node), float(lo), float(hi)))
        except ValueError:
            raise ConfigError("--fail", f"{f!r} is not NODE@FROM-UNTIL (e.g. 1@3600-7200)") from None
        if not 0 <= down[-1][0] < args.nodes:
            raise ConfigError("--fail", f"node {down[-1][0]} is not one of the {args.nodes} nodes")
    return FleetSpec(nodes=args.nodes, routing=routing, cluster=cluster, down=tuple(down))


def run_fleet(args: argparse.Namespace, cfg: dict, trace, path, spec: str) -> int:
    if len(cfg["policies"]) > 1:
        raise ConfigError("--policy", "a fleet replay runs one admission policy on every node")
    routings = args.routing or list(ROUTINGS)
    specs = [fleet_spec(args, r, cfg["preset"].hardware) for r in routings]  # flags before work
    arrivals_model = ArrivalModel.from_spec(spec)
    if arrivals_model.closed_loop:
        raise ConfigError("--arrivals", "a fleet replay takes open-loop arrivals (window:, "
                          "poisson:, trace)")
    arrivals = open_loop_arrivals(trace, arrivals_model, args.max_context)
    name = cfg["policies"][0]
    read_path = ReadPath(args.lookup, args.promotion, args.coordinator, args.r)
    # one setup per fleet: a setup's admission and promotion objects keep state
    setups = [make_setup(name, cfg["preset"], read_path=read_path, dram_bytes=cfg["dram"],
                         ssd_bytes=cfg["ssd"], trace_block_size=int(trace.block_size))
              for _ in specs]
    jobs = min(args.jobs or available_cpus(), len(specs))
    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn())
    with Progress(*cols, console=Console(stderr=True), transient=True) as bar:
        side = f" ({jobs} side by side)" if jobs > 1 else ""
        task = bar.add_task(f"{args.nodes} nodes: {', '.join(routings)}{side}",
                            total=len(arrivals) * len(specs))
        run = functools.partial(_run_one, arrivals)
        reports = parallel_map(run, list(zip(specs, setups)), jobs=jobs, item_progress=True,
                               progress=lambda d: bar.update(task, completed=d))
    results = {fs.routing: rep for fs, rep in zip(specs, reports)}
    config = {"trace": str(path), "sessions": trace.num_sessions, "requests": len(arrivals),
              "arrivals": spec, "preset": cfg["preset"].name, "policy": name,
              "nodes": args.nodes, "cluster_bytes": specs[0].cluster.capacity_bytes
              if specs[0].cluster else 0}
    Console().print(_table(results, config))
    if args.json is not None:
        args.json.write_bytes(orjson.dumps({"config": config, "routings": results},
                                           option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    return 0


def _run_one(arrivals, job: tuple, report) -> dict:
    """One routing's fleet replay (in a worker of ``parallel_map``)."""
    fs, setup = job
    t0 = time.perf_counter()
    rep = Fleet(setup, fs).run(arrivals, report)
    rep["wall_s"] = time.perf_counter() - t0
    return rep


ROWS = (
    ("TTFT mean", lambda r: f"{r['ttft_mean_s']:.2f} s"),
    ("TTFT P90", lambda r: f"{r['ttft_p90_s']:.2f} s"),
    ("TTFT P99", lambda r: f"{r['ttft_p99_s']:.2f} s"),
    ("SSD written (fleet)", lambda r: format_size(r["ssd_bytes_written"])),
    ("shortest SSD lifetime", lambda r: "-" if r["ssd_lifetime_days_min"] is None
     else f"{r['ssd_lifetime_days_min']:,.0f} d"),
    ("network (cluster)", lambda r: format_size(r["network_bytes"])),
    ("hit ratio (tokens)", lambda r: f"{r['hit_ratio_tokens']:.3f}"),
    *((f"  from {m}", (lambda m: lambda r: f"{r[m.lower() + '_hit_ratio_tokens']:.3f}")(m))
      for m in ("GPU", "DRAM", "SSD", "CLUSTER")),
    ("load imbalance (max/mean)", lambda r: f"{r['load_imbalance']:.2f}"),
    ("session moves", lambda r: f"{r['session_moves']:,}"),
)


def _table(results: dict, config: dict) -> Table:
    cl = format_size(config["cluster_bytes"]) + " shared" if config["cluster_bytes"] else "islands"
    t = Table(title=f"{config['nodes']} nodes, {config['policy']}, {cl}",
              caption=f"{config['sessions']} sessions, {config['arrivals']}, {config['preset']}")
    t.add_column("")
    for r in results:
        t.add_column(r, justify="right")
    for name, fmt in ROWS:
        t.add_row(name, *(fmt(rep) for rep in results.values()))
    return t
