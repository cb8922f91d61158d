"""Experiment 5: SSD endurance per policy and per load level.

Every SSD-writing policy on the WEKA slice (first 90 sessions, 256 GB DRAM, one
3.84 TB Gen4 NVMe) at three load levels (session-start windows of 12 h, 2 h and
40 min), for Qwen3-8B and Qwen3.5-9B. The replay's write rate (SSD bytes
written / replayed span) is taken as the sustained rate of continuous operation,
and saria.endurance turns it into the days until a 3.84 TB, 1-DWPD, 5-year drive
has used its rated writes (7,008 TBW), the share of the daily budget used, and
the minimum SSD capacity per GPU for a 5-year life (SARIA §2.2:
C_min = 86.4 x B / DWPD TB at B GB/s), also as a number of such drives.

Writes results.csv (one row per model x window x policy) and endurance.png.
"""

from __future__ import annotations

import math

import _common as C

NAME = "05_endurance"
POLICIES = ("full-duplicate", "write-back", "E2", "E3", "E5", "R2", "R4", "E2+R2",
            "hicache-selective", "kvbm-filter", "saria")
WINDOWS = ("12h", "2h", "40m")
DRIVE_BYTES = 3.84e12
DWPD = 1.0
YEARS = 5.0
COLUMNS = ("model", "policy", "window", "arrivals", "requests", "duration_s", "ssd_bytes_written",
           "write_rate_GBps", "days_to_exhaustion", "years_to_exhaustion", "budget_fraction",
           "min_ssd_tb_5y", "drives_needed_5y", "meets_5y", "ttft_mean_s", "hit_ratio_tokens")


def main() -> None:
    ap = C.parser(NAME, __doc__)
    ap.add_argument("--sessions", type=int, default=C.WEKA_SESSIONS,
                    help=f"WEKA sessions (default {C.WEKA_SESSIONS})")
    args = ap.parse_args()
    t0, plt = C.start(args)
    from saria.endurance import EnduranceReport
    sessions = 4 if args.quick else args.sessions
    windows = ("12h", "40m") if args.quick else WINDOWS
    trace = C.load_weka(sessions)
    rows = []
    for model in C.MODELS:
        print(f"{model}: {len(POLICIES)} policies x {len(windows)} windows ...", flush=True)
        got = C.sweep(trace, C.preset(model), POLICIES, arrivals=[f"window:{w}" for w in windows],
                      jobs=args.jobs, model=model)
        for r in got:
            r["window"] = r["arrivals"].split(":", 1)[1]
            rate = r["ssd_write_rate_Bps"]
            e = EnduranceReport(capacity_bytes=DRIVE_BYTES, dwpd=DWPD, years=YEARS,
                                write_rate_Bps=rate)
            days = e.days_to_exhaustion
            r["write_rate_GBps"] = rate / C.GB
            r["days_to_exhaustion"] = None if math.isinf(days) else days
            r["years_to_exhaustion"] = None if math.isinf(days) else e.years_to_exhaustion
            r["budget_fraction"] = e.budget_fraction
            r["min_ssd_tb_5y"] = e.min_capacity_bytes / C.TB
            r["drives_needed_5y"] = max(1, math.ceil(e.min_capacity_bytes / DRIVE_BYTES - 1e-9))
            r["meets_5y"] = days >= 365 * YEARS
        rows += got
    csv_path = C.write_csv(args.out / "results.csv", rows, COLUMNS)
    png = _plot(plt, rows, windows, args.out / "endurance.png")
    for r in rows:
        d = r["days_to_exhaustion"]
        print(f"{r['model']:11} {r['window']:>4} {r['policy']:18} {r['write_rate_GBps']:6.3f} GB/s  "
              f"{'never' if d is None else f'{d:8,.0f} days'}  min SSD {r['min_ssd_tb_5y']:6.2f} TB "
              f"({r['drives_needed_5y']} x 3.84 TB)")
    C.done(t0, [csv_path, png])


def _plot(plt, rows, windows, path):
    models = list(C.MODELS)
    fig, axes = plt.subplots(2, len(models), figsize=(6 * len(models), 7.5), squeeze=False)
    width = 0.8 / len(windows)
    for mi, model in enumerate(models):
        for k, (key, ylabel) in enumerate((("days_to_exhaustion", "days to exhaustion (log)"),
                                           ("min_ssd_tb_5y", "min SSD per GPU, 5 years (TB)"))):
            ax = axes[k][mi]
            for wi, w in enumerate(windows):
                ys = [next((r[key] or 1e6) for r in rows
                           if (r["model"], r["window"], r["policy"]) == (model, w, p))
                      for p in POLICIES]
                ax.bar([x + (wi - (len(windows) - 1) / 2) * width for x in range(len(POLICIES))],
                       ys, width, label=f"window {w}")
            if key == "days_to_exhaustion":
                ax.set_yscale("log")
                ax.axhline(365 * YEARS, color="k", ls="--", lw=1)
                ax.text(0, 365 * YEARS * 1.1, "5-year rating", fontsize=7)
            else:
                ax.axhline(DRIVE_BYTES / C.TB, color="k", ls="--", lw=1)
                ax.text(0, DRIVE_BYTES / C.TB * 1.05, "one 3.84 TB drive", fontsize=7)
            ax.set_xticks(range(len(POLICIES)), [C.label(p) for p in POLICIES], rotation=35,
                          ha="right", fontsize=7)
            ax.set_ylabel(ylabel, fontsize=8)
            ax.grid(alpha=0.3, axis="y")
            if k == 0:
                ax.set_title(f"{model} (3.84 TB, 1 DWPD)", fontsize=9)
    axes[0][0].legend(fontsize=7)
    return C.save_figure(fig, "Experiment 5: SSD endurance per policy and load", path)


if __name__ == "__main__":
    main()
