"""The replay's model of the cluster tier (saria.sim.remote)."""

from __future__ import annotations

import json
from collections import OrderedDict

import pytest
from hypothesis import given, settings, strategies as st

from budgets import examples

from saria.errors import ConfigError
from saria.sim.presets import get_preset, load_hardware
from saria.sim.remote import ClusterKeys, RemoteTierModel


def test_presets_have_no_cluster_tier_unless_they_say_so():
    assert RemoteTierModel.from_hardware(get_preset("qwen3-8b").hardware) is None
    m = RemoteTierModel.from_hardware(get_preset("qwen3-8b/h100-gen5-1ssd-cluster").hardware)
    assert m is not None and m.enabled and m.capacity_bytes == 4e12
    block = get_preset("qwen3-8b").block_size * get_preset("qwen3-8b").model.kv_bytes_per_token
    assert m.capacity_blocks(block) == int(4e12 // block)


def test_transfer_time_is_one_round_trip_plus_the_bytes():
    m = RemoteTierModel(link_Bps=10e9, latency_s=1e-4, capacity_bytes=1e12)
    assert m.transfer_s(0, 0) == 0.0
    assert m.transfer_s(1e9, 8) == pytest.approx(1e-4 + 0.1)
    assert m.lookup_s() == 1e-4
    with pytest.raises(ConfigError, match="remote_link_Bps"):
        RemoteTierModel(link_Bps=0, latency_s=0, capacity_bytes=1)


def test_hardware_json_takes_the_remote_fields(tmp_path):
    p = tmp_path / "hw.json"
    p.write_text(json.dumps({"hardware": {"remote_bytes": 1e12, "remote_link_Bps": 5e9}}))
    hw = load_hardware(str(p))
    assert hw.remote_bytes == 1e12 and hw.remote_link_Bps == 5e9
    assert get_preset("qwen3-8b").with_(remote_bytes=2e12).hardware.remote_bytes == 2e12


class Reference:
    """Brute force: a list in use order, evicted from the front past the watermark."""

    def __init__(self, cap, high=0.9, ratio=0.05):
        self.high = int(cap * high)
        self.low = int(self.high * (1 - ratio))
        self.order: OrderedDict = OrderedDict()

    def put(self, k):
        if k in self.order:
            self.order.move_to_end(k)
            return False
        if self.high == 0:
            return False
        self.order[k] = 1
        if len(self.order) > self.high:
            keep = list(self.order)[-max(self.low, 1):]
            self.order = OrderedDict((x, 1) for x in keep)
        return True

    def get(self, k):
        if k in self.order:
            self.order.move_to_end(k)
            return True
        return False


@settings(max_examples=examples(80), deadline=None)
@given(cap=st.integers(0, 40),
       ops=st.lists(st.tuples(st.sampled_from(["put", "get", "exists", "remove"]), st.integers(0, 60)),
                    max_size=300))
def test_cluster_keys_match_a_brute_force_lru(cap, ops):
    c, ref = ClusterKeys(cap), Reference(cap)
    for op, k in ops:
        key = k.to_bytes(2, "little")
        if op == "put":
            assert c.put([key]) == [ref.put(key)]
        elif op == "get":
            assert c.get([key]) == [ref.get(key)]
        elif op == "exists":
            assert c.exists([key]) == [key in ref.order]
        else:
            c.remove([key])
            ref.order.pop(key, None)
        assert list(c._lru) == list(ref.order)
        assert len(c) <= max(c.high, 0) or len(c) <= 1


def test_a_restarted_master_holds_nothing():
    c = ClusterKeys(100)
    c.put([b"a", b"b"])
    c.clear()
    assert c.exists([b"a", b"b"]) == [False, False]


def _replay(preset_name: str, policy: str = "write-back", dram_blocks: int = 60):
    from saria.sim.engine import Replay
    from saria.sim.replay import make_setup, open_loop_arrivals
    from saria.traces import bundled_trace, load_trace
    from saria.traces.arrivals import ArrivalModel

    preset = get_preset(preset_name).with_(gpu_cache_bytes=0)  # no HBM prefix cache: the tiers serve
    block = preset.block_size * preset.model.kv_bytes_per_token
    trace = load_trace(bundled_trace("weka"), limit_sessions=4)
    reqs = open_loop_arrivals(trace, ArrivalModel.from_spec("window:20m,seed=3"), max_context=40_000)
    replay = Replay(make_setup(policy, preset, dram_bytes=dram_blocks * block,
                               ssd_bytes=400 * block))
    replay.run(reqs)
    return replay


def test_the_replay_core_has_the_presets_cluster_tier():
    """A cluster preset gives the counting backend the cluster's keys: the
    one core publishes DRAM victims with history into it, finds them past
    its local prefix and skips their SSD copies; without one nothing of it
    exists (the report has no cluster figures)."""
    from saria.sim.report import policy_report

    plain = _replay("qwen3-8b/h100-gen5-1ssd")
    assert plain.cluster_model is None and not plain.cache.backend.remote
    assert "cluster_hit_ratio_tokens" not in policy_report(plain)
    r = _replay("qwen3-8b/h100-gen5-1ssd-cluster")
    st, cluster = r.cache.stats, r.cache.backend.cluster
    assert st.remote_published_blocks > 0 and len(cluster) == st.remote_published_blocks
    assert r.stats.hit_tokens["CLUSTER"] > 0 and st.remote_hit_blocks > 0
    assert st.ssd_writes_skipped_remote > 0  # write-back would have written every victim
    rep = policy_report(r)
    assert rep["ssd_bytes_saved_cluster"] == st.ssd_writes_skipped_remote * r.block_bytes
    assert rep["cluster_published_blocks"] == st.remote_published_blocks
    assert st.ssd_write_blocks < plain.cache.stats.ssd_write_blocks
