"""Experiment 8: the write budget, and the headline across loads.

Three parts, every replay through the one cache core (``saria.sim.replay``):

1. **Frontier** on the default slice (WEKA, 90 sessions, 12-hour window,
   Qwen3-8B, one 3.84 TB 1-DWPD drive, 256 GB DRAM): the share of the
   drive's write budget each policy uses against its mean TTFT -- ``budget``
   at fractions 0.25, 0.5, 0.75 and 1.0 as one curve, beside full duplicate,
   write-back, E2, E3, R2, HiCache's selective write-through, KVBM's filter
   and ``saria``.
2. **Headline across loads**: SSD bytes written against full duplicate's and
   mean TTFT against DRAM-only's, for ``saria``, ``E2`` and ``budget``, one
   factor at a time around the default slice: arrival windows 2 h / 6 h /
   12 h, 45 / 90 / 180 sessions, one and two SSDs, the Mooncake share, and
   the hybrid Qwen3.5-9B (256 GB and 16 GB of DRAM).
3. **Promotion's recency cutoff**: ``saria`` with lazy promotion allowed to
   displace DRAM blocks idle 60 s (the paper's setting here before), 600 s,
   1800 s, 3600 s, or the learned cutoff (``auto``: longer than 99% of the
   return gaps seen), against ``E2`` without promotion.

Writes frontier.csv, headline.csv, promotion.csv, frontier.png, headline.png.

    python experiments/08_budget_headline.py           # ~6 min on 2 cores
    python experiments/08_budget_headline.py --quick   # smoke run: ~1 min
"""

from __future__ import annotations

import _common as C

NAME = "08_budget_headline"
FRONTIER = ("dram-only", "full-duplicate", "write-back", "E2", "E3", "R2", "hicache-selective",
            "kvbm-filter", "saria", "budget:0.25", "budget:0.5", "budget:0.75", "budget")
HEADLINE = ("dram-only", "full-duplicate", "E2", "saria", "budget")
CUTOFFS = (60.0, 600.0, 1800.0, 3600.0, "auto")
COLUMNS = ("part", "config", "trace", "model", "sessions", "window", "ssd_count", "dram_gb",
           "policy", "promotion", "requests", "ssd_bytes_written", "ssd_bytes_read",
           "write_budget_fraction", "writes_vs_full_duplicate_pct", "ttft_mean_s",
           "ttft_mean_vs_dram_only_pct", "ttft_mean_vs_full_duplicate_pct", "ttft_p90_s",
           "hit_ratio_tokens", "ssd_hit_ratio_tokens", "ssd_writes_never_read_fraction",
           "promoted_blocks", "dram_evictions", "state_bytes_read_ssd", "duration_s")


