"""Experiment 4: cumulative ablation of the read path, with one SSD and with two.

E2 admission throughout; each step adds one mechanism to the previous one:

  base                 per-tier metadata (no history kept across eviction),
                       tier-by-tier lookup, no promotion, serial DRAM-then-SSD reload
  +unified metadata    one radix tree whose history outlives residency
  +mixed-source lookup the reload plan takes each block from any tier
                       (DRAM[0:40] SSD[40:90] DRAM[90:120] recovered whole)
  +partial promotion   lazy partial promotion of SSD hits into DRAM (share r
                       from the bandwidths, 60 s recency cutoff)
  +overlap             DRAM and SSD segments reloaded at once (naive overlap)
  +coordination        paced: SSD at full speed, DRAM on the residual ingress
                       (= the `saria` policy)

on the WEKA slice (first 90 sessions) at the default load (sessions started in a
12-hour window, 256 GB of DRAM; `--window 2h --dram 64` gives a setting where one
GPU cannot keep up and TTFT measures the queue), for Qwen3-8B and Qwen3.5-9B, one and two Gen4 NVMe drives. The paper
(§5.2) reports the complete configuration 5.8% (Qwen3-8B) and 6.4% (Qwen3.5-9B)
below Base in mean TTFT.

Writes results.csv (one row per model x SSD count x step) and ablation.png.
"""

from __future__ import annotations

import _common as C

NAME = "04_read_path_ablation"
COLUMNS = ("model", "ssd_count", "step_index", "step", "keep_history", "lookup", "promotion",
           "coordinator", "arrivals", "dram_bytes", "requests", "ttft_mean_s", "ttft_p90_s",
           "ttft_worst25_mean_s", "ttft_mean_vs_base_pct", "ttft_mean_vs_prev_pct",
           "reload_s_total", "reload_vs_base_pct", "hit_ratio_tokens", "dram_hit_ratio_tokens",
           "ssd_hit_ratio_tokens", "tier_by_tier_hit_blocks", "unified_hit_blocks",
           "ssd_bytes_read", "ssd_bytes_written", "promoted_blocks", "dram_evictions")


def steps():
    from saria.sim.replay import ReadPath
    return (
        ("base", False, ReadPath("tier-by-tier", "none", "serial")),
        ("+unified metadata", True, ReadPath("tier-by-tier", "none", "serial")),
        ("+mixed-source lookup", True, ReadPath("unified", "none", "serial")),
        ("+partial promotion", True, ReadPath("unified", "lazy", "serial")),
        ("+overlap", True, ReadPath("unified", "lazy", "overlap")),
        ("+coordination", True, ReadPath("unified", "lazy", "paced")),
    )


def main() -> None:
    ap = C.parser(NAME, __doc__)
    ap.add_argument("--sessions", type=int, default=C.WEKA_SESSIONS,
                    help=f"WEKA sessions (default {C.WEKA_SESSIONS})")
    ap.add_argument("--dram", type=float, default=256, help="DRAM pool in GB (default 256)")
    ap.add_argument("--window", default="12h", help="session-start window (default 12h)")
    args = ap.parse_args()
    t0, plt = C.start(args)
    sessions = 4 if args.quick else args.sessions
    trace = C.load_weka(sessions)
    arrivals = f"window:{args.window}"
    jobs = []
    for model in C.MODELS:
        for ssds in (1, 2):
            p = C.preset(model, ssd_count=ssds)
            for i, (step, keep, rp) in enumerate(steps()):
                tags = dict(model=model, step_index=i, step=step)
                jobs.append((tags, "weka", "E2", p, rp,
                             dict(dram_bytes=args.dram * C.GB, keep_history=keep), arrivals))
    print(f"{len(jobs)} replays ...", flush=True)
    rows = C.run_many({"weka": trace}, jobs, args.jobs)
    for r in rows:
        same = [x for x in rows if (x["model"], x["ssd_count"]) == (r["model"], r["ssd_count"])]
        base = same[0]
        prev = same[max(0, r["step_index"] - 1)]
        r["ttft_mean_vs_base_pct"] = C.pct_change(r["ttft_mean_s"], base["ttft_mean_s"])
        r["ttft_mean_vs_prev_pct"] = C.pct_change(r["ttft_mean_s"], prev["ttft_mean_s"])
        r["reload_vs_base_pct"] = C.pct_change(r["reload_s_total"], base["reload_s_total"])
    csv_path = C.write_csv(args.out / "results.csv", rows, COLUMNS)
    png = _plot(plt, rows, args.out / "ablation.png")
    for r in rows:
        v = r["ttft_mean_vs_base_pct"]
        print(f"{r['model']:11} {r['ssd_count']} SSD  {r['step']:22} mean TTFT "
              f"{r['ttft_mean_s']:8.2f} s ({v:+5.1f}% vs base)  P90 {r['ttft_p90_s']:8.2f} s  "
              f"reload {r['reload_s_total']:9.1f} s  SSD read {r['ssd_bytes_read'] / C.TB:6.2f} TB")
    C.done(t0, [csv_path, png])


def _plot(plt, rows, path):
    models = list(C.MODELS)
    names = [s[0] for s in steps()]
    fig, axes = plt.subplots(3, len(models), figsize=(5.5 * len(models), 9), squeeze=False)
    for mi, model in enumerate(models):
        for k, (key, ylabel) in enumerate((("ttft_mean_s", "mean TTFT (s)"),
                                           ("ttft_p90_s", "P90 TTFT (s)"),
                                           ("reload_s_total", "total reload time (s)"))):
            ax = axes[k][mi]
            for j, ssds in enumerate((1, 2)):
                ys = [next(r[key] for r in rows if (r["model"], r["ssd_count"], r["step"])
                           == (model, ssds, s)) for s in names]
                ax.bar([x + (j - 0.5) * 0.38 for x in range(len(names))], ys, 0.38,
                       label=f"{ssds} SSD")
            ax.set_xticks(range(len(names)), names, rotation=25, ha="right", fontsize=7)
            ax.set_ylabel(ylabel, fontsize=8)
            ax.grid(alpha=0.3, axis="y")
            if k == 0:
                ax.set_title(model, fontsize=9)
    axes[0][0].legend(fontsize=7)
    return C.save_figure(fig, "Experiment 4: cumulative read-path ablation (E2 admission)", path)


if __name__ == "__main__":
    main()
