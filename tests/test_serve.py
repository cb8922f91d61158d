"""``saria serve``: a real server process, real clients, real faults.

The server runs as ``saria serve`` in a subprocess (so SIGKILL and SIGTERM are
real); clients are ``RemoteCache`` objects in this process or in child
processes. Bytes go through the server's shared DRAM pool as an engine's
workers would move them.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from budgets import examples

from saria.index import Tier
from saria.keys import BlockHasher, keys_to_array
from saria.serve import protocol as P
from saria.serve.client import RemoteCache, ServerUnavailable, server_stats

SLOT = 16 << 10
LAYOUT = dict(model="tiny", dtype="float32", block_size=16, page_bytes=SLOT, num_layers=2,
              tp_size=1, kv_layout="default", hash_algo="sha256_cbor", hash_seed="t",
              slot_bytes=SLOT)


def chain(seed: int, n: int) -> np.ndarray:
    return keys_to_array(BlockHasher(16, seed="serve").block_keys(
        [seed * 100_000 + i for i in range(16 * n)]))


class Server:
    """A ``saria serve`` subprocess on an ipc socket in `tmp`."""

    def __init__(self, tmp, *args: str, lease: float = 1.0) -> None:
        self.address = f"ipc://{tmp}/serve.sock"
        for flag, value in zip(args, args[1:]):  # saria serve never creates an SSD directory
            if flag == "--ssd-dir":
                os.makedirs(value, exist_ok=True)
        self.args = ["--dram", str(64 * SLOT), "--listen", self.address, "--lease", str(lease),
                     *args]
        self.log = open(os.path.join(tmp, "serve.log"), "a")
        self.proc: subprocess.Popen | None = None

    def start(self) -> Server:
        self.proc = subprocess.Popen([sys.executable, "-m", "saria.cli.main", "serve", *self.args],
                                     stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                server_stats(self.address, 0.5)
                return self
            except (ServerUnavailable, P.RemoteError):
                assert self.proc.poll() is None, "saria serve exited at start"
        raise AssertionError("saria serve did not answer within 30 s")

    def stop(self, sig=signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=30)


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path).start()
    yield s
    if s.proc.poll() is None:
        assert s.stop() == 0


def pool_of(client: RemoteCache) -> np.ndarray:
    i = client.info
    return np.memmap(i["pool"], np.uint8, "r+", shape=(i["pool_slots"], i["slot_bytes"]))


def fill(keys: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Each block's bytes: its key repeated (so a wrong slot cannot pass)."""
    return np.tile(keys[positions], (1, SLOT // 32))


def store(client: RemoteCache, keys: np.ndarray) -> int:
    spec = client.prepare_store(keys, 0)
    pool = pool_of(client)
    pool[spec.slots] = fill(keys, spec.positions)
    pool.flush()
    return client.complete_store(spec)


def wait_for(cond, limit_s: float = 20.0) -> None:
    """Polls `cond` until it holds (a bound for a hung test, not a timing)."""
    deadline = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


# ------------------------------------------------------------ sharing


def test_a_second_engine_reads_what_the_first_stored(server):
    """Engine B's first lookup of a prefix engine A stored finds every block
    in the shared pool, and the bytes are A's."""
    a = RemoteCache(server.address, LAYOUT, name="A")
    b = RemoteCache(server.address, LAYOUT, name="B")
    keys = chain(1, 12)
    assert b.lookup(keys).num_blocks == 0
    assert store(a, keys) == 12
    assert b.lookup(keys).num_blocks == 12
    spec = b.prepare_load(keys, 12)
    assert (spec.tiers == int(Tier.DRAM)).all()
    got = np.asarray(pool_of(b)[spec.slots])
    assert np.array_equal(got, fill(keys, np.arange(12)))
    assert b.complete_load(spec) == 12
    snap = b.stats()
    assert snap["engines"]["B"]["dram_hit_blocks"] == 12
    assert snap["sessions"] == 2
    a.close(), b.close()


def test_an_engine_started_before_its_server_waits_for_its_hello(tmp_path):
    """A client whose server is not up yet (a node's units starting side by
    side) retries its hello for ``start_s`` and gets its session once the
    server answers; without a server it gives up then, saying so."""
    srv = Server(tmp_path)
    threading.Timer(1.5, srv.start).start()
    try:
        c = RemoteCache(srv.address, LAYOUT, name="early", start_s=30.0)
        keys = chain(3, 4)
        assert store(c, keys) == 4 and c.lookup(keys).num_blocks == 4
        c.close()
    finally:
        while srv.proc is None:
            time.sleep(0.05)
        assert srv.stop() == 0
    t0 = time.monotonic()
    with pytest.raises(ServerUnavailable, match=r"retried for 1 s"):
        RemoteCache(f"ipc://{tmp_path}/nobody.sock", LAYOUT, timeout_s=0.2, start_s=1.0)
    assert time.monotonic() - t0 >= 1.0


def test_different_layouts_never_mix(server, tmp_path):
    """Another model is another namespace: with --max-models 1 it is refused
    with the limit named; a second server allowing two keeps them apart."""
    a = RemoteCache(server.address, LAYOUT, name="A")
    with pytest.raises(P.RemoteError, match="max-models"):
        RemoteCache(server.address, dict(LAYOUT, model="other"), name="X")
    a.close()
    d = tmp_path / "two"
    d.mkdir()
    s2 = Server(d, "--max-models", "2").start()
    try:
        a = RemoteCache(s2.address, LAYOUT, name="A")
        x = RemoteCache(s2.address, dict(LAYOUT, model="other"), name="X")
        keys = chain(2, 4)
        store(a, keys)
        assert a.lookup(keys).num_blocks == 4 and x.lookup(keys).num_blocks == 0
        assert a.info["namespace"] != x.info["namespace"]
        a.close(), x.close()
    finally:
        assert s2.stop() == 0


def test_batch_is_one_round_trip_with_per_call_results(server):
    c = RemoteCache(server.address, LAYOUT)
    keys = chain(3, 3)
    store(c, keys)
    out = c.batch([("lookup", {"keys": keys}), ("touch", {"keys": keys, "hits": 3}),
                   ("complete_load", {"spec": 999})])
    assert out[0] == {"ok": True, "result": {"num_blocks": 3}}
    assert out[1]["ok"] and out[1]["result"] == 3
    assert not out[2]["ok"] and out[2]["code"] == "session"
    c.close()


# ------------------------------------------------------------ faults


CHILD = textwrap.dedent("""
    import sys, time, numpy as np
    from saria.serve.client import RemoteCache
    sys.path.insert(0, {tests!r})
    from test_serve import LAYOUT, chain
    c = RemoteCache({address!r}, LAYOUT, name="doomed")
    keys = chain(7, 20)
    spec = c.prepare_store(keys, 0)          # DRAM slots taken, the path locked
    staging = c.take_staging(3)
    print(len(spec.slots), len(staging), flush=True)
    time.sleep(600)                           # killed here, mid-store
""")


def test_an_engine_killed_mid_store_leaks_nothing(tmp_path):
    """SIGKILL an engine holding DRAM slots and staging: when its lease runs
    out the server frees them, and another engine keeps storing and hitting."""
    server = Server(tmp_path, "--ssd-dir", str(tmp_path / "ssd"), "--ssd-bytes",
                    str(512 * SLOT), "--admission", "full-duplicate",
                    "--max-staging-share", "1").start()
    other = RemoteCache(server.address, LAYOUT, name="other")
    base = other.gauges()["dram_used_slots"]
    keys = chain(8, 4)
    store(other, keys)
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(
        tests=os.path.dirname(__file__), address=server.address)],
        stdout=subprocess.PIPE, text=True)
    held, staged = map(int, child.stdout.readline().split())
    assert held == 20 and staged == 3
    assert other.gauges()["dram_used_slots"] == base + 4 + 20  # (staging is set aside: counted)
    child.send_signal(signal.SIGKILL)
    child.wait()
    deadline = time.monotonic() + 10
    while other.stats()["sessions"] > 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    snap = other.stats()
    assert snap["sessions"] == 1 and snap["leases_expired"] == 1
    assert other.gauges()["dram_used_slots"] == base + 4   # the doomed store's slots are free
    assert other.lookup(chain(7, 20)).num_blocks == 0     # and it left nothing half-stored
    assert other.lookup(keys).num_blocks == 4
    assert store(other, chain(9, 30)) == 30               # the freed room is usable
    assert other.take_staging(10**6).size == other.info["staging_slots"]  # all returned
    other.close()
    assert server.stop() == 0