def _configs(quick: bool, sessions: int) -> list[dict]:
    """The headline's load points: the default slice, then one factor changed."""
    s = 4 if quick else sessions
    base = dict(trace="weka", sessions=s, window="12h", ssd_count=1, model="qwen3-8b", dram_gb=256)
    out = [dict(base, config="default")]
    if quick:
        return out + [dict(base, config="hybrid 16GB", model="qwen3.5-9b", dram_gb=16)]
    out += [dict(base, config=f"window {w}", window=w) for w in ("2h", "6h")]
    out += [dict(base, config=f"{n} sessions", sessions=n) for n in (sessions // 2, sessions * 2)]
    out += [dict(base, config="2 SSDs", ssd_count=2),
            dict(base, config="mooncake", trace="mooncake", sessions=None, window="trace"),
            dict(base, config="hybrid", model="qwen3.5-9b"),
            dict(base, config="hybrid 16GB", model="qwen3.5-9b", dram_gb=16)]
    return out


def _preset(cfg: dict):
    name = C.MODELS[cfg["model"]].replace("-1ssd", f"-{cfg['ssd_count']}ssd")
    return C.preset(name)


def _job(part: str, cfg: dict, policy: str, read_path=None) -> tuple:
    from saria.sim.replay import ReadPath
    tags = dict(cfg, part=part, policy=policy)
    key = "mooncake" if cfg["trace"] == "mooncake" else f"weka{cfg['sessions']}"
    arrivals = "trace" if cfg["trace"] == "mooncake" else f"window:{cfg['window']}"
    return (tags, key, policy, _preset(cfg), read_path or ReadPath(),
            dict(dram_bytes=cfg["dram_gb"] * C.GB), arrivals)


def main() -> None:
    ap = C.parser(NAME, __doc__)
    ap.add_argument("--sessions", type=int, default=C.WEKA_SESSIONS,
                    help=f"WEKA sessions of the default slice (default {C.WEKA_SESSIONS})")
    args = ap.parse_args()
    t0, plt = C.start(args)
    from saria.sim.replay import ReadPath

    configs = _configs(args.quick, args.sessions)
    default = configs[0]
    traces = {f"weka{c['sessions']}": None for c in configs if c["trace"] == "weka"}
    for key in traces:
        traces[key] = C.load_weka(int(key[4:]))
    if any(c["trace"] == "mooncake" for c in configs):
        traces["mooncake"] = C.load_mooncake_share()
    frontier = FRONTIER if not args.quick else ("dram-only", "full-duplicate", "E2", "budget:0.5",
                                                "budget")
    jobs = [_job("frontier", default, p) for p in frontier]
    jobs += [_job("headline", c, p) for c in configs[1:] for p in HEADLINE]
    cutoffs = CUTOFFS if not args.quick else (60.0, "auto")
    jobs += [_job("promotion", default, "saria", ReadPath(min_victim_age_s=a)) for a in cutoffs]
    print(f"{len(jobs)} replays ...", flush=True)
    rows = C.run_many(traces, jobs, args.jobs)
    _relative(rows)
    for r in rows:
        if r["part"] == "promotion":
            r["config"] = f"cutoff {r['promotion']}"
    frontier_rows = [r for r in rows if r["part"] == "frontier"]
    # the default slice's headline row is the frontier's
    headline_rows = [dict(r, part="headline") for r in frontier_rows if r["policy"] in HEADLINE]
    headline_rows += [r for r in rows if r["part"] == "headline"]
    promo_rows = [r for r in rows if r["part"] == "promotion"]
    e2 = next(r for r in frontier_rows if r["policy"] == "E2")
    promo_rows.append(dict(e2, part="promotion", config="E2, no promotion"))
    paths = [C.write_csv(args.out / "frontier.csv", frontier_rows, COLUMNS),
             C.write_csv(args.out / "headline.csv", headline_rows, COLUMNS),
             C.write_csv(args.out / "promotion.csv", promo_rows, COLUMNS),
             _plot_frontier(plt, frontier_rows, args.out / "frontier.png"),
             _plot_headline(plt, headline_rows, [c["config"] for c in configs],
                            args.out / "headline.png")]
    _print(frontier_rows, headline_rows, promo_rows, [c["config"] for c in configs])
    C.done(t0, paths)


def _relative(rows: list[dict]) -> None:
    """Writes vs full duplicate and TTFT vs DRAM-only and full duplicate, each
    against the same load point (the frontier's and the promotion sweep's is
    the default slice)."""
    def group(r):
        return r["config"] if r["part"] == "headline" else "default"

    base = {(group(r), r["policy"]): r for r in rows if r["part"] != "promotion"}
    for r in rows:
        fd, do = base.get((group(r), "full-duplicate")), base.get((group(r), "dram-only"))
        if fd is not None:
            r["writes_vs_full_duplicate_pct"] = C.pct_change(r["ssd_bytes_written"],
                                                             fd["ssd_bytes_written"])
            r["ttft_mean_vs_full_duplicate_pct"] = C.pct_change(r["ttft_mean_s"], fd["ttft_mean_s"])
        if do is not None:
            r["ttft_mean_vs_dram_only_pct"] = C.pct_change(r["ttft_mean_s"], do["ttft_mean_s"])


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def _print(frontier, headline, promo, configs) -> None:
    print("\nfrontier (default slice): policy, write budget used, mean TTFT")
    for r in frontier:
        print(f"  {r['policy']:18} {100 * r['write_budget_fraction']:6.1f}%  "
              f"{r['ttft_mean_s']:8.2f} s")
    print("\nheadline: writes vs full duplicate / mean TTFT vs DRAM-only")
    for c in configs:
        sel = {r["policy"]: r for r in headline if r["config"] == c}
        print(f"  {c:13}" + "  ".join(
            f"{C.label(p)} {_fmt(sel[p]['writes_vs_full_duplicate_pct'], '+.0f')}%/"
            f"{_fmt(sel[p]['ttft_mean_vs_dram_only_pct'], '+.0f')}%"
            for p in ("saria", "E2", "budget") if p in sel))
    print("\npromotion cutoff (default slice): written, mean TTFT, promoted blocks")
    for r in promo:
        print(f"  {r['config']:22} {r['ssd_bytes_written'] / C.TB:6.3f} TB  "
              f"{r['ttft_mean_s']:7.3f} s  {r['promoted_blocks']}")


def _plot_frontier(plt, rows, path):
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    budget = sorted((r for r in rows if r["policy"].startswith("budget")),
                    key=lambda r: r["write_budget_fraction"])
    ax.plot([100 * r["write_budget_fraction"] for r in budget], [r["ttft_mean_s"] for r in budget],
            "-o", lw=2.2, color="C3", label="budget (fraction 0.25 -> 1)")
    for r in budget:
        ax.annotate(r["policy"].partition(":")[2] or "1", (100 * r["write_budget_fraction"],
                                                           r["ttft_mean_s"]),
                    textcoords="offset points", xytext=(4, 4), fontsize=7, color="C3")
    for i, r in enumerate(x for x in rows if not x["policy"].startswith("budget")):
        ax.plot(100 * r["write_budget_fraction"], r["ttft_mean_s"], "s", ms=6, color=f"C{i % 3}"
                if r["policy"] != "saria" else "k")
        ax.annotate(C.label(r["policy"]), (100 * r["write_budget_fraction"], r["ttft_mean_s"]),
                    textcoords="offset points", xytext=(4, -10), fontsize=7)
    ax.axvline(100, color="grey", ls=":", lw=1)
    ax.set_xlabel("share of the drive's write budget used (%, 1 DWPD = 100)")
    ax.set_ylabel("mean TTFT (s)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return C.save_figure(fig, "Experiment 8: write budget vs TTFT (WEKA default slice)", path)


def _plot_headline(plt, rows, configs, path):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    xs = range(len(configs))
    for k, (key, ylabel) in enumerate((("writes_vs_full_duplicate_pct",
                                        "SSD writes vs full duplicate (%)"),
                                       ("ttft_mean_vs_dram_only_pct",
                                        "mean TTFT vs DRAM-only (%)"))):
        ax = axes[k]
        width = 0.27
        for j, p in enumerate(("saria", "E2", "budget")):
            ys = [next((r[key] for r in rows if r["config"] == c and r["policy"] == p), None)
                  for c in configs]
            ax.bar([x + (j - 1) * width for x in xs], [y or 0.0 for y in ys], width,
                   label=C.label(p))
        ax.set_xticks(list(xs), configs, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.axhline(0, color="k", lw=0.8)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    return C.save_figure(fig, "Experiment 8: the headline across loads", path)


if __name__ == "__main__":
    main()
