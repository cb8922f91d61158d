"""``saria serve`` under attack (issue 32): each attack the review ran on
84f5613, on loopback, and the refusal that stops it now.

Another uid is ``nobody`` through ``setpriv`` (skipped with the reason where
this process is not root). Servers are real ``saria serve`` subprocesses.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import msgpack
import numpy as np
import pytest
import zmq

from saria.serve import auth
from saria.serve import protocol as P
from saria.serve.auth import ClientSecurity, UnsafePath
from saria.serve.client import RemoteCache, ServerUnavailable, server_stats

sys.path.insert(0, os.path.dirname(__file__))
from test_serve import LAYOUT, SLOT, Server, chain, fill, pool_of, store  # noqa: E402

ROOT = os.getuid() == 0
as_nobody = pytest.mark.skipif(not ROOT or shutil.which("setpriv") is None,
                               reason="needs root and setpriv to act as another uid (nobody)")
NOBODY = 65534


def nobody(*cmd: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                           *cmd], capture_output=True, text=True, timeout=60, **kw)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_proc(tmp, *args: str) -> subprocess.Popen:
    log = open(os.path.join(tmp, "serve.log"), "a")
    return subprocess.Popen([sys.executable, "-m", "saria.cli.main", "serve", "--dram",
                             str(64 * SLOT), "--lease", "2", *args], stdout=log, stderr=log)


def wait_listening(proc: subprocess.Popen, tmp) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, open(os.path.join(tmp, "serve.log")).read()[-2000:]
        if "listening on" in open(os.path.join(tmp, "serve.log")).read():
            return
        time.sleep(0.05)
    raise AssertionError("saria serve did not start")


def stop(proc: subprocess.Popen) -> int:
    proc.terminate()
    return proc.wait(timeout=30)


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))


def raw_call(address: str, frame: bytes, timeout_s: float = 10.0) -> dict | None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(address)
    try:
        sock.send(frame)
        return P.unpack(sock.recv()) if sock.poll(int(timeout_s * 1000)) else None
    finally:
        sock.close(0)
        ctx.term()


# ------------------------------------------------- bounded parsing, a loop that lives


def test_a_malformed_hello_with_events_on_does_not_kill_the_server(tmp_path):
    """84f5613: the layout registered its namespace, then failed on
    ``int("x")``; the next publish raised out of the loop and the server
    exited. Now the layout is checked before anything is registered."""
    port = free_port()
    s = Server(tmp_path, "--events", f"tcp://127.0.0.1:{port}").start()
    try:
        with pytest.raises(P.RemoteError, match="block_size"):
            RemoteCache(s.address, dict(LAYOUT, block_size="x"), heartbeat=False)
        time.sleep(0.5)  # several loop turns, each publishing
        assert s.proc.poll() is None
        c = RemoteCache(s.address, LAYOUT, heartbeat=False)  # the namespace opens cleanly now
        keys = chain(1, 4)
        assert store(c, keys) == 4 and c.lookup(keys).num_blocks == 4
        c.close()
    finally:
        assert s.stop() == 0


def test_a_16mb_frame_of_empty_arrays_is_refused_with_bounded_memory(tmp_path):
    """84f5613: 2.6 GB RSS and a 16 s stall. Now libzmq drops a frame over
    --max-frame (8 MB) as it arrives, and a frame under it that would build
    millions of objects is refused while decoding, one line."""
    s = Server(tmp_path).start()
    try:
        before = rss_kb(s.proc.pid)
        n = 16 << 20
        big = b"\xdd" + n.to_bytes(4, "big") + b"\x90" * n  # array32 of 16 M empty arrays
        assert raw_call(s.address, big, timeout_s=2) is None  # dropped: no reply, no decode
        n = 7 << 20  # under the frame limit: 112 arrays of 65535 empty arrays
        inner = b"\xdc" + (65535).to_bytes(2, "big") + b"\x90" * 65535
        frame = b"\x83\xa1v\x01\xa2id\x07\xa2op" + b"\xdc" + (n // len(inner)).to_bytes(2, "big") \
            + inner * (n // len(inner))
        r = raw_call(s.address, frame)
        assert r is not None and r["ok"] is False and r["code"] == "protocol"
        assert "arrays and maps" in r["error"]
        assert server_stats(s.address)["sessions"] == 0  # still answering
        assert rss_kb(s.proc.pid) - before < 200_000  # (84f5613: +2.5 GB)
    finally:
        assert s.stop() == 0


def test_a_request_that_decodes_is_decoded_once_and_keeps_its_id(tmp_path):
    s = Server(tmp_path).start()
    try:
        r = raw_call(s.address, msgpack.packb({"v": P.VERSION, "id": 9, "op": 3}))
        assert r["id"] == 9 and r["code"] == "protocol" and "'op'" in r["error"]
    finally:
        assert s.stop() == 0


# ------------------------------------------------------------- IPC identity


@pytest.fixture
def sticky_tmp():
    """A /tmp-like folder (1777) another uid can create entries in."""
    d = tempfile.mkdtemp(prefix="saria-sec-", dir="/tmp")
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@as_nobody
def test_a_squatted_socket_folder_is_refused_by_server_and_client(sticky_tmp):
    """84f5613: with XDG_RUNTIME_DIR unset the server adopted
    /tmp/saria-UID made by another user, who could swap the socket; root's
    engine then reached the attacker. Now both sides refuse the folder."""
    squat = os.path.join(sticky_tmp, f"saria-{os.getuid()}")
    assert nobody("mkdir", "-m", "777", squat).returncode == 0
    address = f"ipc://{squat}/serve.sock"
    out = subprocess.run([sys.executable, "-m", "saria.cli.main", "serve", "--dram", "1MB",
                          "--listen", address], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "belongs to uid 65534" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    # the attacker's own server in its folder: the client does not connect
    with pytest.raises(UnsafePath, match="belongs to uid 65534"):
        RemoteCache(address, LAYOUT, heartbeat=False, timeout_s=0.5)
    # a folder of ours inside a folder the attacker owns is refused too (it can be renamed)
    assert nobody("mkdir", "-p", "-m", "777", f"{squat}/x").returncode == 0
    with pytest.raises(UnsafePath):
        auth.secure_dir(f"{squat}/x/mine")


def test_the_default_runtime_folder_is_made_owner_only(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    from saria.serve.paths import default_runtime_dir

    auth.secure_dir(default_runtime_dir())
    for d in (tmp_path / "run", tmp_path / "run" / "saria"):
        assert os.stat(d).st_mode & 0o777 == 0o700
    os.chmod(tmp_path / "run" / "saria", 0o750)  # group bits: refused, with the fix named
    with pytest.raises(UnsafePath, match="chmod 700"):
        auth.secure_dir(default_runtime_dir())


@as_nobody
def test_an_ipc_peer_of_another_uid_is_refused_unless_allowed(sticky_tmp):
    """SO_PEERCRED: even with the socket open to everyone, a peer of
    another uid gets no session; ``--allow-uid`` lets it in."""
    from pathlib import Path

    tmp_path = Path(sticky_tmp)
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_serve import LAYOUT
        from saria.serve.client import RemoteCache, server_stats
        from saria.serve.auth import ClientSecurity
        try:
            c = RemoteCache(sys.argv[1], LAYOUT, heartbeat=False, timeout_s=1.0,
                            security=ClientSecurity(server_uid=0))
            print("SESSION", c.session)
        except Exception as e:
            print("REFUSED", type(e).__name__)
    """)
    for allow, expect in (((), "REFUSED ServerUnavailable"), (("--allow-uid", str(NOBODY)),
                                                                "SESSION")):
        d = tmp_path / ("allowed" if allow else "closed")
        d.mkdir(mode=0o755)
        s = Server(d, *allow).start()
        try:
            os.chmod(d / "serve.sock", 0o666)
            out = nobody(sys.executable, "-c", script, s.address)
            assert expect in out.stdout, out.stdout + out.stderr
        finally:
            assert s.stop() == 0


