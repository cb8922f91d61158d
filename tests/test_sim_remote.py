"""The replay's model of the cluster tier (saria.sim.remote)."""

from __future__ import annotations

import json
from collections import OrderedDict

import pytest
from hypothesis import given, settings, strategies as st

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


@settings(max_examples=80, deadline=None)
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
