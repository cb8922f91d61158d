"""Never wrong KV with a cluster tier, under every interleaving.

``test_interleavings``'s randomized schedules (loads read late, stores
filled late or torn, SSD writes landed late or failed) over a ``TieredCache``
that also has a cluster tier (a real ``mooncake_master``, loopback TCP), with
more steps drawn in between:

* ``publish``: the node's queued puts go out (``run_publishes``);
* ``foreign``: another node publishes a prompt's blocks (their own bytes),
  so lookups find prefixes this node never computed and loads fetch them;
* ``vanish``: the cluster loses a block (another node removes it);
* ``corrupt``: a block's object in the cluster gets one flipped payload bit.

What must hold: every byte a load returns is its block's own (fetched ones
included); every REMOTE copy the index lists is one the core tracks; once
the schedule drains, every DRAM slot is the index's (no fetch left a slot
behind) and the SSD checks of ``test_interleavings`` hold.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from budgets import examples

from saria.index import Tier
from saria.policy.publish import PublishPolicy
from saria.runtime import CacheConfig, TieredCache
from saria.sim.real import synthetic_rows
from saria.tiers.remote import MooncakeMaster, RemoteTier, client_env, mooncake_available
from saria.tiers.ssd import slot_bytes_for

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_interleavings import ALL_KEYS, BLOCK, EXAMPLES, PROMPTS, Schedule  # noqa: E402

_WHY = mooncake_available()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")

DRAM, SSD, REMOTE = Tier.DRAM, Tier.SSD, Tier.REMOTE
NS = "interleavings"
EVERY_KEY = np.frombuffer(b"".join(sorted(ALL_KEYS)), np.uint8).reshape(-1, 32)


@pytest.fixture(scope="module")
def cluster():
    """A master and another node that lends the segment the objects live in."""
    client_env()
    with MooncakeMaster() as m:
        other = RemoteTier(m.settings(segment_bytes=64 << 20, staging_rows=16, deadline_s=2.0,
                                      exist_cache_s=0.0), NS, BLOCK)
        try:
            yield m, other
        finally:
            other.close()


class RemoteSchedule(Schedule):
    def __init__(self, cache: TieredCache, draw, other: RemoteTier) -> None:
        super().__init__(cache, draw)
        self.other = other

    def publish(self) -> None:
        self.cache.run_publishes(self.draw(st.integers(1, 3)))

    def foreign(self) -> None:
        keys = PROMPTS[self.pick(PROMPTS)]
        n = self.draw(st.integers(1, keys.shape[0]))
        self.other.put(keys[:n], synthetic_rows(keys[:n], BLOCK))

    def _victim(self) -> np.ndarray:
        """A block the cluster holds as far as this node's index knows (else any)."""
        held = sorted(self.cache.manager.remote._held)
        if held:
            return np.frombuffer(held[self.pick(held)], np.uint8).reshape(1, 32)
        keys = PROMPTS[self.pick(PROMPTS)]
        i = self.draw(st.integers(0, keys.shape[0] - 1))
        return keys[i:i + 1]

    def vanish(self) -> None:
        self.other.remove(self._victim(), force=True)

    def corrupt(self) -> None:
        store, name = self.other._store, self.other.codec.key(self._victim()[0].tobytes())
        row = store.get(name)
        if len(row) != self.other.codec.row_bytes:
            return
        row = bytearray(row)
        row[64 + self.draw(st.integers(0, BLOCK - 1))] ^= 1 << self.draw(st.integers(0, 7))
        store.remove(name, True)
        store.put(name, bytes(row))

    def check_remote(self) -> None:
        d = self.cache.index.dump()
        listed = {bytes(k) for k in d["keys"][(d["tiers"] & REMOTE.bit) != 0]}
        assert listed == self.cache.manager.remote._held


def make_cache(root, admission: str, tier: RemoteTier) -> TieredCache:
    return TieredCache(CacheConfig(
        block_bytes=BLOCK, dram_bytes=12 * BLOCK, ssd_dirs=(str(root),),
        ssd_bytes=4096 + 28 * slot_bytes_for(BLOCK), admission=admission, promotion="lazy",
        promotion_r=0.5, min_victim_age_s=0, write_mode="manual", write_queue=64, write_behind=3,
        max_blocks=64, pin=False), remote=tier, publish=PublishPolicy(min_reuse=1))


STEPS = ["arrive", "arrive", "read", "read", "fill", "fill", "complete", "complete", "land",
         "publish", "foreign", "foreign", "vanish", "corrupt"]


def run_schedule(tmp_path, data, admission: str, cluster) -> None:
    master, other = cluster
    other.remove(EVERY_KEY, force=True)  # each example starts with an empty cluster
    tier = RemoteTier(master.settings(segment_bytes=0, staging_rows=16, deadline_s=2.0,
                                      exist_cache_s=0.0), NS, BLOCK)
    cache = make_cache(tmp_path / f"ssd-{os.urandom(4).hex()}", admission, tier)
    sched = RemoteSchedule(cache, data.draw, other)
    try:
        for step in data.draw(st.lists(st.sampled_from(STEPS), min_size=10, max_size=80)):
            if step == "arrive" or not (sched.loads or sched.stores or sched.states):
                sched.arrive()
            elif step == "read" and sched.loads:
                sched.read()
            elif step in ("fill", "complete", "land", "publish", "foreign", "vanish", "corrupt"):
                getattr(sched, step)()
            cache.index.check()
            sched.check_remote()
        sched.drain()
        sched.check_ssd()
        sched.check_remote()
        assert not cache.backend._free_later and not cache.backend._fetching
        g = cache.gauges()
        assert g["dram_used_slots"] == cache.index.stats().resident["DRAM"]
        assert g["dram_write_behind_used"] == 0
    finally:
        cache.close()
        tier.close()


@pytest.mark.parametrize("admission", ["saria", "write-back", "dram-only"])
@settings(max_examples=examples(EXAMPLES), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(data=st.data())
def test_every_load_returns_its_own_bytes_with_a_cluster_tier(tmp_path, data, admission, cluster):
    run_schedule(tmp_path, data, admission, cluster)
