"""The cluster tier against a real ``mooncake_master`` started by the test
(loopback TCP, HTTP metadata server, no etcd)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from saria.errors import SariaError
from saria.tiers.remote import (BreakerState, MooncakeMaster, RemoteTier, client_env,
                                mooncake_available)

_WHY = mooncake_available()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")

HERE = Path(__file__).resolve().parent
BLOCK = 64 << 10
sys.path.insert(0, str(HERE))
from remote_node_child import blocks, wait_closed  # noqa: E402


@pytest.fixture(scope="module")
def master():
    client_env()
    with MooncakeMaster() as m:
        yield m


def _tier(master, namespace="ns-a", **kw):
    args = dict(segment_bytes=64 << 20, staging_rows=16, deadline_s=1.0)
    args.update(kw)
    return RemoteTier(master.settings(**args), namespace, BLOCK)


@pytest.fixture()
def tier(master):
    t = _tier(master)
    yield t
    t.close()


def _fresh(n, seed):
    return blocks(n, BLOCK, seed)


def test_put_get_byte_exact_staged_and_zero_copy(tier):
    keys, data = _fresh(20, 1)  # more than the 16 staging rows: two calls
    assert not tier.exists(keys).any()
    res = tier.put(keys, data)
    assert res.stored.all() and not res.failed.any()
    assert tier.exists(keys).all()
    out = np.zeros_like(data)
    assert tier.get(keys, out).ok.all()
    assert np.array_equal(out, data)
    pool = np.zeros((32, BLOCK), np.uint8)
    tier.register(pool)
    slots = np.arange(31, 11, -1)
    got = tier.get(keys, pool, slots)
    assert got.ok.all() and np.array_equal(pool[slots], data)
    snap = tier.snapshot()
    assert snap["counters"]["get_hits"] == 40 and snap["breaker"] == "closed"


def test_put_from_registered_rows_and_skip_existing(tier):
    keys, data = _fresh(6, 2)
    pool = np.zeros((8, BLOCK), np.uint8)
    tier.register(pool)
    pool[2:8] = data
    first = tier.put(keys[:3], pool, [2, 3, 4])
    assert first.stored.all()
    again = tier.put(keys, pool, np.arange(2, 8))
    assert again.skipped.tolist() == [True] * 3 + [False] * 3 and again.stored[3:].all()
    assert again.held.all()
    out = np.zeros_like(data)
    assert tier.get(keys, out).ok.all() and np.array_equal(out, data)


def test_a_put_without_the_exists_call_holds_every_key_and_keeps_existing_objects(tier):
    """skip_existing=False (no exists round trip): every key is held
    afterwards, and an object the cluster had stays as it was -- here its
    bytes differ from the second put's, to tell which one the cluster kept."""
    keys, data = _fresh(6, 5)
    assert tier.put(keys[:3], data[:3]).stored.all()
    other = data.copy()
    other[:3] ^= 0xFF
    again = tier.put(keys, other, skip_existing=False)
    assert again.held.all() and not again.failed.any()
    out = np.zeros_like(data)
    assert tier.get(keys, out).ok.all()
    assert np.array_equal(out[:3], data[:3]) and np.array_equal(out[3:], other[3:])


def test_other_namespace_and_missing_keys_are_misses(master, tier):
    keys, data = _fresh(4, 3)
    tier.put(keys, data)
    other = _tier(master, namespace="ns-b")
    try:
        out = np.zeros_like(data)
        assert not other.exists(keys).any()
        assert not other.get(keys, out).ok.any() and not out.any()
    finally:
        other.close()
    unknown, _ = _fresh(3, 99)
    out = np.zeros((3, BLOCK), np.uint8)
    assert not tier.get(unknown, out).ok.any()
    assert tier.snapshot()["counters"]["get_not_found"] >= 3


def test_a_corrupted_object_is_a_miss_and_leaves_the_cluster(tier):
    keys, data = _fresh(3, 4)
    name = tier.codec.key(keys[1].tobytes())
    bad = bytearray(64 + BLOCK)  # a whole row's length, but not saria's row
    bad[64:] = data[1].tobytes()
    assert tier._store.put(name, bytes(bad)) == 0
    short = tier.codec.key(keys[2].tobytes())
    assert tier._store.put(short, b"x" * 100) == 0  # an object of another size
    tier.put(keys[:1], data[:1])
    out = np.zeros_like(data)
    ok = tier.get(keys, out).ok
    assert ok.tolist() == [True, False, False]
    assert not out[1:].any()  # a staged miss writes nothing
    assert tier.snapshot()["counters"]["verify_failures"] == 1
    tier.forget(keys)
    assert not tier.exists(keys[1:2]).any()  # removed, so a new put can replace it
    assert tier.put(keys[1:2], data[1:2]).stored.all()
    assert tier.get(keys[1:2], out[1:2]).ok.all() and np.array_equal(out[1], data[1])


def test_corrupted_bytes_in_a_zero_copy_row_are_a_miss(tier):
    """A row corrupted in the store (payload bytes flipped after the put)."""
    keys, data = _fresh(2, 5)
    assert tier.put(keys, data).stored.all()
    name = tier.codec.key(keys[0].tobytes())
    row = bytearray(tier._store.get(name))
    assert len(row) == 64 + BLOCK
    row[64 + 1000] ^= 0x10
    tier._store.remove(name, True)
    assert tier._store.put(name, bytes(row)) == 0
    pool = np.zeros((2, BLOCK), np.uint8)
    tier.register(pool)
    assert tier.get(keys, pool).ok.tolist() == [False, True]
    assert np.array_equal(pool[1], data[1])