def test_an_idle_engine_keeps_its_session_by_heartbeat(server):
    c = RemoteCache(server.address, LAYOUT)
    sid = c.session
    time.sleep(2.5)  # 2.5 leases without a call
    assert c.stats()["leases_expired"] == 0
    c.lookup(chain(1, 1))
    assert c.session == sid and c.reconnects == 0
    c.close()


def test_server_restart_engines_recompute_then_reconnect_and_find_the_ssd(tmp_path):
    """SIGKILL the server while an engine holds a load: calls fail fast
    (``ServerUnavailable``: the engine recomputes), the restarted server is
    seen through its boot token, the old spec completes as nothing, the
    client says hello by itself, and the SSD blocks are recovered -- from
    the journal, its reads apart from "SSD bytes read" (the scrub's too)."""
    srv = Server(tmp_path, "--ssd-dir", str(tmp_path / "ssd"), "--ssd-bytes", str(512 * SLOT),
                 "--admission", "full-duplicate", "--scrub-rate", "50MB").start()
    c = RemoteCache(srv.address, LAYOUT, timeout_s=0.5)
    keys = chain(4, 10)
    store(c, keys)
    c.flush()
    spec = c.prepare_load(keys, 10)
    old_pool = c.info["pool"]
    srv.stop(signal.SIGKILL)
    with pytest.raises(ServerUnavailable):
        c.lookup(keys)
    assert os.path.exists(old_pool)       # a killed server cannot clean up ...
    srv.start()
    assert not os.path.exists(old_pool)   # ... its successor removes the dead one's pool
    wait_for(lambda: not c.breaker.is_open)  # the heartbeat's probe finds it back
    boot = c.boot
    plan = c.lookup(keys)                 # a new session on the new server
    assert c.boot != boot and c.reconnects >= 1
    assert plan.num_blocks == 10          # recovered from the SSD
    g = c.gauges()
    assert g["ssd_bytes_read"] == 0 and g["ssd_recovery_bytes_read"] > 0
    assert g["ssd_recovery_bytes_read"] < 10 * SLOT  # the journal, not the blocks
    assert c.complete_load(spec) == 0     # the old boot's spec is void
    fresh = c.prepare_load(keys, 10)
    assert (fresh.tiers == int(Tier.SSD)).all()
    assert c.complete_load(fresh) == 10
    c.close()
    assert srv.stop() == 0


