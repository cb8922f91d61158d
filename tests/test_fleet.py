"""The fleet replay: N nodes behind a router, islands or a shared cluster tier."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from saria.errors import ConfigError
from saria.sim.engine import Arrival, Replay
from saria.sim.fleet import CLUSTER_BIT, Fleet, FleetSpec
from saria.sim.presets import get_preset
from saria.sim.remote import RemoteTierModel
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
    shared = Fleet(setup(), FleetSpec(nodes=2, routing="round-robin", cluster=RemoteTierModel.shared(PRESET.hardware, 4e12)))
    rep = shared.run([a, b])
    got = shared.nodes[1].stats.hit_tokens["CLUSTER"]
    assert got == 40 * PRESET.block_size
    assert shared.nodes[1].stats.ttft[0] < islands.nodes[1].stats.ttft[0]
    bb = shared.setup.block_bytes
    assert rep["cluster_bytes_read"] == 40 * bb
    # both nodes put what they computed: a's 41 blocks, then b's last one
    assert rep["network_bytes"] == rep["cluster_bytes_read"] + (41 + 1) * bb


def test_the_nodes_cores_share_one_cluster_tier():
    """The cluster is the one ``ClusterKeys`` in every node's core: what node
    0 computed (write-through) is found, fetched and counted as cluster hits
    by node 1's core; node 1's SSD admission skips the victims the cluster
    holds, so the shared fleet writes less to its SSDs than islands."""
    prefix = list(range(2000, 2040))
    a, b = req(0.0, prefix + [1], 1), req(100.0, prefix + [2], 2)
    shared = Fleet(setup(), FleetSpec(nodes=2, routing="round-robin",
                                      cluster=RemoteTierModel.shared(PRESET.hardware, 4e12)))
    shared.run([a, b])
    n0, n1 = (node.cache for node in shared.nodes)
    assert n0.backend.cluster is n1.backend.cluster is shared.cluster
    assert n0.stats.remote_published_blocks == 41 and len(shared.cluster) == 42
    assert n1.stats.remote_found_blocks == 40 and n1.stats.remote_hit_blocks == 40
    assert n0.stats.remote_hit_blocks == 0


def test_shared_victims_skip_the_ssd(weka):
    """Write-back writes every DRAM victim as islands; sharing a cluster
    that holds them, each node's core skips their SSD copies (counted)."""
    small = make_setup("write-back", PRESET.with_(gpu_cache_bytes=0),
                       dram_bytes=60 * PRESET.block_size * PRESET.model.kv_bytes_per_token,
                       trace_block_size=64)
    islands = Fleet(small, FleetSpec(nodes=2, routing="session"))
    islands.run(weka)
    shared = Fleet(small, FleetSpec(nodes=2, routing="session",
                                    cluster=RemoteTierModel.shared(PRESET.hardware, 4e12)))
    rep = shared.run(weka)
    skipped = sum(node.cache.stats.ssd_writes_skipped_remote for node in shared.nodes)
    assert skipped > 0
    assert sum(node.stats.hit_tokens.get("CLUSTER", 0) for node in shared.nodes) > 0
    assert rep["ssd_bytes_written"] < islands.report()["ssd_bytes_written"]


def test_the_fleets_publishing_is_a_named_policy_choice():
    """Under ``reuse`` publishing a block computed once is not put, so the
    other node finds nothing; under the fleet's ``write-through`` it is."""
    prefix = list(range(3000, 3020))
    a, b = req(0.0, prefix + [1], 1), req(100.0, prefix + [2], 2)
    tier = RemoteTierModel.shared(PRESET.hardware, 4e12)
    got = {}
    for publish in ("reuse", "write-through"):
        fleet = Fleet(setup(), FleetSpec(nodes=2, routing="round-robin", cluster=tier,
                                         publish=publish))
        fleet.run([a, b])
        got[publish] = fleet.nodes[1].stats.hit_tokens.get("CLUSTER", 0)
    assert got == {"reuse": 0, "write-through": 20 * PRESET.block_size}
    with pytest.raises(ConfigError, match="publish"):
        FleetSpec(nodes=2, publish="everything")