def test_a_block_another_node_put_is_found_and_lost_with_that_node(master):
    """Node A (another process) puts blocks into its own segment; this node
    finds and loads them byte-exact, and once A dies they are misses within
    the deadline -- never a hang."""
    keys, data = _fresh(8, 6)
    child = subprocess.Popen(
        [sys.executable, str(HERE / "remote_node_child.py"), master.url, master.metadata_server,
         "ns-a", str(BLOCK), "8", "6"], env=master.key_env(),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        b = _tier(master, segment_bytes=0)  # a client only: A holds every object
        try:
            assert b.exists(keys).all()
            out = np.zeros_like(data)
            assert b.get(keys, out).ok.all() and np.array_equal(out, data)
            child.kill()
            child.wait()
            t0 = time.monotonic()
            ok = b.get(keys, out).ok
            assert time.monotonic() - t0 < b.settings.deadline_s + 1.0
            assert not ok.any()
        finally:
            b.close()
    finally:
        child.kill()
        child.wait()


def test_master_killed_breaker_opens_then_restart_resumes():
    """A dead master: calls end within saria's deadline (Mooncake's own wait
    is ~4.3 s), the breaker opens and later calls fail at once; a restarted
    master (every key lost) is probed back, misses, then puts and hits resume."""
    client_env()
    with MooncakeMaster() as m:
        t = RemoteTier(m.settings(segment_bytes=64 << 20, staging_rows=16, deadline_s=0.3,
                                  breaker_failures=2, breaker_cooldown_s=3.0), "ns-f", BLOCK)
        try:
            keys, data = _fresh(4, 7)
            assert t.put(keys, data).stored.all()
            m.kill()
            out = np.zeros_like(data)
            for _ in range(4):
                t0 = time.monotonic()
                assert not t.get(keys, out).ok.any()
                assert not t.put(keys, data).held.any()
                assert time.monotonic() - t0 < 2 * (0.3 + 0.5)
            assert t.guard.state == BreakerState.OPEN
            t0 = time.monotonic()
            assert not t.exists(keys).any()
            assert time.monotonic() - t0 < 0.1  # refused by the open breaker, no call made
            assert t.snapshot()["counters"].get("lookup_down", 0) >= 1
            # Calls saria gave up on at its deadline still run inside Mooncake
            # (~4.3 s each); one still retrying when the master is back lands
            # its put there, a valid row. Let them end so "lost" is exact.
            late = time.monotonic() + 30
            while t.guard.in_flight and time.monotonic() < late:
                time.sleep(0.1)
            assert t.guard.in_flight == 0
            m.start()
            deadline = time.monotonic() + 30
            assert wait_closed(t.guard, lambda: t.exists(keys), 30)
            assert not t.exists(keys).any()  # the restarted master lost them: misses
            assert not t.get(keys, out).ok.any()
            while time.monotonic() < deadline:  # the client remounts its segment
                res = t.put(keys, data)
                if res.held.all():
                    break
                time.sleep(0.3)
            assert res.stored.all()
            assert t.get(keys, out).ok.all() and np.array_equal(out, data)
        finally:
            t.close()


def test_a_stopped_master_leaves_no_log_and_a_failed_start_keeps_the_one_it_names():
    """Its own log in the temp folder goes with ``stop`` (a fleet's tests
    start hundreds); a master that fails to start keeps the log its error
    names, and a log the caller chose is the caller's."""
    with MooncakeMaster() as m:
        assert os.path.exists(m.log_path)
    assert not os.path.exists(m.log_path)
    bad = MooncakeMaster(extra_args=("--no_such_flag_saria_test=1",), start_timeout_s=10)
    with pytest.raises(SariaError, match="see " + re.escape(bad.log_path)):
        bad.start()
    bad.stop()
    assert os.path.exists(bad.log_path)
    os.unlink(bad.log_path)


def test_saria_bench_remote_runs_and_refuses_bad_arguments(tmp_path):
    import json
    import shutil

    saria = shutil.which("saria")
    if saria is None:
        pytest.skip("the saria entry point is not installed")
    out = tmp_path / "remote.json"
    r = subprocess.run([saria, "bench", "remote", "--sizes", "64KiB", "--batch", "4", "--reps", "2",
                        "--lookup-keys", "8", "--lookup-calls", "5", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(out.read_text())
    (case,) = d["sizes"]
    assert case["object_bytes"] == 64 << 10 and len(case["raw_get_runs_GBps"]) == 2
    assert case["put_ratio"] > 0 and d["lookup"]["saria_p50_us"] > 0
    assert d["core"][0]["object_bytes"] == 64 << 10 and d["core"][0]["core_paired_ratio"] > 0
    r = subprocess.run([saria, "bench", "remote", "--sizes", "1KiB"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip().endswith("give object sizes of at least 4 KiB")


def test_lookup_answers_are_reused_until_forgotten(master):
    t = _tier(master, exist_cache_s=60.0)
    try:
        keys, data = _fresh(3, 8)
        assert not t.exists(keys).any()
        other = _tier(master)  # another node puts them
        try:
            assert other.put(keys, data).stored.all()
            assert not t.exists(keys).any()  # the cached answer, no call
            assert t.snapshot()["counters"]["lookup_cached"] == 3
            t.forget(keys[:2])
            assert t.exists(keys).tolist() == [True, True, False]
        finally:
            other.close()
    finally:
        t.close()
