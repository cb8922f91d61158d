"""The cluster tier in the cache core (``saria.core.remote``): two saria
nodes (``TieredCache``s in separate processes) against a real
``mooncake_master`` started by the test (loopback TCP)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from saria.index import Tier
from saria.policy.publish import PublishPolicy
from saria.runtime import CacheConfig, TieredCache
from saria.tiers.remote import BreakerState, MooncakeMaster, RemoteTier, client_env, mooncake_available

_WHY = mooncake_available()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")

HERE = Path(__file__).resolve().parent
BLOCK = 64 << 10
NS = "ns-core"
sys.path.insert(0, str(HERE))
from remote_node_child import blocks, wait_closed  # noqa: E402

DRAM, SSD, REMOTE = Tier.DRAM, Tier.SSD, Tier.REMOTE


@pytest.fixture(scope="module")
def master():
    client_env()
    with MooncakeMaster() as m:
        yield m


class Node:
    """Node A: another process with its own cache, publishing what it stores."""

    def __init__(self, master, tmp: Path) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "remote_cache_child.py"), master.url,
             master.metadata_server, NS, str(BLOCK), str(tmp)], env=master.key_env(),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def put(self, n: int, seed: int) -> int:
        self.proc.stdin.write(f"put {n} {seed}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline().split()
        assert line and line[0] == "ready", line
        return int(line[1])

    def close(self) -> None:
        """Quits cleanly (unmounts its segment: the master stops placing
        objects there), killed if it does not."""
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.flush()
            self.proc.wait(20)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


@pytest.fixture()
def node_a(master, tmp_path):
    a = Node(master, tmp_path / "a")
    yield a
    a.close()


def _cache(master, tmp: Path | None = None, *, dram_blocks=32, ssd_blocks=0, segment=0,
           publish=None, write_mode="sync", admission="saria", **settings):
    args = dict(segment_bytes=segment, staging_rows=16, deadline_s=1.0)
    args.update(settings)
    tier = RemoteTier(master.settings(**args), NS, BLOCK)
    cfg = CacheConfig(block_bytes=BLOCK, dram_bytes=dram_blocks * BLOCK,
                      ssd_dirs=(str(tmp),) if ssd_blocks else (), ssd_bytes=ssd_blocks * BLOCK,
                      write_mode=write_mode, admission=admission)
    return TieredCache(cfg, remote=tier, publish=publish), tier


def _close(cache, tier):
    cache.close()
    tier.close()


def test_node_b_loads_node_a_prefix_byte_exact_from_the_cluster(master, node_a):
    keys, data = blocks(12, BLOCK, 21)
    assert node_a.put(12, 21) == 12
    b, tier = _cache(master)  # a client only: A's segment holds every object
    try:
        plan = b.lookup(keys)
        assert plan.num_blocks == 12 and plan.blocks_from(REMOTE) == 12
        out = np.zeros_like(data)
        res = b.load(keys, out)
        assert res.blocks == 12 and res.remote_blocks == 12 and res.dram_blocks == 0
        assert np.array_equal(out, data)
        assert b.stats.remote_hit_blocks == 12 and b.stats.hit_blocks["DRAM"] == 0
        # fetched blocks are ready DRAM copies now: the next load reads DRAM
        plan = b.lookup(keys)
        assert plan.blocks_from(DRAM) == 12
        out2 = np.zeros_like(data)
        res = b.load(keys, out2)
        assert res.dram_blocks == 12 and res.remote_blocks == 0 and np.array_equal(out2, data)
        b.index.check()
    finally:
        _close(b, tier)


def test_local_prefix_then_cluster_then_a_gap(master, node_a):
    """B holds the first blocks itself; the cluster the next ones; past the
    first block nobody holds nothing is found."""
    keys, data = blocks(10, BLOCK, 22)
    assert node_a.put(10, 22) == 10
    b, tier = _cache(master)
    try:
        b.store(keys[:3], data[:3])
        tier.remove(keys[7:8], force=True)  # block 7 leaves the cluster
        plan = b.lookup(keys)
        assert plan.num_blocks == 7
        assert plan.tiers.tolist() == [DRAM] * 3 + [REMOTE] * 4
        out = np.zeros_like(data)
        res = b.load(keys, out)
        assert res.blocks == 7 and res.remote_blocks == 4 and res.dram_blocks == 3
        assert np.array_equal(out[:7], data[:7])
    finally:
        _close(b, tier)


def test_a_long_prefix_is_found_past_the_first_window(master, node_a):
    """The lookup goes on while the cluster holds every block it asked about,
    twice as many each round: with a window of 4, 30 held blocks take four
    round trips (4 + 8 + 16 + 2) and load byte-exact; a block the cluster
    lost ends the run there."""
    keys, data = blocks(30, BLOCK, 24)
    assert node_a.put(30, 24) == 30
    b, tier = _cache(master, max_lookup_keys=4, exist_cache_s=0)
    try:
        assert b.manager.remote.lookup_blocks == 4
        plan = b.lookup(keys)
        assert plan.num_blocks == 30 and plan.blocks_from(REMOTE) == 30
        assert b.manager.remote.lookup_rounds == 4
        out = np.zeros_like(data)
        res = b.load(keys, out)
        assert res.blocks == 30 and res.remote_blocks == 30 and np.array_equal(out, data)
    finally:
        _close(b, tier)
    tier.close()
    b, tier = _cache(master, max_lookup_keys=4, exist_cache_s=0)
    try:
        tier.remove(keys[13:14], force=True)
        plan = b.lookup(keys)
        assert plan.num_blocks == 13 and b.manager.remote.lookup_rounds == 3  # 4, 8, then 1 of 16
        out = np.zeros_like(data)
        assert b.load(keys, out).remote_blocks == 13 and np.array_equal(out[:13], data[:13])
    finally:
        _close(b, tier)


def test_a_corrupted_object_is_a_miss_and_leaves_the_index(master, node_a):
    keys, data = blocks(6, BLOCK, 23)
    assert node_a.put(6, 23) == 6
    b, tier = _cache(master)
    try:
        name = tier.codec.key(keys[4].tobytes())
        row = bytearray(tier._store.get(name))
        row[64 + 7] ^= 0x01  # one payload bit
        assert tier._store.remove(name, True) == 0
        assert tier._store.put(name, bytes(row)) == 0
        assert b.lookup(keys).blocks_from(REMOTE) == 6  # the cluster says it holds it
        out = np.zeros_like(data)
        res = b.load(keys, out)
        assert res.blocks == 4 and np.array_equal(out[:4], data[:4])
        assert not out[4:].any()  # nothing of the corrupted block reached the caller
        assert b.stats.remote_load_failures == 1
        assert b.index.slot_of(keys[4].tobytes(), REMOTE) is None
        assert b.index.slot_of(keys[4].tobytes(), DRAM) is None
        assert b.lookup(keys).num_blocks == 4
        # block 5 arrived verified: a ready DRAM copy (unreachable until 4 is back);
        # the failed block's slot went back to the pool
        assert b.index.slot_of(keys[5].tobytes(), DRAM) is not None
        assert b.backend.pool.used_slots == 5
        b.index.check()
    finally:
        _close(b, tier)


def test_publishing_victims_and_skipping_their_ssd_copy(master, tmp_path):
    """B publishes its DRAM victims that proved reuse before their slots are
    freed; once the cluster holds them, a later eviction writes no SSD copy
    (counted), and they come back from the cluster byte-exact."""
    b, tier = _cache(master, tmp_path / "b", dram_blocks=8, ssd_blocks=64, segment=64 << 20,
                     publish=PublishPolicy(min_reuse=2, accessed=False, keep_local_hits=100),
                     admission="write-back")
    try:
        st = b.stats
        keys, data = blocks(6, BLOCK, 24)
        b.store(keys, data)
        b.touch(keys, hits=0)
        b.touch(keys, hits=6)  # reuse 2: proved reuse
        b.store(*blocks(8, BLOCK, 25))  # evicts the six (never reused blocks are not published)
        b.flush()
        assert st.remote_published_blocks == 6 and st.ssd_writes_skipped_remote == 0
        assert all(b.index.slot_of(k.tobytes(), REMOTE) is not None for k in keys)
        b.manager.drop_ssd(keys)  # the SSD copies admission wrote before the puts landed
        out = np.zeros_like(data)
        res = b.load(keys, out)
        assert res.remote_blocks == 6 and np.array_equal(out, data)
        b.store(*blocks(8, BLOCK, 26))  # evicts them again: the cluster holds them
        b.flush()
        assert st.ssd_writes_skipped_remote == 6
        assert all(b.index.slot_of(k.tobytes(), SSD) is None for k in keys)
        assert b.gauges()["ssd_bytes_saved_remote"] == 6 * BLOCK
        out = np.zeros_like(data)
        res = b.load(keys, out)
        assert res.remote_blocks == 6 and np.array_equal(out, data)
        b.index.check()
    finally:
        _close(b, tier)


def test_master_killed_mid_run_then_restarted(tmp_path):
    """A dead master: lookups and loads end within the deadline (Mooncake's
    own wait is ~4.3 s), the breaker opens and every REMOTE copy leaves the
    index, local blocks keep serving byte-exact; after a restart (every key
    lost) the old blocks are misses, then new puts and hits resume."""
    client_env()
    with MooncakeMaster() as m:
        a = Node(m, tmp_path / "a")
        b, tier = _cache(m, deadline_s=0.3, breaker_failures=2, breaker_cooldown_s=2.0,
                         exist_cache_s=0.0)
        try:
            keys, data = blocks(8, BLOCK, 31)
            assert a.put(8, 31) == 8
            b.store(keys[:2], data[:2])  # B's own prefix
            assert b.lookup(keys).num_blocks == 8
            m.kill()
            out = np.zeros_like(data)
            for _ in range(4):
                t0 = time.monotonic()
                res = b.load(keys, out)
                assert time.monotonic() - t0 < 2 * (0.3 + 0.5)
                assert res.blocks >= 2 and np.array_equal(out[:2], data[:2])
                assert np.array_equal(out[:res.blocks], data[:res.blocks])
                b.lookup(keys)
            assert tier.guard.state == BreakerState.OPEN
            plan = b.lookup(keys)
            assert plan.num_blocks == 2 and plan.blocks_from(REMOTE) == 0
            assert all(b.index.slot_of(k.tobytes(), REMOTE) is None for k in keys)
            m.start()
            deadline = time.monotonic() + 40
            assert wait_closed(tier.guard, lambda: b.lookup(keys), 40)
            assert b.lookup(keys).num_blocks == 2  # the restarted master lost them
            keys2, data2 = blocks(5, BLOCK, 32)
            while time.monotonic() < deadline and a.put(5, 32) < 5:  # A remounts its segment
                time.sleep(0.3)
            assert b.lookup(keys2).blocks_from(REMOTE) == 5
            out2 = np.zeros_like(data2)
            res = b.load(keys2, out2)
            assert res.remote_blocks == 5 and np.array_equal(out2, data2)
        finally:
            _close(b, tier)
            a.close()


def test_a_late_get_keeps_its_slot_until_it_really_ends(master, node_a):
    """Node A stops (SIGSTOP) while B fetches from A's segment: the get is
    late, the blocks are misses, and the DRAM slots it may still write are
    not handed out again until it ends (after SIGCONT) -- no reader sees them."""
    keys, data = blocks(4, BLOCK, 33)
    assert node_a.put(4, 33) == 4
    b, tier = _cache(master, dram_blocks=8, deadline_s=0.3, lane=4)
    try:
        assert b.lookup(keys).blocks_from(REMOTE) == 4
        os.kill(node_a.proc.pid, signal.SIGSTOP)
        try:
            out = np.zeros_like(data)
            res = b.load(keys, out)
            assert res.blocks == 0 and not out.any()
            assert tier.guard.in_flight == 1  # the get is still out
            late = set(b.backend._free_later)
            assert len(late) == 4 and b.backend.pool.used_slots == 4
            assert all(b.index.slot_of(k.tobytes(), DRAM) is None for k in keys)
            other, odata = blocks(8, BLOCK, 34)
            assert b.store(other, odata) == 4  # only the four slots no get may write
            assert late.isdisjoint(b.index.slots_in(other, DRAM)[0].tolist())
        finally:
            os.kill(node_a.proc.pid, signal.SIGCONT)
        end = time.monotonic() + 30
        while (tier.guard.in_flight or b.backend._free_later) and time.monotonic() < end:
            time.sleep(0.05)
        assert tier.guard.in_flight == 0
        # the get's end gave its slots back (on the guard's thread), with no call of the backend
        assert not b.backend._free_later and b.backend.pool.used_slots == 4
        more, mdata = blocks(4, BLOCK, 35)
        assert b.store(more, mdata) == 4
    finally:
        _close(b, tier)
