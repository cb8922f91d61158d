"""Experiment 2: cache pressure -- session-start windows and DRAM sizes.

The same trade-off as experiment 1 under more or less pressure: the WEKA slice
(first 90 sessions) with its sessions started uniformly at random in a 10-minute,
40-minute, 2-hour or 12-hour window (the paper compares 2 h with 12 h and sweeps
10 to 40 minutes), times DRAM pools of 16, 64 and 256 GB, for DRAM-only, full
duplicate, E2 and saria (add others with --policy E3 --policy R4 ...; each
policy adds about 80 s), on Qwen3-8B and Qwen3.5-9B. A shorter
window means the same work arrives in less time (more concurrent sessions
competing for DRAM and for the GPU).

Writes results.csv (one row per model x DRAM x window x policy) and
pressure.png (SSD writes and mean TTFT against the window, per model and DRAM).
"""

from __future__ import annotations

import _common as C

NAME = "02_cache_pressure"
POLICIES = ("dram-only", "full-duplicate", "E2", "saria")
WINDOWS = ("10m", "40m", "2h", "12h")
DRAMS_GB = (16, 64, 256)
COLUMNS = ("model", "policy", "window", "arrivals", "dram_bytes", "dram_gb", "ssd_count",
           "requests", "ssd_bytes_written", "ssd_bytes_read", "writes_vs_full_duplicate_pct",
           "hit_ratio_tokens", "dram_hit_ratio_tokens", "ssd_hit_ratio_tokens", "dram_evictions",
           "ttft_mean_s", "ttft_p90_s", "ttft_worst25_mean_s", "ttft_mean_vs_dram_only_pct",
           "ssd_write_rate_Bps", "write_budget_fraction", "duration_s")


def main() -> None:
    ap = C.parser(NAME, __doc__)
    ap.add_argument("--sessions", type=int, default=C.WEKA_SESSIONS,
                    help=f"WEKA sessions (default {C.WEKA_SESSIONS})")
    ap.add_argument("--policy", action="append", default=None, metavar="NAME",
                    help=f"extra policy beyond {', '.join(POLICIES)} (repeatable)")
    args = ap.parse_args()
    t0, plt = C.start(args)
    policies = POLICIES + tuple(p for p in (args.policy or []) if p not in POLICIES)
    sessions = 4 if args.quick else args.sessions
    windows = ("10m", "12h") if args.quick else WINDOWS
    drams = (16, 256) if args.quick else DRAMS_GB
    trace = C.load_weka(sessions)
    rows = []
    for model in C.MODELS:
        print(f"{model}: {len(policies)} policies x {len(drams)} DRAM x {len(windows)} windows ...",
              flush=True)
        got = C.sweep(trace, C.preset(model), policies, drams=[g * C.GB for g in drams],
                      arrivals=[f"window:{w}" for w in windows], jobs=args.jobs, model=model)
        for r in got:
            r["window"] = r["arrivals"].split(":", 1)[1]
            r["dram_gb"] = round(r["dram_bytes"] / C.GB)
        rows += got
    for r in rows:
        same = [x for x in rows if (x["model"], x["window"], x["dram_gb"])
                == (r["model"], r["window"], r["dram_gb"])]
        fd = next(x for x in same if x["policy"] == "full-duplicate")
        do = next(x for x in same if x["policy"] == "dram-only")
        r["writes_vs_full_duplicate_pct"] = C.pct_change(r["ssd_bytes_written"], fd["ssd_bytes_written"])
        r["ttft_mean_vs_dram_only_pct"] = C.pct_change(r["ttft_mean_s"], do["ttft_mean_s"])
    csv_path = C.write_csv(args.out / "results.csv", rows, COLUMNS)
    png = _plot(plt, rows, policies, windows, drams, args.out / "pressure.png")
    for model in C.MODELS:
        for w in windows:
            for g in drams:
                sel = {r["policy"]: r for r in rows
                       if (r["model"], r["window"], r["dram_gb"]) == (model, w, g)}
                print(f"{model:11} window {w:>4} DRAM {g:>3} GB: "
                      + "  ".join(f"{C.label(p)} {sel[p]['ssd_bytes_written'] / C.TB:.2f} TB/"
                                  f"{sel[p]['ttft_mean_s']:.1f} s" for p in policies))
    C.done(t0, [csv_path, png])


def _plot(plt, rows, policies, windows, drams, path):
    models = list(C.MODELS)
    fig, axes = plt.subplots(2 * len(models), len(drams),
                             figsize=(4.2 * len(drams), 3.0 * 2 * len(models)), squeeze=False)
    xs = list(range(len(windows)))
    for mi, model in enumerate(models):
        for di, g in enumerate(drams):
            for k, (key, ylabel, scale) in enumerate((("ssd_bytes_written", "SSD written (TB)", C.TB),
                                                      ("ttft_mean_s", "mean TTFT (s)", 1.0))):
                ax = axes[2 * mi + k][di]
                for p in policies:
                    ys = [next(r[key] for r in rows if (r["model"], r["window"], r["dram_gb"],
                                                         r["policy"]) == (model, w, g, p)) / scale
                          for w in windows]
                    ax.plot(xs, ys, marker="o", ms=3, lw=1.2 if p != "saria" else 2.2,
                            label=C.label(p))
                ax.set_xticks(xs, windows)
                ax.set_ylabel(ylabel, fontsize=8)
                if key == "ttft_mean_s":
                    ax.set_yscale("log")
                ax.grid(alpha=0.3)
                ax.set_title(f"{model}, DRAM {g} GB", fontsize=8)
                if k == 1 and mi == len(models) - 1:
                    ax.set_xlabel("session-start window (shorter = more pressure)", fontsize=8)
    axes[0][-1].legend(fontsize=7, ncol=2)
    return C.save_figure(fig, "Experiment 2: cache pressure (WEKA slice)", path)


if __name__ == "__main__":
    main()
