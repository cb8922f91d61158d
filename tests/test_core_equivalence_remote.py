"""The replay's cluster tier decides as the engine's: the same stream
through the one cache core over the counting backend (``ClusterKeys``: the
preset's cluster) and over the real tiers with a ``RemoteTier`` on a real
``mooncake_master`` (loopback TCP, synthetic bytes verified on every load)
gives the same hits per request (cluster hits included), the same
publishes, the same SSD writes the cluster saved and the same final index."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from saria.index import Tier, VirtualClock
from saria.runtime import TieredCache
from saria.sim.engine import Replay
from saria.sim.presets import get_preset
from saria.sim.real import SyntheticBytes, real_cache_config
from saria.sim.replay import ReadPath, make_setup
from saria.tiers.remote import MooncakeMaster, RemoteTier, client_env, mooncake_available

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_core_equivalence import BLOCK_BYTES, assert_same, weka_stream  # noqa: E402

_WHY = mooncake_available()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")

PRESET = get_preset("qwen3-8b/h100-gen5-1ssd-cluster").with_(gpu_cache_bytes=0)


@pytest.fixture(scope="module")
def master():
    client_env()
    with MooncakeMaster() as m:
        yield m


@pytest.fixture(scope="module")
def stream():
    return weka_stream()


@pytest.mark.parametrize("policy", ["saria", "write-back", "dram-only"])
def test_the_cluster_tier_decides_as_in_the_simulation(master, stream, policy, tmp_path):
    block = PRESET.block_size * PRESET.model.kv_bytes_per_token

    def setup():
        return make_setup(policy, PRESET, read_path=ReadPath(promotion="lazy", r=0.5,
                                                             min_victim_age_s=30.0),
                          dram_bytes=120 * block, ssd_bytes=400 * block, trace_block_size=64)

    sim = Replay(setup())
    sim.run(stream)
    real_setup = setup()
    cfg = real_cache_config(real_setup, policy, BLOCK_BYTES, [str(tmp_path / "drive0")])
    clock = VirtualClock()
    # every example its own namespace: the cluster starts empty, as ClusterKeys does
    tier = RemoteTier(master.settings(segment_bytes=256 << 20, staging_rows=64, deadline_s=5.0,
                                      exist_cache_s=0.0), f"eq-{policy}-{tmp_path.name}",
                      BLOCK_BYTES)
    try:
        with TieredCache(cfg, clock=clock, remote=tier) as cache:
            mover = SyntheticBytes(cache)
            real = Replay(real_setup, cache=cache, mover=mover, clock=clock)
            real.run(stream)
            state = dict(index=cache.index.dump(), stats=cache.stats, mover=mover,
                         store=cache.backend.ssd.stats() if cache.backend.ssd else None)
    finally:
        tier.close()
    assert_same(sim, real, state)
    core_sim, core_real = sim.cache.stats, state["stats"]
    for name in ("remote_found_blocks", "remote_hit_blocks", "remote_load_failures",
                 "remote_published_blocks", "remote_publish_failures",
                 "ssd_writes_skipped_remote"):
        assert getattr(core_real, name) == getattr(core_sim, name), name
    assert core_sim.remote_published_blocks > 0 and sim.stats.hit_tokens.get("CLUSTER", 0) > 0
    assert state["mover"].verified > 0
    on_remote = np.count_nonzero(state["index"]["tiers"] & Tier.REMOTE.bit)
    assert on_remote == len(sim.cache.backend.cluster) > 0
