"""``saria serve`` holds nothing for a client that never learned of it
(issue 31, failure 3): a prepare whose reply missed the client's deadline, a
cancel that overtakes its prepare, a batch that fails half-way.

The server is a real ``saria serve`` subprocess made slow with its test
fault injection (``SARIA_SERVE_TEST_DELAY``: the loop stalls after handling
an op, before the reply leaves -- a busy loop as another engine's flush or a
cluster lookup makes it).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from budgets import examples

from test_serve import LAYOUT, Server, chain, server, store, wait_for  # noqa: F401 (fixture)

from saria.serve import protocol as P
from saria.serve.client import RemoteCache, ServerUnavailable


@pytest.fixture
def slow_server(tmp_path, monkeypatch):
    """A server whose first prepare_store and first take_staging reply 1 s late."""
    monkeypatch.setenv("SARIA_SERVE_TEST_DELAY", "prepare_store:1.0:1,take_staging:1.0:1")
    s = Server(tmp_path, "--ssd-dir", str(tmp_path / "ssd"), "--ssd-bytes", str(256 << 14),
               "--admission", "full-duplicate", "--max-staging-share", "1", lease=5.0).start()
    yield s
    if s.proc.poll() is None:
        assert s.stop() == 0


def test_an_idle_client_cancels_the_prepares_whose_replies_it_missed(slow_server):
    """The server registers a store's DRAM slots and a take's staging slots,
    then answers too late; the client, idle from then on, cancels both by
    the ids it chose (from its heartbeat thread, once the server answers a
    probe): the slots are free again and the blocks storable again."""
    other = RemoteCache(slow_server.address, LAYOUT, name="other")
    late = RemoteCache(slow_server.address, LAYOUT, name="late", timeout_s=0.3)
    base = other.gauges()["dram_used_slots"]  # (the staging slots, set aside)
    keys = chain(5, 6)
    with pytest.raises(ServerUnavailable):
        late.prepare_store(keys, 0)
    # no further call from `late`: only its heartbeat may settle the debt
    wait_for(lambda: other.gauges()["dram_used_slots"] == base, limit_s=15)
    wait_for(lambda: not late.breaker.is_open and late.debts == 0)
    with pytest.raises(ServerUnavailable):
        late.take_staging(3)
    wait_for(lambda: late.debts == 0 and not late.breaker.is_open, limit_s=15)
    every = other.take_staging(10**6)
    assert every.size == other.info["staging_slots"]  # the late take's 3 came back
    other.release_staging(every)
    assert store(other, keys) == 6                      # nothing of it stayed filling
    late.close()
    other.close()


def test_a_cancel_that_overtakes_its_prepare_refuses_it(server):
    c = RemoteCache(server.address, LAYOUT)
    keys = chain(6, 5)
    out = c.batch([("cancel", {"spec": 4242}),
                   ("prepare_store", {"keys": keys, "start": 0, "rid": 4242})])
    assert out[0] == {"ok": True, "result": "tombstone"}
    assert not out[1]["ok"] and out[1]["code"] == "cancelled"
    assert c.gauges()["dram_used_slots"] == 0
    assert store(c, keys) == 5
    assert c.cancel(4242) == "tombstone"  # idempotent: nothing held under it
    c.close()


def test_a_batch_that_fails_half_way_undoes_what_it_prepared(server):
    """An error escapes the batch after its first call prepared a store: the
    client gets one error for the batch and the store is undone."""
    c = RemoteCache(server.address, LAYOUT)
    keys = chain(7, 5)
    with pytest.raises(P.RemoteError):
        c.batch([("prepare_store", {"keys": keys, "start": 0}), ("batch", {})])
    assert c.gauges()["dram_used_slots"] == 0
    assert store(c, keys) == 5
    c.close()


def test_tombstones_are_bounded_oldest_first():
    from saria.serve.specids import SpecIds

    ids = SpecIds(limit=3)
    for rid in range(1, 6):
        ids.bury(rid)
    assert len(ids) == 3
    assert ids.claim({"rid": 1}, set(), lambda: 0) == 1   # forgotten: the prepare goes on
    with pytest.raises(P.RemoteError, match="cancelled"):
        ids.claim({"rid": 5}, set(), lambda: 0)
    assert ids.claim({"rid": 5}, set(), lambda: 0) == 5   # a tombstone refuses once
    with pytest.raises(P.ProtocolError, match="in use"):
        ids.claim({"rid": 7}, {7}, lambda: 0)
    assert ids.claim({}, set(), lambda: 99) == 99


def test_an_ended_session_keeps_its_slots_until_its_workers_are_fenced(tmp_path):
    """A session's lease runs out while one of its workers is mid-copy (it
    holds the session's fence): the server ends the session but keeps its
    store's DRAM slots -- not reused, not readable -- until the copy is over;
    then frees them, and a copy of that session that comes later fails."""
    from saria.serve.fence import WorkerFence

    srv = Server(tmp_path, lease=1.0).start()
    other = RemoteCache(srv.address, LAYOUT, name="other")
    base = other.gauges()["dram_used_slots"]
    gone = RemoteCache(srv.address, LAYOUT, name="gone", heartbeat=False)
    keys = chain(8, 6)
    assert gone.prepare_store(keys, 0).num_blocks == 6
    worker = WorkerFence()
    assert worker.hold(gone.info["fence"])                 # a copy into its slots runs
    wait_for(lambda: other.stats()["leases_expired"] == 1)
    assert other.stats()["sessions_fencing"] == 1
    assert other.gauges()["dram_used_slots"] == base + 6   # quarantined, not reused
    assert other.lookup(keys).num_blocks == 0              # nor readable
    worker.release()                                       # the copy is over
    wait_for(lambda: other.gauges()["dram_used_slots"] == base)
    assert other.stats()["sessions_fencing"] == 0
    assert not WorkerFence().hold(gone.info["fence"])      # a later copy of it fails
    assert store(other, keys) == 6
    other.close()
    assert srv.stop() == 0


def test_the_breaker_refuses_while_open_and_backs_off_its_probes():
    from saria.serve.breaker import Breaker

    now = [0.0]
    b = Breaker("ipc://x", min_s=0.25, max_s=2.0, clock=lambda: now[0])
    assert not b.refuse(may_probe=False)
    b.trip("no reply")
    assert b.is_open and b.refuse(may_probe=False) and b.refuse(may_probe=True)
    gaps = []
    for _ in range(6):                      # each failed probe doubles the wait, up to max_s
        gaps.append(b.seconds_to_probe())
        now[0] += gaps[-1]
        assert b.probe_due() and not b.refuse(may_probe=True)
        b.probe_failed()
    assert gaps == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    b.reset()
    assert not b.is_open and b.seconds_to_probe() is None and b.opened == 1
    assert b.skipped == 2


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 12)), max_size=60),
       st.integers(1, 5))
def test_tombstones_match_a_reference_model(events, limit):
    """Cancels (bury) and prepares (claim) in any order: a prepare is refused
    exactly when one of the last `limit` cancels named it and no prepare has
    consumed that cancel since."""
    from saria.serve.specids import SpecIds

    ids, model = SpecIds(limit=limit), []  # model: buried ids, oldest first, no repeats
    for is_cancel, rid in events:
        if is_cancel:
            ids.bury(rid)
            model = [r for r in model if r != rid] + [rid]
            model = model[-limit:]
            continue
        refused = rid in model
        try:
            ids.claim({"rid": rid}, set(), lambda: 0)
            assert not refused
        except P.RemoteError:
            assert refused
            model.remove(rid)
        assert len(ids) == len(model)
