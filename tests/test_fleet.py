"""The fleet replay: N nodes behind a router, islands or a shared cluster tier."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from saria.errors import ConfigError
from saria.sim.cluster import ClusterSpec
from saria.sim.engine import Arrival, Replay
from saria.sim.fleet import Fleet, FleetSpec
from saria.sim.presets import get_preset
from saria.sim.replay import make_setup, open_loop_arrivals
from saria.traces import bundled_trace, load_trace
from saria.traces.arrivals import ArrivalModel

PRESET = get_preset("qwen3-8b/h100-gen5-1ssd")


def setup(policy: str = "saria"):
    return make_setup(policy, PRESET, trace_block_size=64)


def req(t: float, ids, session: int = 0) -> Arrival:
    ids = np.asarray(ids, dtype=np.int64)
    return Arrival(t, 0, 64 * len(ids) + 10, ids, session)


@pytest.fixture(scope="module")
def weka():
    trace = load_trace(bundled_trace("weka"), limit_sessions=6)
    return open_loop_arrivals(trace, ArrivalModel.from_spec("window:2h"))


def test_one_node_is_the_single_gpu_replay(weka):
    """A fleet of one makes the single replay's decisions: the same SSD
    writes, hits and TTFTs (the same code on the same arrivals)."""
    alone = Replay(setup())
    alone.run(weka)
    for routing in ("round-robin", "tier-aware"):
        fleet = Fleet(setup(), FleetSpec(nodes=1, routing=routing))
        rep = fleet.run(weka)
        node = fleet.nodes[0]
        assert node.stats.hit_tokens == alone.stats.hit_tokens
        assert np.array_equal(node.stats.ssd_bytes_written, alone.stats.ssd_bytes_written)
        assert node.stats.ttft == alone.stats.ttft
        assert rep["requests"] == len(weka)


def test_a_shared_cluster_serves_one_nodes_blocks_to_another():
    """Round-robin sends the second request to the other node: as islands it
    recomputes the shared prefix; with a cluster tier it reads it from there."""
    prefix = list(range(1000, 1040))            # 40 blocks (trace and engine: 64 tokens)
    a, b = req(0.0, prefix + [1], 1), req(100.0, prefix + [2], 2)
    islands = Fleet(setup(), FleetSpec(nodes=2, routing="round-robin"))
    islands.run([a, b])
    assert islands.nodes[1].stats.hit_tokens["GPU"] == 0
    assert islands.nodes[1].stats.hit_tokens.get("CLUSTER", 0) == 0
    shared = Fleet(setup(), FleetSpec(nodes=2, routing="round-robin", cluster=ClusterSpec()))
    rep = shared.run([a, b])
    got = shared.nodes[1].stats.hit_tokens["CLUSTER"]
    assert got == 40 * PRESET.block_size
    assert shared.nodes[1].stats.ttft[0] < islands.nodes[1].stats.ttft[0]
    bb = shared.setup.block_bytes
    assert rep["cluster_bytes_read"] == 40 * bb
    # both nodes put what they computed: a's 41 blocks, then b's last one
    assert rep["network_bytes"] == rep["cluster_bytes_read"] + (41 + 1) * bb


def test_prefix_routers_follow_the_prefix_round_robin_does_not():
    prefix = list(range(5000, 5030))
    first, second = req(0.0, prefix + [1], 1), req(50.0, prefix + [2], 2)
    for routing, same in (("prefix", True), ("tier-aware", True), ("round-robin", False)):
        fleet = Fleet(setup(), FleetSpec(nodes=2, routing=routing))
        k1, k2 = fleet.route(first, fleet.nodes[0].keys_of(first)), None
        fleet.nodes[k1].serve(first)
        k2 = fleet.route(second, fleet.nodes[0].keys_of(second))
        assert (k1 == k2) == same, routing
        fleet.nodes[k2].serve(second)
        hits = fleet.nodes[k2].stats.hit_blocks[-1]
        assert hits == (30 if same else 0), routing


def test_a_failed_node_gets_nothing_and_sessions_move(weka):
    t0 = weka[0].time
    down = ((1, t0, t0 + 3600.0),)
    for routing in ("round-robin", "session", "prefix", "tier-aware"):
        fleet = Fleet(setup(), FleetSpec(nodes=2, routing=routing, down=down))
        served_on_1 = []
        for a in weka:
            before = fleet.nodes[1].stats.requests
            fleet.serve(a)
            if fleet.nodes[1].stats.requests > before:
                served_on_1.append(a.time)
        assert all(not (t0 <= t < t0 + 3600.0) for t in served_on_1), routing
    with pytest.raises(ConfigError, match="every node is down"):
        Fleet(setup(), FleetSpec(nodes=1, down=((0, 0.0, 1e12),))).serve(weka[0])


def test_bad_fleet_settings_name_the_key():
    with pytest.raises(ConfigError, match="routing"):
        FleetSpec(nodes=2, routing="random")
    with pytest.raises(ConfigError, match="nodes"):
        FleetSpec(nodes=0)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "saria.cli.main", "replay", *args],
                          capture_output=True, text=True, timeout=600)


def test_the_cli_replays_a_fleet_and_rejects_bad_flags():
    r = _cli("--sessions", "2", "--nodes", "2", "--routing", "session", "--routing",
             "tier-aware", "--cluster", "1TB")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "2 nodes, saria, 1 TB shared" in r.stdout and "tier-aware" in r.stdout
    bad = _cli("--sessions", "2", "--nodes", "2", "--fail", "5@0-10")
    assert bad.returncode == 2 and "--fail" in bad.stderr and len(bad.stderr.splitlines()) == 1
    bad = _cli("--sessions", "2", "--nodes", "2", "--policy", "E2", "--policy", "saria")
    assert bad.returncode == 2 and "one admission policy" in bad.stderr
