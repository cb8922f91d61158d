"""Experiment 8: the write budget against the fixed gates, at every load.

Three parts, every replay through the one cache core (``saria.sim.replay``):

1. **Table** (``--parts table``): at each load point -- the default slice
   (WEKA, 90 sessions, 12-hour window, Qwen3-8B, one 3.84 TB 1-DWPD drive,
   256 GB DRAM), then one factor changed: windows 2 h and 6 h, 45 and 180
   sessions, two SSDs, the Mooncake share, the hybrid Qwen3.5-9B at 256 GB
   and at 16 GB of DRAM -- every fixed gate (full duplicate, write-back, E2,
   E3, E5, R2, R4, E2+R2, HiCache, KVBM) and DRAM-only beside ``budget`` at
   100%. ``summary.csv`` names, per load, the best fixed gate (lowest mean
   TTFT) of those within 100% of the write budget, and budget's mean TTFT
   against it, budget's use, the most it wrote in any day as a share of a
   day's rating (``write_day_peak_fraction``: at most 1, its guarantee) and
   its largest excess over the rating in any window (``write_excess_h``, in
   hours of the rating: at most a day).
2. **Frontier** (``--parts frontier``): on the default slice, ``budget`` at
   fractions 0.25, 0.5, 0.75 and 1.0 as one curve, beside the table's fixed
   gates and ``saria``.
3. **Promotion's recency cutoff** (``--parts promotion``): ``saria`` with lazy
   promotion allowed to displace DRAM blocks idle 60 s, 600 s, 1800 s,
   3600 s, or the learned cutoff (``auto``), against ``E2`` without promotion.

Each replay's row is saved under OUT/rows/ as it finishes; ``--resume``
reuses them and ``--policies`` runs only the named policies (so the fixed
gates, which a change to ``budget`` cannot move, need not run again).
Writes table.csv, summary.csv, frontier.csv, promotion.csv, headline.png
(budget against the best fixed gate within the budget) and frontier.png.

    python experiments/08_budget_headline.py --out results/08   # 123 replays, see BENCHMARKS.md
    python experiments/08_budget_headline.py --quick            # smoke run: ~20 s
"""

from __future__ import annotations

import json

import _common as C

NAME = "08_budget_headline"
FRONTIER = ("saria", "budget:0.25", "budget:0.5", "budget:0.75")  # beside the table's default
#: the fixed gates of the table (every load point), and budget at 100%
FIXED = ("full-duplicate", "write-back", "E2", "E3", "E5", "R2", "R4", "E2+R2",
         "hicache-selective", "kvbm-filter")
TABLE = ("dram-only",) + FIXED + ("budget",)
CUTOFFS = (60.0, 600.0, 1800.0, 3600.0, "auto")
COLUMNS = ("part", "config", "trace", "model", "sessions", "window", "ssd_count", "dram_gb",
           "policy", "promotion", "requests", "ssd_bytes_written", "ssd_bytes_read",
           "write_budget_fraction", "writes_vs_full_duplicate_pct", "ttft_mean_s",
           "ttft_mean_vs_dram_only_pct", "ttft_mean_vs_full_duplicate_pct", "ttft_p90_s",
           "hit_ratio_tokens", "ssd_hit_ratio_tokens", "ssd_writes_never_read_fraction",
           "promoted_blocks", "dram_evictions", "state_bytes_read_ssd", "write_excess_h",
           "write_day_peak_fraction",
           "duration_s")
SUMMARY = ("config", "budget_used", "budget_ttft_mean_s", "budget_write_excess_h",
           "budget_day_peak", "best_fixed",
           "best_fixed_budget_used", "best_fixed_ttft_mean_s", "budget_vs_best_fixed",
           "fixed_within_budget", "full_duplicate_ttft_mean_s", "dram_only_ttft_mean_s")


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
    if read_path is not None:
        tags["cutoff"] = read_path.min_victim_age_s
    key = _trace_key(tags)
    arrivals = "trace" if cfg["trace"] == "mooncake" else f"window:{cfg['window']}"
    return (tags, key, policy, _preset(cfg), read_path or ReadPath(),
            dict(dram_bytes=cfg["dram_gb"] * C.GB), arrivals)


