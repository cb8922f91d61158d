"""A load cut short by a failed cluster fetch keeps what it still hands out.

``TieredCache.prepare_load`` leaves the cache's lock while it fetches the
blocks only the cluster holds. Meanwhile the SSD writer may land the write of
a write-behind victim on the same path (a DRAM block kept readable only for
its readers). When a fetch then fails, the core cuts the load before the
failed block (``CacheManager.shorten_load``): the blocks it still hands out
must stay locked all along -- unlocking the whole path and re-locking its
prefix let the landed victim leave DRAM and a store take its slot while the
spec still named it (issue 31, failure 1: the load returned another block's
bytes).

The test runs ``prepare_load``'s three steps itself (they are the real code:
the core's ``prepare_load`` under the lock, the backend's fetch outside it,
the core's ``complete_fetch`` under it) so the writer lands in between; once
with the manual writer, once with the real writer thread. The cluster is a
real ``mooncake_master`` (loopback TCP); the failed fetch is a block another
node removed after the lookup.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_interleavings_remote import NS, cluster  # noqa: E402,F401 -- a master, another node

_WHY = mooncake_available()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")

DRAM, SSD, REMOTE = Tier.DRAM, Tier.SSD, Tier.REMOTE
BLOCK = 4096
DRAM_BLOCKS = 8


def chain(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 256, (n, 32), dtype=np.uint8)


@pytest.mark.parametrize("mode", ["manual", "async"])
def test_a_failed_fetch_keeps_a_landed_victim_the_load_still_reads(tmp_path, cluster, mode):
    master, other = cluster
    rng = np.random.default_rng(31 + len(mode))
    prompt, filler, later = chain(rng, 4), chain(rng, DRAM_BLOCKS), chain(rng, DRAM_BLOCKS)
    tier = RemoteTier(master.settings(segment_bytes=0, staging_rows=16, deadline_s=2.0,
                                      exist_cache_s=0.0), NS, BLOCK)
    cache = TieredCache(CacheConfig(
        block_bytes=BLOCK, dram_bytes=DRAM_BLOCKS * BLOCK, ssd_dirs=(str(tmp_path / "ssd"),),
        ssd_bytes=4096 + 32 * slot_bytes_for(BLOCK), admission="write-back", write_mode=mode,
        write_behind=2, pin=False), remote=tier)
    try:
        other.put(prompt, synthetic_rows(prompt, BLOCK))  # the cluster holds the whole prompt
        cache.store(prompt[:2], synthetic_rows(prompt[:2], BLOCK))
        with cache.holding():  # the writer thread cannot land anything before the fetch
            # New blocks push the prompt's two out of DRAM: written back, kept
            # readable in DRAM until their writes land (write-behind).
            cache.store(filler, synthetic_rows(filler, BLOCK))
            for k in prompt[:2]:
                assert cache.writing(bytes(k)) and cache.index.slot_of(bytes(k), DRAM) is not None
            assert cache.lookup(prompt).num_available == 4
            spec = cache.manager.prepare_load(prompt, 4)  # TieredCache.prepare_load, under the lock
            assert spec.tiers[:2].tolist() == [DRAM, DRAM] and spec.remote.tolist() == [2, 3]
        # Off the lock: the victims' writes land (they are SSD blocks now,
        # kept in DRAM only for this load), and block 2 leaves the cluster.
        cache.flush()
        assert not cache.writing(bytes(prompt[0])) and not cache.writing(bytes(prompt[1]))
        other.remove(prompt[2:3], force=True)
        ok = cache.backend.fetch_remote(spec.path[spec.remote], spec.slots[spec.remote])
        assert ok.tolist() == [False, True]
        with cache.holding():
            spec = cache.manager.complete_fetch(spec, ok)
        assert spec.num_blocks == 2
        # Another request's blocks take every free DRAM slot before the mover reads.
        cache.store(later, synthetic_rows(later, BLOCK))
        out = np.zeros((2, BLOCK), np.uint8)
        failed = cache.read(spec, out)
        assert failed.size == 0
        assert np.array_equal(out, synthetic_rows(prompt[:2], BLOCK)), \
            "the load returned another block's bytes"
        assert cache.complete_load(spec, failed) == 2
        cache.flush()
        cache.index.check()
        g = cache.gauges()
        assert g["dram_used_slots"] == cache.index.stats().resident["DRAM"]
        assert g["dram_write_behind_used"] == 0
        # The victims left DRAM once the load let go; their SSD copies serve the next load.
        plan = cache.lookup(prompt[:2])
        assert plan.num_available == 2 and list(plan.tiers) == [SSD, SSD]
    finally:
        cache.close()
        tier.close()
        other.remove(np.concatenate([prompt, filler, later]), force=True)


def test_remote_residency_uses_the_cores_public_verbs_only():
    """No module outside the core reaches into the manager's privates (the
    unlock-then-relock above came from ``saria.core.remote`` calling
    ``_unlock`` and ``_make_room``)."""
    import re

    import saria

    root = Path(saria.__file__).parent
    pattern = re.compile(r"\b(?:m|manager|self\.m|self\.manager|cache\.manager)\._[a-z]")
    offenders = [f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py")
                 if p.name != "manager.py"
                 for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert offenders == [], offenders