def test_the_metrics_endpoint_and_status(tmp_path):
    """Prometheus: sessions, per-engine hit blocks, the RPC latency
    histogram; ``saria status`` prints the same as a table."""
    import socket
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    srv = Server(tmp_path, "--metrics-port", str(port)).start()
    c = RemoteCache(srv.address, LAYOUT, name="eng")
    keys = chain(5, 6)
    store(c, keys)
    c.complete_load(c.prepare_load(keys, 6))
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "saria_serve_sessions 1.0" in text
    assert 'saria_serve_engine_total{engine="eng",figure="dram_hit_blocks"} 6.0' in text
    assert 'saria_serve_rpc_seconds_count{op="lookup"}' in text or \
        'saria_serve_rpc_seconds_count{op="prepare_load"} 1.0' in text
    r = subprocess.run([sys.executable, "-m", "saria.cli.main", "status", srv.address],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "eng" in r.stdout and "dram_slots" in r.stdout
    c.close()
    assert srv.stop() == 0
    r = subprocess.run([sys.executable, "-m", "saria.cli.main", "status", srv.address,
                        "--timeout", "0.3"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no reply" in r.stderr


def test_sigterm_flushes_and_removes_the_pool(tmp_path):
    srv = Server(tmp_path).start()
    c = RemoteCache(srv.address, LAYOUT)
    pool = c.info["pool"]
    assert os.path.exists(pool)
    c.close()
    assert srv.stop() == 0
    assert not os.path.exists(pool)


def test_the_socket_is_owner_only_and_not_taken_twice(server):
    path = server.address[len("ipc://"):]
    assert stat.S_IMODE(os.stat(path).st_mode) & 0o077 == 0
    r = subprocess.run([sys.executable, "-m", "saria.cli.main", "serve", "--listen",
                        server.address], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "listen: a saria serve already answers" in r.stderr
    assert server_stats(server.address)["sessions"] == 0  # the first one still serves


def test_bad_settings_fail_at_start_with_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "saria.cli.main", "serve", "--admission", "nope",
                        "--listen", f"ipc://{tmp_path}/x.sock"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "nope" in lines[0]


# ------------------------------------------------------------ bad frames


def _raw(address: str, frame: bytes) -> dict:
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(address)
    try:
        s.send(frame)
        assert s.poll(5000), "the server did not answer"
        return msgpack.unpackb(s.recv(), raw=False)
    finally:
        s.close(0)


def test_a_wrong_version_and_a_malformed_frame_get_errors(server):
    r = _raw(server.address, P.pack({"v": 99, "id": 5, "op": "ping", "args": {}}))
    assert r["ok"] is False and r["code"] == "version" and r["id"] == 5
    r = _raw(server.address, b"\xc1 not msgpack")
    assert r["ok"] is False and r["code"] == "protocol"
    r = _raw(server.address, P.pack({"v": P.VERSION, "id": 6, "op": "lookup",
                                     "session": "nope", "args": {}}))
    assert r["code"] == "session"
    c = RemoteCache(server.address, LAYOUT)
    with pytest.raises(P.RemoteError, match="keys"):
        c._call("lookup", {"keys": np.zeros((2, 31), np.uint8)})
    c.close()


def test_a_bad_completion_leaves_the_spec_in_place(server):
    """Arguments are checked before a spec leaves the session: a completion
    with bad positions is refused and the right one still works (no lock
    lost); out-of-range counts are refused before they reach the cache."""
    c = RemoteCache(server.address, LAYOUT)
    keys = chain(6, 5)
    store(c, keys)
    spec = c.prepare_load(keys, 5)
    with pytest.raises(P.RemoteError, match="failed"):
        c._call("complete_load", {"spec": spec.spec, "failed": np.array([7])}, renew=False)
    with pytest.raises(P.RemoteError, match="failed"):
        c._call("complete_load", {"spec": spec.spec, "failed": "x"}, renew=False)
    assert c.complete_load(spec) == 5
    for op, args in (("take_staging", {"count": -1}),
                     ("touch", {"keys": keys, "hits": 6})):
        with pytest.raises(P.RemoteError):
            c._call(op, args)
    c.close()


_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=8)
    | st.binary(max_size=16),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=4),
    max_leaves=12)


@settings(max_examples=examples(150), deadline=None)
@given(frame=st.one_of(
    st.binary(max_size=64),
    _values.map(lambda v: msgpack.packb(v, use_bin_type=True)),
    st.fixed_dictionaries({"v": st.just(P.VERSION), "id": st.integers(0, 9),
                           "op": st.sampled_from(["lookup", "touch", "prepare_load",
                                                  "complete_store", "batch", "hello",
                                                  "take_staging", "nope"]),
                           "session": st.none() | st.text(max_size=4),
                           "args": st.dictionaries(st.sampled_from(
                               ["keys", "hits", "blocks", "spec", "calls", "layout", "count"]),
                               _values, max_size=3)}).map(
        lambda m: msgpack.packb(m, use_bin_type=True)),
    st.binary(min_size=1, max_size=40).map(
        lambda b: msgpack.packb({"v": P.VERSION, "id": 1, "op": "lookup", "session": None,
                                 "args": {"keys": msgpack.ExtType(1, b)}}, use_bin_type=True)),
))
def test_fuzzed_frames_get_an_error_and_the_server_stays_up(fuzz_server, frame):
    r = _raw(fuzz_server.address, frame)
    assert set(r) >= {"ok", "boot"}
    assert _raw(fuzz_server.address, P.pack({"v": P.VERSION, "id": 1, "op": "stats",
                                             "args": {}}))["ok"]


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("fuzz")).start()
    yield s
    assert s.stop() == 0


