"""Every socket saria listens on, in its default configurations, is on
loopback (issue 41: the connector's metrics endpoint bound 0.0.0.0 while
``saria serve``'s bound 127.0.0.1, and every host on the network could read
per-engine hit counts).

The sockets are read from the kernel (psutil: the process's inet sockets
that listen, and any bound UDP socket), not from saria's own settings, so a
listener that some part opens without saying so is found too. The
connector's listeners are checked inside an engine, in
``test_connector_events.py::test_prometheus_endpoint_and_vllm_stats``,
with ``listeners`` from here.
"""

from __future__ import annotations

import os
import socket
import sys

import psutil
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_serve import LAYOUT, Server, chain, store  # noqa: E402

from saria.serve.client import RemoteCache  # noqa: E402

LOOPBACK = ("127.", "::1", "::ffff:127.")


def listeners(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every inet socket of `pid` that accepts traffic."""
    out = []
    for c in psutil.Process(pid).net_connections("inet"):
        if c.status == psutil.CONN_LISTEN or (c.type == socket.SOCK_DGRAM and c.laddr):
            out.append((c.laddr.ip, c.laddr.port))
    return out


def off_loopback(pid: int) -> list[tuple[str, int]]:
    return [(ip, port) for ip, port in listeners(pid) if not ip.startswith(LOOPBACK)]


def test_saria_serve_by_default_listens_on_no_inet_socket(tmp_path):
    """Its clients' socket is ipc:// (a file only its uid opens); a client
    that stores and loads through it opens no listener either."""
    s = Server(tmp_path, "--ssd-dir", str(tmp_path / "ssd"), "--ssd-bytes", str(1 << 24)).start()
    try:
        c = RemoteCache(s.address, LAYOUT, heartbeat=True)
        assert store(c, chain(3, 4)) == 4
        assert listeners(s.proc.pid) == []
        assert off_loopback(os.getpid()) == []
        c.close()
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("host, public", [(None, False), ("0.0.0.0", True)])
def test_saria_serve_metrics_listen_on_loopback_unless_told(tmp_path, host, public):
    """--metrics-port alone binds 127.0.0.1; --metrics-host 0.0.0.0 (told
    otherwise) is seen off loopback by the same check, so it can fail."""
    extra = ("--metrics-host", host) if host else ()
    s = Server(tmp_path, "--metrics-port", "0", *extra).start()
    try:
        got = listeners(s.proc.pid)
        assert len(got) == 1, got  # the metrics endpoint, and nothing else
        assert bool(off_loopback(s.proc.pid)) == public, got
    finally:
        assert s.stop() == 0