# ---------------------------------------------------------- what a hello names


class FakeServer:
    """An ipc server (ours) that answers hello with whatever the test says."""

    def __init__(self, tmp, reply: dict) -> None:
        self.address = f"ipc://{tmp}/fake.sock"
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(self.address)
        self.reply = reply
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while True:
            try:
                ident, frame = self.sock.recv_multipart()
            except zmq.ZMQError:  # ETERM: the socket is this thread's to close
                self.sock.close(0)
                return
            rid = P.unpack(frame)["id"]
            self.sock.send_multipart([ident, P.pack({"id": rid, "ok": True, "boot": "b",
                                                     "result": self.reply})])

    def close(self) -> None:
        self.ctx.term()  # wakes the thread, which closes its socket
        self._t.join()


def _hello_reply(pool: str, ssd_dirs=()) -> dict:
    return {"session": "s", "boot": "b", "namespace": "n", "lease_s": 10.0, "pool": pool,
            "pool_slots": 1, "slot_bytes": SLOT, "staging_slots": 0, "ssd_dirs": list(ssd_dirs)}


@as_nobody
def test_a_pool_of_another_user_is_not_mapped(tmp_path):
    """84f5613: the worker mapped whatever pool the server named -- an
    attacker's file: read every KV page written into it, serve any KV."""
    evil = f"/dev/shm/saria-serve-{os.getuid()}-1-evil-{os.getpid()}"
    assert nobody("sh", "-c", f"umask 077; head -c {SLOT} /dev/zero > {evil}").returncode == 0
    mine = f"/dev/shm/saria-serve-{os.getuid()}-1-mine-{os.getpid()}"
    with open(mine, "wb") as f:
        f.write(b"\0" * SLOT)
    os.chmod(mine, 0o644)
    try:
        for pool, why in ((evil, "uid 65534"), (mine, "mode 0644"),
                          ("/tmp/saria-serve-0-x", "refusing to map")):
            fake = FakeServer(tmp_path, _hello_reply(pool))
            try:
                with pytest.raises(UnsafePath, match=why):
                    RemoteCache(fake.address, LAYOUT, heartbeat=False)
            finally:
                fake.close()
        os.chmod(mine, 0o600)  # the server's own pool passes
        fake = FakeServer(tmp_path, _hello_reply(mine, [str(tmp_path / "ssd" / "saria-n")]))
        try:
            c = RemoteCache(fake.address, LAYOUT, heartbeat=False)
            assert c.info["pool"] == mine
            c.close()
            with pytest.raises(UnsafePath, match="not under a configured root"):
                RemoteCache(fake.address, LAYOUT, heartbeat=False,
                            security=ClientSecurity(ssd_roots=("/mnt/nvme0/kv",)))
        finally:
            fake.close()
    finally:
        for p in (evil, mine):
            os.unlink(p)


