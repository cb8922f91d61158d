"""Experiment 11: a fleet of nodes -- routing and a shared cluster tier (replay).

WEKA sessions over 1, 2, 4 and 8 nodes (--per-node sessions per node, so the
load per node stays the same), each node one GPU slice of the preset under
saria's policy, behind each router (round-robin, session affinity, prefix
with Dynamo's static tier weights, saria's tier-aware price), as islands and
with a cluster tier shared by the fleet. Reports fleet SSD writes, mean and
P90 TTFT, hits by source, network bytes and load balance.

    python experiments/11_fleet.py            # ~30 min on 2 cores
    python experiments/11_fleet.py --quick    # seconds

Writes results.csv, summary.json and fleet.png; each finished replay is also kept
under rows/ so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import json
import time

import _common as C

NAME = "11_fleet"
ROUTINGS = ("round-robin", "session", "prefix", "tier-aware")
COLUMNS = ("model", "nodes", "sessions", "cluster", "routing", "ttft_mean_s", "ttft_p90_s",
           "ttft_p99_s", "ssd_bytes_written", "network_bytes", "cluster_bytes_read",
           "hit_ratio_tokens", "gpu_hit_ratio_tokens", "dram_hit_ratio_tokens",
           "ssd_hit_ratio_tokens", "cluster_hit_ratio_tokens", "load_imbalance",
           "session_moves", "wall_s")


def _one(job: tuple) -> dict:
    from saria.sim.fleet import Fleet, FleetSpec
    from saria.sim.remote import RemoteTierModel
    from saria.sim.replay import make_setup, open_loop_arrivals
    from saria.traces.arrivals import ArrivalModel

    nodes, sessions, cluster, routing, args = job
    cached = args["rows"] / f"{nodes}-{'shared' if cluster else 'islands'}-{routing}.json"
    if cached.exists():  # a finished job of an interrupted run (same arguments)
        return json.loads(cached.read_text())
    trace = C.load_weka(sessions)
    preset = C.preset(args["model"])
    setup = make_setup("saria", preset, trace_block_size=int(trace.block_size))
    tier = RemoteTierModel.shared(preset.hardware, args["cluster_bytes"] * nodes, args["net_Bps"])
    spec = FleetSpec(nodes=nodes, routing=routing, cluster=tier if cluster else None)
    arrivals = open_loop_arrivals(trace, ArrivalModel.from_spec(args["arrivals"]))
    t0 = time.perf_counter()
    rep = Fleet(setup, spec).run(arrivals)
    row = {"model": args["model"], "nodes": nodes, "sessions": sessions,
           "cluster": "shared" if cluster else "islands", "routing": routing,
           "wall_s": round(time.perf_counter() - t0, 1)}
    row.update({k: v for k, v in rep.items() if k in COLUMNS and k not in row})
    print(json.dumps({k: row[k] for k in ("nodes", "cluster", "routing", "ttft_mean_s",
                                          "ssd_bytes_written", "wall_s")}), flush=True)
    cached.write_text(json.dumps(row))
    return row


def main() -> None:
    ap = C.parser(NAME, __doc__)
    ap.add_argument("--per-node", type=int, default=45, help="WEKA sessions per node (45)")
    ap.add_argument("--nodes", default="1,2,4,8", help="node counts (1,2,4,8)")
    ap.add_argument("--arrivals", default="window:12h", help="arrival model (window:12h)")
    ap.add_argument("--model", default="qwen3-8b", help="model preset (qwen3-8b)")
    ap.add_argument("--cluster-tb", type=float, default=1.0,
                    help="cluster tier memory per node, TB (1.0)")
    ap.add_argument("--net-gbps", type=float, default=40.0,
                    help="each node's network rate to the cluster, GB/s (40: the preset's)")
    args = ap.parse_args()
    t_start, plt = C.start(args)
    counts = [int(x) for x in args.nodes.split(",")]
    if args.quick:
        args.per_node, counts = 2, [1, 2]
    from saria.sim.parallel import parallel_map

    rows_dir = args.out / "rows" / f"{args.model}-{args.per_node}-{args.arrivals}-{args.cluster_tb}-{args.net_gbps}".replace(":", "")
    rows_dir.mkdir(parents=True, exist_ok=True)
    shared = {"model": args.model, "arrivals": args.arrivals, "cluster_bytes": args.cluster_tb * 1e12,
              "net_Bps": args.net_gbps * 1e9, "rows": rows_dir}
    jobs = []
    for n in counts:
        for cluster in (False, True):
            for routing in (ROUTINGS[:1] if n == 1 else ROUTINGS):
                jobs.append((n, min(args.per_node * n, 710), cluster, routing, shared))
    # the largest fleets first, so the pool's last jobs are short
    order = sorted(range(len(jobs)), key=lambda i: -jobs[i][0])
    done = parallel_map(_one, [jobs[i] for i in order], jobs=args.jobs)
    rows = [None] * len(jobs)
    for i, r in zip(order, done):
        rows[i] = r
    C.write_csv(args.out / "results.csv", rows, COLUMNS)
    summary = {"args": {k: str(v) for k, v in vars(args).items()}, "best": {},
               "seconds": round(time.perf_counter() - t_start)}
    for n in counts:
        for cl in ("islands", "shared"):
            rs = [r for r in rows if r["nodes"] == n and r["cluster"] == cl]
            summary["best"][f"{n}/{cl}"] = min(rs, key=lambda r: r["ttft_mean_s"])["routing"]
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))

    fig, axes = plt.subplots(2, 2, figsize=(11, 6.6), sharex=True)
    colors = dict(zip(ROUTINGS, ("#8c8c8c", "#4c72b0", "#dd8452", "#55a868")))
    for col, cl in enumerate(("islands", "shared")):
        for row, (key, scale, label) in enumerate((("ttft_mean_s", 1.0, "mean TTFT (s)"),
                                                   ("ssd_bytes_written", 1e-12,
                                                    "fleet SSD written (TB)"))):
            ax = axes[row][col]
            for routing in ROUTINGS:
                rs = [r for r in rows if r["cluster"] == cl and (r["routing"] == routing
                                                                 or r["nodes"] == 1)]
                ax.plot([r["nodes"] for r in rs], [r[key] * scale for r in rs], "o-",
                        color=colors[routing], label=routing)
            ax.set_xscale("log", base=2)
            ax.set_xticks(counts, [str(c) for c in counts])
            ax.set_ylabel(label)
            if row == 0:
                ax.set_title("islands" if cl == "islands" else "shared cluster tier", fontsize=9)
                ax.legend(fontsize=7)
            else:
                ax.set_xlabel("nodes")
    png = C.save_figure(fig, f"WEKA, {args.per_node} sessions per node, {args.model}: "
                        "routing x cluster tier", args.out / "fleet.png")
    C.done(t_start, [args.out / "results.csv", args.out / "summary.json", png])


if __name__ == "__main__":
    main()
