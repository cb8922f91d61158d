"""Experiment 1: the write/latency trade-off of every admission policy.

SSD bytes written versus mean and P90 TTFT for DRAM-only, full duplicate,
write-back, E2, E3, E5, R2, R4, E2+R2, HiCache's selective write-through, the
Dynamo KVBM frequency filter and `saria` (E2 + lazy promotion + paced
coordination), on the WEKA bundle (first 90 sessions, window:12h) and on one
GPU's share of the Mooncake conversation trace (its own arrival times), for
Qwen3-8B (full attention) and Qwen3.5-9B (hybrid), with the preset's defaults
(256 GB DRAM, one 3.84 TB Gen4 NVMe at 1 DWPD, H100 on PCIe Gen5).

Writes results.csv (one row per trace x model x policy), frontier.png (all four
settings) and frontier_weka_qwen3-8b.png (saria.sim.plot.frontier_plot of the
WEKA / Qwen3-8B panel, the README's figure).
"""

from __future__ import annotations

import _common as C

NAME = "01_write_latency"
POLICIES = ("dram-only", "full-duplicate", "write-back", "E2", "E3", "E5", "R2", "R4", "E2+R2",
            "hicache-selective", "kvbm-filter", "saria")
COLUMNS = ("trace", "model", "policy", "arrivals", "dram_bytes", "ssd_count", "requests",
           "ssd_bytes_written", "ssd_bytes_read", "writes_vs_full_duplicate_pct",
           "hit_ratio_tokens", "gpu_hit_ratio_tokens", "dram_hit_ratio_tokens",
           "ssd_hit_ratio_tokens", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
           "ttft_worst25_mean_s", "ttft_mean_vs_dram_only_pct", "ttft_p90_vs_dram_only_pct",
           "ssd_write_rate_Bps", "ssd_lifetime_days", "write_budget_fraction", "duration_s")


def main() -> None:
    ap = C.parser(NAME, __doc__)
    ap.add_argument("--sessions", type=int, default=C.WEKA_SESSIONS,
                    help=f"WEKA sessions (default {C.WEKA_SESSIONS})")
    args = ap.parse_args()
    t0, plt = C.start(args)
    sessions = 4 if args.quick else args.sessions
    weka = C.load_weka(sessions)
    mooncake = C.load_mooncake_share(limit=60 if args.quick else None)
    settings = (("weka", weka, C.WEKA_ARRIVALS), ("mooncake", mooncake, "trace"))

    rows = []
    for trace_name, trace, arrivals in settings:
        for model in C.MODELS:
            print(f"{trace_name} / {model}: {len(POLICIES)} policies ...", flush=True)
            rows += C.sweep(trace, C.preset(model), POLICIES, arrivals=(arrivals,),
                            jobs=args.jobs, trace=trace_name, model=model)
    _relative(rows)

    out = args.out
    csv_path = C.write_csv(out / "results.csv", rows, COLUMNS)
    png = _plot(plt, rows, out / "frontier.png")
    from saria.sim.plot import frontier_plot
    weka8 = [r for r in rows if r["trace"] == "weka" and r["model"] == "qwen3-8b"]
    png2 = frontier_plot(weka8, out / "frontier_weka_qwen3-8b.png",
                         title=f"WEKA, first {sessions} sessions, Qwen3-8B: SSD writes vs TTFT")
    _summary(rows)
    C.done(t0, [csv_path, png, png2])


def _relative(rows: list[dict]) -> None:
    """Adds the paper's two headline comparisons to every row of its setting."""
    for r in rows:
        same = [x for x in rows if x["trace"] == r["trace"] and x["model"] == r["model"]]
        fd = next(x for x in same if x["policy"] == "full-duplicate")
        do = next(x for x in same if x["policy"] == "dram-only")
        r["writes_vs_full_duplicate_pct"] = C.pct_change(r["ssd_bytes_written"],
                                                         fd["ssd_bytes_written"])
        r["ttft_mean_vs_dram_only_pct"] = C.pct_change(r["ttft_mean_s"], do["ttft_mean_s"])
        r["ttft_p90_vs_dram_only_pct"] = C.pct_change(r["ttft_p90_s"], do["ttft_p90_s"])


def _plot(plt, rows: list[dict], path):
    keys = sorted({(r["trace"], r["model"]) for r in rows}, key=lambda k: (k[0] != "weka", k[1]))
    fig, axes = plt.subplots(2, len(keys), figsize=(4.6 * len(keys), 7.6), squeeze=False)
    for col, (tr, model) in enumerate(keys):
        rs = [r for r in rows if (r["trace"], r["model"]) == (tr, model)]
        for row, (key, lab) in enumerate((("ttft_mean_s", "mean TTFT (s)"),
                                          ("ttft_p90_s", "P90 TTFT (s)"))):
            ax = axes[row][col]
            for r in rs:
                x, y = r["ssd_bytes_written"] / C.TB, r[key]
                star = r["policy"] == "saria"
                ax.scatter([x], [y], s=60 if star else 26, marker="*" if star else "o",
                           color="tab:red" if star else "tab:blue")
                ax.annotate(C.label(r["policy"]), (x, y), fontsize=7, xytext=(3, 3),
                            textcoords="offset points")
            ax.set_xlabel("SSD bytes written (TB)")
            ax.set_ylabel(lab)
            ax.grid(alpha=0.3)
            if row == 0:
                ax.set_title(f"{tr} / {model}", fontsize=9)
    return C.save_figure(fig, "Experiment 1: SSD writes vs TTFT (lower-left is better)", path,
                         dpi=90)


def _summary(rows: list[dict]) -> None:
    print(f"{'trace':9} {'model':11} {'policy':18} {'SSD TB':>7} {'vs FD':>7} "
          f"{'mean s':>8} {'vs DO':>7} {'P90 s':>8}")
    for r in rows:
        w = r["writes_vs_full_duplicate_pct"]
        t = r["ttft_mean_vs_dram_only_pct"]
        print(f"{r['trace']:9} {r['model']:11} {r['policy']:18} "
              f"{r['ssd_bytes_written'] / C.TB:7.2f} {'' if w is None else f'{w:+.1f}%':>7} "
              f"{r['ttft_mean_s']:8.2f} {'' if t is None else f'{t:+.1f}%':>7} "
              f"{r['ttft_p90_s']:8.2f}")


if __name__ == "__main__":
    main()