def main() -> None:
    ap = C.parser(NAME, __doc__)
    ap.add_argument("--sessions", type=int, default=C.WEKA_SESSIONS,
                    help=f"WEKA sessions of the default slice (default {C.WEKA_SESSIONS})")
    ap.add_argument("--parts", default="frontier,table,promotion",
                    help="comma-separated parts to run (default: frontier,table,promotion)")
    ap.add_argument("--resume", action="store_true",
                    help="reuse the replays already saved under OUT/rows/ (one JSON per replay)")
    ap.add_argument("--policies", default=None,
                    help="comma-separated: run only these policies' replays (the rest come "
                         "from OUT/rows/, or are left out)")
    args = ap.parse_args()
    t0, plt = C.start(args)
    from saria.sim.replay import ReadPath

    parts = set(args.parts.split(","))
    if not parts <= {"frontier", "table", "promotion"}:
        C.fail(f"--parts: unknown part in {args.parts!r}; valid: frontier, table, promotion")
    configs = _configs(args.quick, args.sessions)
    default = configs[0]
    table = TABLE if not args.quick else ("dram-only", "full-duplicate", "E2", "E3", "budget")
    jobs = []
    if "frontier" in parts or "table" in parts:
        frontier = FRONTIER if not args.quick else ("budget:0.5",)
        jobs += [_job("frontier", default, p) for p in frontier]
        jobs += [_job("table", c, p) for c in configs for p in table]
    if "promotion" in parts:
        cutoffs = CUTOFFS if not args.quick else (60.0, "auto")
        jobs += [_job("promotion", default, "saria", ReadPath(min_victim_age_s=a)) for a in cutoffs]
    rows_dir = args.out / "rows"
    rows_dir.mkdir(exist_ok=True)
    todo = [j for j in jobs if not (args.resume and _saved(rows_dir, j[0]).exists())]
    if args.policies is not None:
        keep = set(args.policies.split(","))
        todo = [j for j in todo if j[0]["policy"] in keep]
    heavy = {f"{2 * args.sessions} sessions": 0, "window 2h": 1, "window 6h": 2}
    todo.sort(key=lambda j: heavy.get(j[0]["config"], 3))  # the longest replays first
    need = {_trace_key(j[0]) for j in todo}
    traces = {}
    for key in sorted(need):
        traces[key] = C.load_mooncake_share() if key == "mooncake" else C.load_weka(int(key[4:]))
    print(f"{len(jobs)} replays, {len(todo)} to run ...", flush=True)
    C.run_many(traces, [(j, rows_dir) for j in todo], args.jobs, fn=_run_saved)
    rows = [json.loads(_saved(rows_dir, j[0]).read_text()) for j in jobs
            if _saved(rows_dir, j[0]).exists()]
    _relative(rows)
    for r in rows:
        if r["part"] == "promotion":
            r["config"] = f"cutoff {r['promotion']}"
    table_rows = [r for r in rows if r["part"] == "table"]
    frontier_rows = [dict(r, part="frontier") for r in table_rows if r["config"] == "default"]
    frontier_rows += [r for r in rows if r["part"] == "frontier"]
    frontier_rows.sort(key=lambda r: r["write_budget_fraction"])
    promo_rows = [r for r in rows if r["part"] == "promotion"]
    paths = []
    if "frontier" in parts or "table" in parts:
        summary = _summary(table_rows, [c["config"] for c in configs])
        paths += [C.write_csv(args.out / "frontier.csv", frontier_rows, COLUMNS),
                  C.write_csv(args.out / "table.csv", table_rows, COLUMNS),
                  C.write_csv(args.out / "summary.csv", summary, SUMMARY),
                  _plot_frontier(plt, frontier_rows, args.out / "frontier.png"),
                  _plot_headline(plt, summary, args.out / "headline.png")]
        _print(frontier_rows, summary)
    if "promotion" in parts:
        e2 = next((r for r in table_rows if r["config"] == "default" and r["policy"] == "E2"),
                  None)
        if e2 is not None:
            promo_rows.append(dict(e2, part="promotion", config="E2, no promotion"))
        paths.append(C.write_csv(args.out / "promotion.csv", promo_rows, COLUMNS))
        _print_promotion(promo_rows)
    C.done(t0, paths)


def _trace_key(tags: dict) -> str:
    return "mooncake" if tags["trace"] == "mooncake" else f"weka{tags['sessions']}"


def _saved(rows_dir, tags: dict):
    """One replay's saved row: its part, load point and policy name the file."""
    extra = f"_{tags['cutoff']}" if "cutoff" in tags else ""
    name = f"{tags['part']}_{tags['config']}_{tags['policy']}{extra}".replace(" ", "-")
    return rows_dir / (name.replace(":", "=").replace("/", "-") + ".json")


def _run_saved(item) -> dict:
    """Runs one replay in a worker and saves its row at once (a long table
    survives an interrupted run with --resume)."""
    job, rows_dir = item
    row = C.run_one(job)
    _saved(rows_dir, job[0]).write_text(json.dumps(row))
    return row


