"""The routers' scorers: static tier weights and the tier-aware price."""

from __future__ import annotations

import pytest

from saria.routing import (DYNAMO_WEIGHTS, FleetIndex, NodeCosts, NodeLoad, StaticWeights,
                           TierAware, wire)
from saria.transfer import LinkModel, reload_time

BLOCK = 16
BYTES = 2 << 20                      # 2 MiB of KV per block
LINK = LinkModel(ingress_Bps=50e9, dram_Bps=50e9, ssd_Bps=6e9)


def prefill(new: int, cached: int) -> float:
    return 1e-4 * new + 2e-8 * new * (new + 2 * cached)   # linear + attention


COSTS = NodeCosts(LINK, BYTES, BLOCK, prefill, cluster_Bps=10e9)
HASHES = list(range(1, 201))         # a 200-block prompt (3,200 tokens)


def fleet(**held) -> FleetIndex:
    idx = FleetIndex()
    for node, (medium, n) in held.items():
        idx.apply(node, wire.Batch(0.0, [wire.Stored(tuple(HASHES[:n]), medium)]))
    return idx


def test_tier_aware_ttft_is_the_coordinators_reload_plus_the_rest():
    idx = fleet(a=(wire.MEDIUM_CPU, 120))
    load = NodeLoad(queue_s=0.05)
    t, k, media = TierAware(COSTS).ttft("a", idx.media("a", HASHES), 200, 0, load)
    want = 0.05 + reload_time(120 * BYTES, 0, LINK) + prefill(80 * BLOCK, 120 * BLOCK)
    assert k == 120 and media == {wire.MEDIUM_CPU: 120}
    assert t == pytest.approx(want, rel=1e-9)


def test_a_saturated_ssd_loses_to_an_idle_node_that_recomputes():
    """Node a holds the prefix on its SSD, whose read queue is 5 s deep, and
    has 0.3 s of prefill queued; node b holds nothing and is idle. Static
    weights send the request to a (they see a hit, not the queue behind it);
    the tier-aware price sends it to b."""
    idx = fleet(a=(wire.MEDIUM_STORAGE, 200))
    loads = {"a": NodeLoad(queue_s=0.3, ssd_backlog_s=5.0), "b": NodeLoad()}
    assert StaticWeights(DYNAMO_WEIGHTS).choose(idx, HASHES, loads).node == "a"
    c = TierAware(COSTS).choose(idx, HASHES, loads)
    assert c.node == "b" and c.reload_blocks == 0
    # with an idle SSD the reload wins and a is chosen by both
    loads["a"] = NodeLoad()
    c = TierAware(COSTS).choose(idx, HASHES, loads)
    assert c.node == "a" and c.reload_blocks == 200


def test_the_reload_stops_where_recomputing_is_faster():
    """The first 50 blocks are in DRAM, the next 150 only in a cluster tier
    behind a 30 s backlog: reload the DRAM part, recompute the rest."""
    idx = FleetIndex()
    idx.apply("a", wire.Batch(0.0, [wire.Stored(tuple(HASHES[:50]), wire.MEDIUM_CPU)]))
    idx.apply("b", wire.Batch(0.0, [wire.Stored(tuple(HASHES[50:]), wire.MEDIUM_CLUSTER)]))
    c = TierAware(COSTS).choose(idx, HASHES, {"a": NodeLoad(cluster_backlog_s=30.0)})
    assert c.reload_blocks == 50 and c.media == {wire.MEDIUM_CPU: 50}
    # the same cluster with no backlog: read it too
    c = TierAware(COSTS).choose(idx, HASHES, {"a": NodeLoad()})
    assert c.reload_blocks == 200 and c.media == {wire.MEDIUM_CPU: 50, wire.MEDIUM_CLUSTER: 150}


def test_a_block_on_ssd_and_in_the_cluster_takes_the_faster_path():
    idx = fleet(a=(wire.MEDIUM_STORAGE, 200))
    idx.apply("a", wire.Batch(0.0, [wire.Stored(tuple(HASHES), wire.MEDIUM_CLUSTER)]))
    only_ssd = TierAware(COSTS).ttft("a", [wire_bits(wire.MEDIUM_STORAGE)] * 200, 200, 0,
                                     NodeLoad())[0]
    t, k, media = TierAware(COSTS).ttft("a", idx.media("a", HASHES), 200, 0, NodeLoad())
    assert k == 200 and set(media) == {wire.MEDIUM_STORAGE, wire.MEDIUM_CLUSTER}
    assert t < only_ssd   # both paths at once beat one


def wire_bits(medium: str) -> int:
    from saria.routing import BIT

    return BIT[medium]


def test_static_weights_rank_by_medium_and_count_the_queue():
    idx = fleet(a=(wire.MEDIUM_CPU, 100), b=(wire.MEDIUM_STORAGE, 160))
    loads = {"a": NodeLoad(), "b": NodeLoad()}
    r = StaticWeights(DYNAMO_WEIGHTS)
    # a: 100 x 0.75 = 75 blocks of credit; b: 160 x 0.25 = 40
    assert r.choose(idx, HASHES, loads).node == "a"
    # a's queue worth 50 blocks of prefill turns it
    loads["a"] = NodeLoad(queue_s=50 * 0.01)
    assert StaticWeights(DYNAMO_WEIGHTS, block_s=0.01).choose(idx, HASHES, loads).node == "b"


def test_a_node_that_is_down_is_never_chosen():
    idx = fleet(a=(wire.MEDIUM_GPU, 200))
    loads = {"a": NodeLoad(up=False), "b": NodeLoad()}
    for r in (StaticWeights(), TierAware(COSTS)):
        assert r.choose(idx, HASHES, loads).node == "b"
        with pytest.raises(RuntimeError, match="no node is up"):
            r.choose(idx, HASHES, {"a": NodeLoad(up=False)})
