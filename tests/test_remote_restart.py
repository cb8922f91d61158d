"""After a restart the node's own SSD comes before the cluster (issue 31, failure 5).

A node writes a prompt to its SSD and stops; the cluster holds the same
blocks (another node published them). The restarted node reopens its SSD
from the journal: the recovered blocks wait to be adopted by the first
lookup that reaches them. That lookup must adopt them before it asks the
cluster -- asking first turned the prefix into REMOTE copies, left the
recovered blocks unadopted (later freed), and fetched over the network what
the node's own drive held. A real ``mooncake_master`` (loopback TCP) and the
real journal.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from saria.index import Tier
from saria.runtime import CacheConfig, TieredCache
from saria.sim.real import synthetic_rows
from saria.tiers.remote import RemoteTier, mooncake_available
from saria.tiers.ssd import slot_bytes_for

_WHY = mooncake_available()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")
SSD, REMOTE = Tier.SSD, Tier.REMOTE
BLOCK, N = 4096, 6

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_interleavings_remote import NS, cluster  # noqa: E402,F401 -- a master, another node


def _config(root: Path) -> CacheConfig:
    return CacheConfig(block_bytes=BLOCK, dram_bytes=16 * BLOCK, ssd_dirs=(str(root),),
                       ssd_bytes=4096 + 32 * slot_bytes_for(BLOCK), admission="full-duplicate",
                       write_mode="sync", pin=False)


def _first_run(root: Path, prompt: np.ndarray, *, lose: int | None = None) -> None:
    """A node that writes `prompt` through to its SSD (all but block `lose`,
    which it never computed) and stops."""
    rows = synthetic_rows(prompt, BLOCK)
    with TieredCache(_config(root)) as cache:
        if lose is None:
            cache.store(prompt, rows)
        else:
            cache.store(prompt[:lose], rows[:lose])
            cache.store(prompt, rows[lose + 1:], start=lose + 1)
        cache.flush()


@pytest.mark.parametrize("lose", [None, 1], ids=["whole", "one-lost"])
def test_recovered_ssd_blocks_are_adopted_before_the_cluster_is_asked(tmp_path, cluster, lose):
    master, other = cluster
    prompt = np.random.default_rng(5 + (lose or 0)).integers(0, 256, (N, 32), dtype=np.uint8)
    _first_run(tmp_path / "ssd", prompt, lose=lose)
    other.put(prompt, synthetic_rows(prompt, BLOCK))  # the cluster holds every block too
    tier = RemoteTier(master.settings(segment_bytes=0, staging_rows=16, deadline_s=2.0,
                                      exist_cache_s=0.0), NS, BLOCK)
    cache = TieredCache(_config(tmp_path / "ssd"), remote=tier)
    try:
        local = [i for i in range(N) if i != lose]
        assert len(cache.backend.recovered) == len(local)
        plan = cache.lookup(prompt)
        want = [REMOTE if i == lose else SSD for i in range(N)]
        assert plan.num_available == N and list(plan.tiers) == want
        assert cache.stats.adopted_blocks == len(local)
        assert not cache.backend.recovered  # nothing left to free later
        out = np.zeros((N, BLOCK), np.uint8)
        res = cache.load(prompt, out)
        assert (res.blocks, res.ssd_blocks, res.remote_blocks) == (N, len(local), N - len(local))
        assert np.array_equal(out, synthetic_rows(prompt, BLOCK))
    finally:
        cache.close()
        tier.close()
        other.remove(prompt, force=True)
