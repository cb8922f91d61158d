"""Experiment 3: where reloads come from, and how many SSD writes are ever read.

For the write-all policies (full duplicate, write-back) and SARIA's (E2, saria)
on the WEKA slice (first 90 sessions, 256 GB DRAM), at four load levels
(session-start windows of 12 h = low load, 2 h, 40 min, 10 min = high load):
the share of cache-hit bytes served by DRAM versus SSD, and the fraction of
distinct blocks written to the SSD that no request ever read back from it.
The paper (§3.1, TraceLab, full duplicate) reports 82.5% of SSD writes unread
at low load (12 h) and 44.3% at high load (2 h), and DRAM supplying 76.9% vs
44.2% of cache-read bytes.

Writes results.csv (one row per model x window x policy) and sources.png.
"""

from __future__ import annotations

import _common as C

NAME = "03_reload_sources"
POLICIES = ("full-duplicate", "write-back", "E2", "saria")
WINDOWS = ("12h", "2h", "40m", "10m")
COLUMNS = ("model", "policy", "window", "arrivals", "dram_bytes", "requests",
           "dram_hit_bytes_share", "ssd_hit_bytes_share", "ssd_writes_never_read_fraction",
           "ssd_blocks_written_distinct", "ssd_bytes_written", "ssd_bytes_read",
           "gpu_hit_ratio_tokens", "dram_hit_ratio_tokens", "ssd_hit_ratio_tokens",
           "hit_ratio_tokens", "ttft_mean_s")
PAPER = {"12h": 0.825, "2h": 0.443}  # §3.1: SSD writes never read, low vs high load


def main() -> None:
    ap = C.parser(NAME, __doc__)
    ap.add_argument("--sessions", type=int, default=C.WEKA_SESSIONS,
                    help=f"WEKA sessions (default {C.WEKA_SESSIONS})")
    ap.add_argument("--dram", type=float, default=256, help="DRAM pool in GB (default 256)")
    args = ap.parse_args()
    t0, plt = C.start(args)
    sessions = 4 if args.quick else args.sessions
    windows = ("12h", "10m") if args.quick else WINDOWS
    trace = C.load_weka(sessions)
    rows = []
    for model in C.MODELS:
        print(f"{model}: {len(POLICIES)} policies x {len(windows)} windows ...", flush=True)
        got = C.sweep(trace, C.preset(model), POLICIES, drams=[args.dram * C.GB],
                      arrivals=[f"window:{w}" for w in windows], jobs=args.jobs, model=model)
        for r in got:
            r["window"] = r["arrivals"].split(":", 1)[1]
            hit = r["dram_hit_ratio_tokens"] + r["ssd_hit_ratio_tokens"]
            r["ssd_hit_bytes_share"] = r["ssd_hit_ratio_tokens"] / hit if hit else 0.0
        rows += got
    csv_path = C.write_csv(args.out / "results.csv", rows, COLUMNS)
    png = _plot(plt, rows, windows, args.out / "sources.png")
    for r in rows:
        unread = r["ssd_writes_never_read_fraction"]
        paper = PAPER.get(r["window"]) if r["policy"] == "full-duplicate" else None
        print(f"{r['model']:11} {r['window']:>4} {r['policy']:15} DRAM share of hit bytes "
              f"{100 * r['dram_hit_bytes_share']:5.1f}%  SSD writes never read "
              f"{'-' if unread is None else f'{100 * unread:5.1f}%'}"
              + (f"  (paper {100 * paper:.1f}%)" if paper else ""))
    C.done(t0, [csv_path, png])


def _plot(plt, rows, windows, path):
    models = list(C.MODELS)
    fig, axes = plt.subplots(2, len(models), figsize=(5.5 * len(models), 7), squeeze=False)
    width = 0.8 / len(POLICIES)
    xs = range(len(windows))
    for mi, model in enumerate(models):
        for k, (key, ylabel) in enumerate((("dram_hit_bytes_share", "DRAM share of hit bytes"),
                                           ("ssd_writes_never_read_fraction",
                                            "SSD writes never read"))):
            ax = axes[k][mi]
            for pi, p in enumerate(POLICIES):
                ys = []
                for w in windows:
                    r = next(r for r in rows if (r["model"], r["window"], r["policy"]) == (model, w, p))
                    ys.append(r[key] or 0.0)
                ax.bar([x + (pi - (len(POLICIES) - 1) / 2) * width for x in xs], ys, width,
                       label=C.label(p))
            if key == "ssd_writes_never_read_fraction":
                for w, v in PAPER.items():
                    if w in windows:
                        x = windows.index(w)
                        ax.hlines(v, x - 0.4, x + 0.4, colors="k", linestyles="--", lw=1)
                ax.text(0.01, 0.97, "dashed: paper, full duplicate (TraceLab)", fontsize=7,
                        transform=ax.transAxes, va="top")
            ax.set_xticks(list(xs), [f"window {w}" for w in windows], fontsize=8)
            ax.set_ylim(0, 1.05)
            ax.set_ylabel(ylabel, fontsize=8)
            ax.set_title(model, fontsize=9)
            ax.grid(alpha=0.3, axis="y")
    axes[0][0].legend(fontsize=7)
    return C.save_figure(
        fig, "Experiment 3: where reloads come from (left = low load, right = high load)", path)


if __name__ == "__main__":
    main()
