"""``saria serve --remote``: two nodes' servers (``saria serve`` processes)
share a real ``mooncake_master`` (loopback TCP); clients are ``RemoteCache``
objects as an engine's connector uses them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

from saria.index import Tier
from saria.serve.client import RemoteCache, server_stats
from saria.tiers.remote import MooncakeMaster, client_env, mooncake_available
from test_serve import LAYOUT, Server, chain, fill, pool_of, store

_WHY = mooncake_available()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")


@pytest.fixture(scope="module")
def master():
    client_env()  # the servers inherit it: their transfer engines bind to loopback
    with MooncakeMaster() as m:
        yield m


def remote_args(master, segment: str = "32MB") -> list[str]:
    return ["--remote", master.url, "--remote-metadata", master.metadata_server,
            "--remote-host", "127.0.0.1", "--remote-segment", segment,
            "--remote-deadline", "500ms", "--remote-fleet-key", master.key_file()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_node_b_serves_what_node_a_published(master, tmp_path):
    """Engine A on node A stores a prefix and reuses it (published); engine
    B on node B, another server, gets it as DRAM blocks of B's pool, A's
    bytes; B's status and Prometheus endpoint show the cluster tier."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    port = _free_port()
    srv_a = Server(tmp_path / "a", *remote_args(master)).start()
    srv_b = Server(tmp_path / "b", *remote_args(master), "--metrics-port", str(port)).start()
    try:
        a = RemoteCache(srv_a.address, LAYOUT, name="A")
        keys = chain(7, 10)
        assert store(a, keys) == 10
        assert a.lookup(keys).num_blocks == 10
        a.touch(keys, hits=10)  # reused: the publishing policy sends the prefix out
        a.touch(keys, hits=10)
        b = RemoteCache(srv_b.address, LAYOUT, name="B")
        deadline = time.monotonic() + 20
        while b.lookup(keys).num_blocks < 10 and time.monotonic() < deadline:
            time.sleep(0.1)  # the puts run off A's request path
        spec = b.prepare_load(keys, 10)
        assert spec.num_blocks == 10 and (spec.tiers == int(Tier.DRAM)).all()
        assert np.array_equal(np.asarray(pool_of(b)[spec.slots]), fill(keys, np.arange(10)))
        assert b.complete_load(spec) == 10
        snap = server_stats(srv_b.address)
        assert snap["engines"]["B"]["remote_hit_blocks"] == 10
        assert snap["engines"]["B"]["dram_hit_blocks"] == 0
        (g,) = snap["namespaces"].values()
        assert g["remote_hit_blocks"] == 10 and g["remote_get_hits"] == 10
        assert g["remote_breaker_open"] == 0 and g["remote_lookup_p50_s"] > 0
        assert server_stats(srv_a.address)["namespaces"][a.info["namespace"]][
            "remote_published_blocks"] == 10
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert 'figure="remote_hit_blocks"} 10.0' in text
        assert 'saria_serve_cache{gauge="remote_get_hits",namespace=' in text
        r = subprocess.run([sys.executable, "-m", "saria.cli.main", "status", srv_b.address],
                           capture_output=True, text=True, timeout=60,
                           env={**os.environ, "COLUMNS": "250"})  # rich wraps narrow tables
        assert r.returncode == 0 and "cluster hit blocks" in r.stdout
        a.close(), b.close()
    finally:
        assert srv_b.stop() == 0
        assert srv_a.stop() == 0


@pytest.mark.parametrize("argv,message", [
    (["--remote-segment", "1GB"], "--remote-segment: needs --remote mooncake://HOST:PORT"),
    (["--remote", "mooncake://127.0.0.1:1", "--remote-protocol", "udp"],
     "remote.protocol: must be one of"),
    (["--remote", "http://127.0.0.1:1"], "remote.master: 'http://127.0.0.1:1': the scheme must be"),
    (["--remote", "mooncake://127.0.0.1:1", "--remote-segment", "1MB"],
     "remote.segment_bytes: must be 0"),
    (["--remote", "mooncake://127.0.0.1:1", "--remote-deadline", "soon"], "remote.deadline"),
    (["--remote", "mooncake://127.0.0.1:1"], "remote.fleet_key_file: a cluster tier needs the fleet's key"),
    (["--remote", "mooncake://127.0.0.1:1", "--remote-fleet-key", "/nonexistent/k"],
     "remote.fleet_key_file: /nonexistent/k: No such file"),
])
def test_bad_remote_flags_are_one_line_errors(tmp_path, argv, message):
    r = subprocess.run([sys.executable, "-m", "saria.cli.main", "serve", "--listen",
                        f"ipc://{tmp_path}/x.sock", *argv], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2
    assert message in r.stderr.strip().splitlines()[-1], r.stderr