# ------------------------------------------------------------------ TCP and CURVE


def test_tcp_without_keys_refuses_to_start_and_insecure_warns(tmp_path):
    port = free_port()
    out = subprocess.run([sys.executable, "-m", "saria.cli.main", "serve", "--dram", "1MB",
                          "--listen", f"tcp://127.0.0.1:{port}"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0 and "--curve-secret" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    proc = serve_proc(tmp_path, "--listen", f"tcp://127.0.0.1:{port}", "--insecure-tcp")
    try:
        wait_listening(proc, tmp_path)
        assert "INSECURE" in open(tmp_path / "serve.log").read()
    finally:
        assert stop(proc) == 0


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    out = subprocess.run([sys.executable, "-m", "saria.cli.main", "serve", "keygen", "--out",
                          str(d / "all"), "--name", "server", "--name", "alice", "--name", "bob",
                          "--name", "carol", "--name", "mallory"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    allowed = d / "clients"
    allowed.mkdir()
    for name in ("alice", "bob", "carol", "server"):
        shutil.copy(d / "all" / f"{name}.key", allowed)
    tenants = d / "tenants.json"
    tenants.write_text(json.dumps({"tenants": {"alice": ["key:alice"], "bob": ["key:bob"],
                                               "carol": ["key:carol"]},
                                   "groups": {"team": ["alice", "carol"]},
                                   "node": ["key:server"]}))  # the operator: the node's tenant
    return d


def _as(keys, name: str) -> ClientSecurity:
    return ClientSecurity(str(keys / "all" / f"{name}.key_secret"),
                          str(keys / "all" / "server.key"))


@pytest.fixture(scope="module")
def curve_server(keys, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("curve")
    port = free_port()
    proc = serve_proc(tmp, "--listen", f"tcp://127.0.0.1:{port}", "--curve-secret",
                      str(keys / "all" / "server.key_secret"), "--curve-clients",
                      str(keys / "clients"), "--tenants", str(keys / "tenants.json"))
    wait_listening(proc, tmp)
    yield f"tcp://127.0.0.1:{port}"
    assert stop(proc) == 0


def test_keygen_writes_owner_only_secrets(keys):
    assert os.stat(keys / "all" / "alice.key_secret").st_mode & 0o777 == 0o600
    pub, sec = auth.load_secret(str(keys / "all" / "alice.key_secret"))
    assert auth.load_public(str(keys / "all" / "alice.key")) == pub and len(sec) == 40


def test_curve_lets_listed_clients_in_and_no_one_else(curve_server, keys):
    c = RemoteCache(curve_server, LAYOUT, heartbeat=False, security=_as(keys, "alice"))
    assert c.session
    c.close()
    for sec in (_as(keys, "mallory"), ClientSecurity()):  # unlisted key; no key at all
        with pytest.raises(ServerUnavailable):
            RemoteCache(curve_server, LAYOUT, heartbeat=False, timeout_s=1.0, security=sec)


def test_poisoning_by_store_over_tcp_without_credentials_is_refused(curve_server, keys):
    """84f5613: any client reaching tcp:// could prepare_store +
    complete_store(success) blocks without writing them; a victim loaded
    bytes no engine computed. Now the handshake fails: no frame is read."""
    keys_ = chain(40, 6)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(curve_server)
    sock.send(P.pack({"v": P.VERSION, "id": 1, "op": "hello", "session": None,
                      "args": {"layout": LAYOUT}}))
    assert not sock.poll(1500)  # no session: the attack ends here
    sock.close(0)
    ctx.term()
    victim = RemoteCache(curve_server, LAYOUT, heartbeat=False, security=_as(keys, "alice"))
    assert victim.lookup(keys_).num_blocks == 0
    victim.close()


# ------------------------------------------------------------------------ tenants


def test_tenants_cannot_see_each_other_but_a_group_shares(curve_server, keys):
    """Bob's lookups of Alice's prompt find nothing (no oracle), his store of
    the same keys does not touch her blocks; Carol, in Alice's group, hits."""
    alice, bob, carol = (RemoteCache(curve_server, LAYOUT, name=n, heartbeat=False,
                                     security=_as(keys, n)) for n in ("alice", "bob", "carol"))
    k = chain(41, 6)
    assert store(alice, k) == 6
    assert bob.lookup(k).num_blocks == 0
    spec = bob.prepare_store(k, 0)
    pool = pool_of(bob)
    pool[spec.slots] = 0x66  # bob's own bytes for the "same" prompt
    pool.flush()
    assert bob.complete_store(spec) == 6
    assert carol.lookup(k).num_blocks == 6
    load = carol.prepare_load(k, 6)
    assert np.array_equal(np.asarray(pool_of(carol)[load.slots]), fill(k, np.arange(6)))
    assert carol.complete_load(load) == 6
    snap = bob.stats()
    assert set(snap["engines"]) <= {"bob/bob"} and snap["namespaces"] == {}
    assert snap["sessions"] == 1
    for c in (alice, bob, carol):
        c.close()


def test_stats_without_a_session_is_the_nodes_own_tenants(curve_server, keys):
    with pytest.raises(P.RemoteError, match="needs a session"):
        server_stats(curve_server, security=_as(keys, "bob"))
    out = subprocess.run([sys.executable, "-m", "saria.cli.main", "status", curve_server,
                          "--json", "--curve-secret", str(keys / "all" / "server.key_secret"),
                          "--curve-key", str(keys / "all" / "server.key")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "namespaces" in json.loads(out.stdout)  # the operator sees the node


# ------------------------------------------------------------------------- quotas


@pytest.fixture
def quota_server(tmp_path):
    s = Server(tmp_path, "--max-sessions-per-peer", "3", "--max-sessions", "5",
               "--max-hello-rate", "4", "--max-lock-age", "1", "--max-specs", "2",
               "--lease", "30").start()
    yield s
    assert s.stop() == 0


def test_sessions_per_peer_and_hello_rate_are_limited(quota_server):
    cs = [RemoteCache(quota_server.address, LAYOUT, heartbeat=False) for _ in range(3)]
    with pytest.raises(P.RemoteError, match="max-sessions-per-peer|max-hello-rate"):
        RemoteCache(quota_server.address, LAYOUT, heartbeat=False)
    for c in cs:
        c.close()
    time.sleep(1.1)  # the hello window passes: 4 hellos a second, a 5th is refused
    for _ in range(4):
        RemoteCache(quota_server.address, LAYOUT, heartbeat=False).close()
    with pytest.raises(P.RemoteError, match="max-hello-rate"):
        RemoteCache(quota_server.address, LAYOUT, heartbeat=False)


def test_a_lock_does_not_outlive_its_maximum_age_and_specs_are_capped(quota_server):
    """84f5613: a session held its locks as long as pings renewed its lease
    (a victim's store got 0 DRAM slots). Now a spec ends after
    --max-lock-age whatever the heartbeat, and --max-specs caps how many."""
    hog = RemoteCache(quota_server.address, LAYOUT, timeout_s=2.0)  # heartbeat on
    held = hog.prepare_store(chain(50, 32), 0)
    hog.prepare_store(chain(51, 32), 0)
    assert len(held.slots) == 32
    with pytest.raises(P.RemoteError, match="max-specs"):
        hog.prepare_store(chain(52, 4), 0)
    victim = RemoteCache(quota_server.address, LAYOUT, heartbeat=False)
    time.sleep(2.5)  # past the age; the hog's heartbeat kept its session
    with pytest.raises(P.RemoteError, match="no such spec"):
        hog.complete_store(held)
    assert store(victim, chain(53, 40)) == 40  # the aged locks' slots came back
    assert victim.stats()["specs_aged"] == 2
    hog.close(), victim.close()


def test_staging_is_shared_out(tmp_path):
    """84f5613: ``take_staging(10**9)`` took every staging slot."""
    s = Server(tmp_path, "--ssd-dir", str(tmp_path / "ssd"), "--ssd-bytes", str(512 * SLOT),
               "--admission", "full-duplicate").start()
    try:
        a = RemoteCache(s.address, LAYOUT, heartbeat=False)
        b = RemoteCache(s.address, LAYOUT, heartbeat=False)
        total = a.staging_slots
        got = a.take_staging(10**9)
        assert got.size == total // 2
        with pytest.raises(P.RemoteError, match="max-staging-share"):
            a.take_staging(1)
        # a second session of the same process shares its process's share...
        with pytest.raises(P.RemoteError, match="client process holds .*max-staging-share"):
            b.take_staging(1)
        # ...and another process gets the rest
        assert _take_staging_elsewhere(s.address) == total - total // 2
        a.close(), b.close()
    finally:
        assert s.stop() == 0


def _take_staging_elsewhere(address: str) -> int:
    """How many staging slots a client in another process gets."""
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_serve import LAYOUT
        from saria.serve.client import RemoteCache
        c = RemoteCache({address!r}, LAYOUT, heartbeat=False)
        print("GOT", c.take_staging(10**9).size, flush=True)
        c.close()""")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.split("GOT")[1])


# ------------------------------------------- one greedy client locks nobody out


def greedy(address: str, stop_file, seconds: float = 3.0, conns: int = 1,
           *curve: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__),
                                                          "greedy_child.py"),
                             address, json.dumps(LAYOUT), str(seconds), str(conns),
                             str(stop_file), *curve], stdout=subprocess.PIPE, text=True)


def greedy_result(proc: subprocess.Popen) -> dict:
    line = proc.stdout.readline()
    assert line.startswith("GREEDY "), line
    return json.loads(line[len("GREEDY "):])


def sessions_of(snapshot: dict, prefix: str) -> list[int]:
    return [n for e, n in snapshot["sessions_by_engine"].items() if e.startswith(prefix)]


def test_one_greedy_client_cannot_lock_the_next_engine_out(tmp_path):
    """Issue 41: one client of the node's own uid said hello 20,000 times,
    held 50 sessions (the cap) and the next engine's hello was refused.
    Now five greedy processes of this uid, hammering hellos and pinging what
    they got, hold at most --max-sessions-per-process each, fill the
    per-peer cap between them -- and an engine of the same uid still gets
    its hello (an idle session of the biggest holder is ended for it), stores,
    and a second engine gets its hits, byte for byte."""
    s = Server(tmp_path, "--max-sessions-per-peer", "32", "--max-sessions-per-process", "8",
               "--lease", "30").start()
    stop_file = tmp_path / "stop-greedy"
    hogs = [greedy(s.address, stop_file) for _ in range(5)]
    try:
        got = [greedy_result(h) for h in hogs]
        for g in got:
            assert set(g["refused"]) <= {"quota"}, g  # refused by a cap, never broken
        assert sum(g["hellos"] for g in got) > 1000
        before = server_stats(s.address)
        assert before["sessions"] == 32  # the per-peer cap, full of greedy sessions
        # each at most its process's cap, however many hellos it sent
        assert max(sessions_of(before, "greedy-")) <= 8
        time.sleep(2.5)  # the greedy sessions have done nothing but ping: idle
        writer = RemoteCache(s.address, LAYOUT, heartbeat=False)
        keys = chain(7, 12)
        assert store(writer, keys) == 12
        reader = RemoteCache(s.address, LAYOUT, heartbeat=False)  # the second engine
        assert reader.lookup(keys).num_blocks == 12
        load = reader.prepare_load(keys, 12)
        assert np.array_equal(np.asarray(pool_of(reader)[load.slots]),
                              fill(keys, np.arange(12)))
        assert reader.complete_load(load) == 12
        after = server_stats(s.address)
        # one idle greedy session ended for each engine's hello, nothing else
        assert after["sessions_reaped"] - before["sessions_reaped"] == 2
        assert after["sessions"] == 32
        assert max(sessions_of(after, "greedy-")) <= 8
        # the hogs, hammering on, took nothing back from the engines
        assert reader.lookup(keys).num_blocks == 12 and writer.lookup(keys).num_blocks == 12
        writer.close(), reader.close()
    finally:
        stop_file.touch()
        for h in hogs:
            h.wait(timeout=30)
        assert s.stop() == 0


def test_a_session_at_work_is_never_ended_for_a_hello(tmp_path):
    """The room a hello makes is an idle session of a bigger holder, never
    one at work: with the global cap full of sessions that just worked, the
    next hello is refused, naming the flag."""
    s = Server(tmp_path, "--max-sessions", "3", "--lease", "30").start()
    try:
        busy = [RemoteCache(s.address, LAYOUT, heartbeat=False) for _ in range(3)]
        sids = [c.session for c in busy]
        time.sleep(2.5)
        for c in busy:
            c.lookup(chain(1, 2))  # at work again
        code = textwrap.dedent(f"""
            import sys; sys.path.insert(0, {os.path.dirname(__file__)!r})
            from test_serve import LAYOUT
            from saria.serve import protocol as P
            from saria.serve.client import RemoteCache
            try:
                RemoteCache({s.address!r}, LAYOUT, heartbeat=False)
            except P.RemoteError as e:
                print("REFUSED", e, flush=True)""")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=60)
        assert "REFUSED" in out.stdout and "--max-sessions" in out.stdout, out.stdout + out.stderr
        assert server_stats(s.address)["sessions_reaped"] == 0
        for c in busy:
            c.lookup(chain(1, 2))
        assert [c.session for c in busy] == sids  # every session still its own, no hello again
        for c in busy:
            c.close()
    finally:
        assert s.stop() == 0


def test_layouts_out_of_bounds_open_no_namespace(quota_server):
    """84f5613: ``slot_bytes=16`` built 8.4 M slots, and a junk layout took
    the only namespace of --max-models 1."""
    for bad, why in ((dict(LAYOUT, slot_bytes=16, page_bytes=16), "min-slot"),
                     (dict(LAYOUT, model=""), "model"), (dict(LAYOUT, num_layers=True),
                                                          "num_layers")):
        with pytest.raises(P.RemoteError, match=why):
            RemoteCache(quota_server.address, bad, heartbeat=False)
    c = RemoteCache(quota_server.address, LAYOUT, heartbeat=False)  # the namespace is still free
    c.close()


def test_an_idle_namespace_closes_and_frees_its_place(tmp_path):
    """84f5613: a junk layout took the only namespace of --max-models 1 and
    namespaces never closed. Now one that no session uses closes after
    --namespace-idle (flushed, its pool removed) and another layout opens."""
    s = Server(tmp_path, "--namespace-idle", "1").start()
    try:
        junk = RemoteCache(s.address, dict(LAYOUT, model="junk"), heartbeat=False)
        pool = junk.info["pool"]
        with pytest.raises(P.RemoteError, match="max-models"):
            RemoteCache(s.address, LAYOUT, heartbeat=False)
        junk.close()
        deadline = time.monotonic() + 30
        while os.path.exists(pool):
            assert time.monotonic() < deadline, "the idle namespace did not close"
            time.sleep(0.1)
        c = RemoteCache(s.address, LAYOUT, heartbeat=False)
        assert store(c, chain(60, 3)) == 3
        assert c.stats()["namespaces_closed"] == 1
        c.close()
    finally:
        assert s.stop() == 0