def test_the_routers_see_what_a_nodes_core_would_fetch():
    """The router's cluster run for a node is what that node's core finds:
    the blocks the cluster holds past its local prefix -- all of them, as the
    lookup goes on past its first window (64 blocks) while the cluster holds
    what it asks -- and the node then fetches exactly that many, paying one
    round trip per lookup call (64, then 37 blocks asked: two)."""
    prefix = list(range(6000, 6100))  # 100 blocks
    tier = RemoteTierModel.shared(PRESET.hardware, 4e12)
    fleet = Fleet(setup(), FleetSpec(nodes=2, routing="round-robin", cluster=tier))
    fleet.serve(req(0.0, prefix + [1], 1))
    second = req(100.0, prefix + [2], 2)
    media = fleet._media(fleet.nodes[0].keys_of(second))
    assert fleet.nodes[1].cache.remote.lookup_blocks == 64
    assert media["node0"].shape[0] == 100 and not (media["node0"] & CLUSTER_BIT).any()
    assert media["node1"].shape[0] == 100 and (media["node1"] == CLUSTER_BIT).all()
    fleet.serve(second)
    n1 = fleet.nodes[1]
    assert n1.cache.stats.remote_hit_blocks == 100
    assert n1.cache.remote.lookup_rounds == 2


def test_a_nodes_gets_queue_behind_its_puts():
    """A node's link to the cluster is one FIFO: node 1's get of a's blocks
    waits for the put of what node 1 computed just before; node 0's link,
    idle, does not delay it."""
    tier = RemoteTierModel.shared(PRESET.hardware, 4e12, link_Bps=1e9)  # a slow link shows it
    bb = setup().block_bytes
    prefix = list(range(4000, 4040))
    fleet = Fleet(setup(), FleetSpec(nodes=2, routing="round-robin", cluster=tier))
    fleet.serve(req(0.0, prefix + [1], 1))             # node 0 computes and puts 41 blocks
    busy = fleet.nodes[0].cluster_backlog(0.0)
    assert busy > 41 * bb / 1e9
    assert fleet.nodes[1].cluster_backlog(0.0) == 0.0
    loads = fleet.load(0, 0.0), fleet.load(1, 0.0)
    assert loads[0].cluster_backlog_s == busy and loads[1].cluster_backlog_s == 0.0
    fleet.serve(req(1000.0, list(range(9000, 9030)), 2))  # node 1 computes and puts 30 blocks
    n1 = fleet.nodes[1]
    free = n1.cluster_free
    assert free == pytest.approx(n1.stats.last_done + 30 * bb / 1e9)
    fleet._rr = 1
    fleet.serve(req(n1.stats.last_done, prefix + [2], 3))  # node 1 reads node 0's 40 blocks
    assert n1.cluster_bytes_got == 40 * bb
    fetched = free + tier.transfer_s(40 * bb, 40)  # after the put, not at the request's arrival
    assert n1.gpu_started == pytest.approx(fetched)
    assert n1.cluster_free == pytest.approx(n1.stats.last_done + bb / 1e9)  # then its 1 new block


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


def test_fleet_routings_side_by_side_report_what_one_by_one_runs_report(tmp_path):
    """--jobs 2 runs each routing's fleet in its own worker; the reports (but
    their wall time) equal the one-process run's, and a fleet's admission
    state is its own (one setup per routing)."""
    got = {}
    for jobs in ("1", "2"):
        out = tmp_path / f"f{jobs}.json"
        r = _cli("--sessions", "8", "--nodes", "2", "--routing", "session", "--routing",
                 "tier-aware", "--routing", "round-robin", "--cluster", "1TB", "--jobs", jobs,
                 "--json", str(out))
        assert r.returncode == 0, r.stderr[-2000:]
        got[jobs] = json.loads(out.read_text())["routings"]
    assert list(got["2"]) == ["session", "tier-aware", "round-robin"]
    for routing, rep in got["1"].items():
        other = dict(got["2"][routing])
        other.pop("wall_s"), rep.pop("wall_s")
        assert other == rep, routing