@settings(max_examples=examples(100), deadline=None)
@given(arr=st.sampled_from(["|u1", "<i8", "<f4", "<u4", "|b1"]).flatmap(
    lambda dt: st.lists(st.integers(0, 5), min_size=0, max_size=3).flatmap(
        lambda shape: st.just(np.arange(int(np.prod(shape)) if shape else 1)
                              .astype(dt).reshape(shape)))))
def test_arrays_cross_the_wire_unchanged(arr):
    back = P.unpack(P.pack({"a": arr}))["a"]
    assert back.dtype == arr.dtype and back.shape == arr.shape and np.array_equal(back, arr)


def test_a_closed_client_fails_its_calls_as_misses(server):
    """A call after ``close()`` raises ``ServerUnavailable`` (a miss to the
    engine), not a ZMQError from a closed socket (the whole-stack
    simulation's server seed 4 asked a closed client for gauges)."""
    c = RemoteCache(server.address, LAYOUT, heartbeat=True)
    c.close()
    with pytest.raises(ServerUnavailable, match="closed"):
        c.lookup(chain(1, 2))


def test_the_lookup_bench_measures_every_path_beside_the_transport_floor():
    """``saria bench serve``'s round trips: an empty ZMQ echo and the server's
    ping beside lookups in process and through the server, every figure a
    real time (p50 <= p99), each lookup served every block it asked for."""
    from saria.bench.serve_bench import lookup_rtt

    rows = lookup_rtt(calls=30, sizes=(8, 64), repeats=2)
    got = {(r["keys"], r["path"]) for r in rows}
    assert got == {(0, "empty ZMQ round trip (ipc)"), (0, "saria serve ping (ipc)"),
                   (8, "in-process"), (8, "saria serve (ipc)"), (64, "in-process"),
                   (64, "saria serve (ipc)")}
    assert all(0 < r["p50_us"] <= r["p99_us"] and r["rounds"] == 2 for r in rows)