def _relative(rows: list[dict]) -> None:
    """Writes vs full duplicate and TTFT vs DRAM-only and full duplicate, each
    against the same load point (the frontier's and the promotion sweep's is
    the default slice)."""
    def group(r):
        return r["config"] if r["part"] == "table" else "default"

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


def _summary(rows: list[dict], configs: list[str]) -> list[dict]:
    """Per load point: budget at 100% beside the best fixed gate (lowest mean
    TTFT) of those that stay within 100% of the write budget."""
    out = []
    for c in configs:
        sel = {r["policy"]: r for r in rows if r["config"] == c}
        if "budget" not in sel:
            continue
        b = sel["budget"]
        fits = [sel[p] for p in FIXED if p in sel and sel[p]["write_budget_fraction"] <= 1.0]
        best = min(fits, key=lambda r: r["ttft_mean_s"], default=None)
        fd, do = sel.get("full-duplicate"), sel.get("dram-only")
        out.append({
            "config": c, "budget_used": b["write_budget_fraction"],
            "budget_ttft_mean_s": b["ttft_mean_s"], "budget_write_excess_h": b["write_excess_h"],
            "budget_day_peak": b.get("write_day_peak_fraction"),
            "best_fixed": None if best is None else best["policy"],
            "best_fixed_budget_used": None if best is None else best["write_budget_fraction"],
            "best_fixed_ttft_mean_s": None if best is None else best["ttft_mean_s"],
            "budget_vs_best_fixed": None if best is None or not best["ttft_mean_s"]
            else b["ttft_mean_s"] / best["ttft_mean_s"],
            "fixed_within_budget": " ".join(r["policy"] for r in fits),
            "full_duplicate_ttft_mean_s": None if fd is None else fd["ttft_mean_s"],
            "dram_only_ttft_mean_s": None if do is None else do["ttft_mean_s"]})
    return out


def _print(frontier, summary) -> None:
    print("\nfrontier (default slice): policy, write budget used, mean TTFT")
    for r in frontier:
        print(f"  {r['policy']:18} {100 * r['write_budget_fraction']:6.1f}%  "
              f"{r['ttft_mean_s']:8.2f} s")
    print("\nbudget at 100% vs the best fixed gate within the budget, per load")
    for s in summary:
        best = "none fits" if s["best_fixed"] is None else (
            f"{C.label(s['best_fixed'])} {100 * s['best_fixed_budget_used']:.0f}% "
            f"{s['best_fixed_ttft_mean_s']:.2f} s")
        ratio = _fmt(s["budget_vs_best_fixed"], ".3f")
        print(f"  {s['config']:13} budget {100 * s['budget_used']:5.1f}% "
              f"{s['budget_ttft_mean_s']:9.2f} s (day peak {100 * (s['budget_day_peak'] or 0):.0f}%)  "
              f"best fixed: {best}  ratio {ratio}")


def _print_promotion(promo) -> None:
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


def _plot_headline(plt, summary, path):
    """Per load: mean TTFT of budget (100%) and of the best fixed gate within
    the budget, relative to that gate, and the budget each uses."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    xs = list(range(len(summary)))
    names = [s["config"] for s in summary]
    ratio = [s["budget_vs_best_fixed"] or float("nan") for s in summary]
    ax = axes[0]
    ax.bar(xs, ratio, 0.6, color="C3", label="budget / best fixed gate within budget")
    for x, s in zip(xs, summary):
        ax.annotate(C.label(s["best_fixed"]) if s["best_fixed"] else "none",
                    (x, ratio[x]), textcoords="offset points", xytext=(0, 3), ha="center",
                    fontsize=6)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(1.05, color="grey", ls=":", lw=1, label="1.05x")
    ax.set_yscale("log")
    ax.set_ylabel("mean TTFT, budget / best fixed gate (log)", fontsize=8)
    ax = axes[1]
    w = 0.38
    ax.bar([x - w / 2 for x in xs], [100 * s["budget_used"] for s in summary], w, color="C3",
           label="budget")
    ax.bar([x + w / 2 for x in xs], [100 * (s["best_fixed_budget_used"] or 0.0) for s in summary],
           w, color="C0", label="best fixed gate")
    ax.plot(xs, [100 * (s["budget_day_peak"] or 0.0) for s in summary], "kv", ms=5,
            label="budget: most in any day (% of a day's rating)")
    ax.axhline(100, color="k", lw=0.8)
    ax.set_ylabel("write budget used over the replay (%)", fontsize=8)
    for ax in axes:
        ax.set_xticks(xs, names, rotation=30, ha="right", fontsize=7)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7)
    return C.save_figure(fig, "Experiment 8: budget vs the best fixed gate within the budget",
                         path)


if __name__ == "__main__":
    main()
