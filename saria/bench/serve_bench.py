"""``saria bench serve``: what a node's shared cache costs over the wire.

1. **Lookup round trip**: ``lookup`` of 8 / 64 / 128 / 1024 block keys
   through ``RemoteCache`` to a ``saria serve`` process (ipc), against the
   same call on an in-process ``TieredCache`` holding the same blocks; p50
   and p99 of ``--calls`` calls each. Beside them, the floor any call pays:
   an empty ZMQ round trip (DEALER to a ROUTER echo in another process, on
   the same kind of ipc socket) and the server's ``ping`` (the protocol,
   the session and the server's loop, no cache work). With ``--curve``, also to a ``tcp://`` server with
   CurveZMQ (a listed client key) and to one with ``--insecure-tcp``, in the
   same run: what authentication and encryption cost per call, for a peer of
   the node's own tenant and for a tenant of its own (whose keys the server
   maps into its key space).
   ``--repeats`` rounds, interleaved; each figure is the median of the rounds.
2. **Load test**: ``--clients`` processes, each a ``RemoteCache`` in a loop of
   lookup -> prepare/complete load or prepare/complete store (a store fills
   its slots in the shared pool) over its own and the others' prefixes, for
   ``--seconds``; reports calls per second and the server's RSS and open
   sessions sampled every second, so a leak shows as a slope.

Both start their own server in a temporary directory and stop it at the end.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import psutil

from saria.keys import BlockHasher, keys_to_array

SLOT = 64 << 10
LAYOUT = dict(model="bench", dtype="bfloat16", block_size=16, page_bytes=SLOT, num_layers=1,
              tp_size=1, kv_layout="default", hash_algo="sha256_cbor", hash_seed="bench",
              slot_bytes=SLOT)


def chain(seed: int, n: int) -> np.ndarray:
    return keys_to_array(BlockHasher(16, seed="bench").block_keys(
        [seed * 1_000_000 + i for i in range(16 * n)]))


def start_server(tmp: str, dram: int, listen: str | None = None, *args: str,
                 security=None) -> tuple[subprocess.Popen, str]:
    from saria.serve.client import ServerUnavailable, server_stats
    from saria.serve.protocol import RemoteError

    address = listen or f"ipc://{tmp}/serve.sock"
    log = open(os.path.join(tmp, "serve.log"), "w")
    proc = subprocess.Popen([sys.executable, "-m", "saria.cli.main", "serve", "--dram", str(dram),
                             "--listen", address, "--lease", "5", *args], stdout=log, stderr=log)
    for _ in range(300):
        try:
            server_stats(address, 0.2, security)
            return proc, address
        except RemoteError:  # it answered (a tenant's stats need a session)
            return proc, address
        except ServerUnavailable:
            if proc.poll() is not None:
                raise RuntimeError("saria serve exited at start; see " + log.name)
    raise RuntimeError("saria serve did not answer")


def _pct(xs: list[float]) -> tuple[float, float]:
    a = np.asarray(xs) * 1e6
    return float(np.percentile(a, 50)), float(np.percentile(a, 99))


def _echo(address: str, ready) -> None:
    """A ROUTER that sends every message straight back (the bare transport)."""
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(address)
    ready.set()
    while True:
        frames = sock.recv_multipart()
        if frames[-1] == b"stop":
            break
        sock.send_multipart(frames)
    sock.close(0)
    ctx.term()


def _floor(tmp: str, calls: int, repeats: int, client) -> list[dict]:
    """p50/p99 of an empty ZMQ round trip and of the server's ``ping``,
    ``repeats`` rounds interleaved."""
    import zmq

    address = f"ipc://{tmp}/echo.sock"
    mpc = mp.get_context("spawn")
    ready = mpc.Event()
    proc = mpc.Process(target=_echo, args=(address, ready), daemon=True)
    proc.start()
    ready.wait(30)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(address)
    msg = b"\x80"  # an empty msgpack map: a frame, nothing in it

    def echo():
        sock.send(msg)
        sock.recv()

    rounds: dict[tuple[int, str], list[tuple[float, float]]] = {}
    try:
        for _ in range(repeats):
            for name, fn in (("empty ZMQ round trip (ipc)", echo),
                             ("saria serve ping (ipc)", client.ping)):
                rounds.setdefault((0, name), []).append(_timed(fn, calls))
        sock.send(b"stop")
    finally:
        sock.close(0)
        ctx.term()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
    return _medians(rounds)


def _timed(fn, calls: int) -> tuple[float, float]:
    """p50 and p99 (us) of `calls` calls of `fn`."""
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return _pct(ts)


def _medians(rounds: dict[tuple[int, str], list[tuple[float, float]]]) -> list[dict]:
    """One row per (keys, path): the medians over its rounds' p50 and p99."""
    return [{"keys": n, "path": name, "p50_us": float(np.median([r[0] for r in rs])),
             "p99_us": float(np.median([r[1] for r in rs])), "rounds": len(rs)}
            for (n, name), rs in rounds.items()]


def lookup_rtt(calls: int = 2000, sizes=(8, 64, 128, 1024), *, curve: bool = False,
               repeats: int = 1) -> list[dict]:
    from saria.runtime.cache import CacheConfig, TieredCache
    from saria.serve.client import RemoteCache

    with tempfile.TemporaryDirectory() as tmp:
        procs, paths = [], [("in-process", TieredCache(CacheConfig(
            block_bytes=SLOT, dram_bytes=2200 * SLOT, pin=False)))]
        try:
            proc, address = start_server(tmp, 2200 * SLOT)
            procs.append(proc)
            paths.append(("saria serve (ipc)", RemoteCache(address, LAYOUT, name="bench",
                                                           heartbeat=False)))
            floor = _floor(tmp, calls, repeats, paths[-1][1])
            if curve:
                for name, client in _tcp_servers(tmp, procs):
                    paths.append((name, client))
            times: dict[tuple[int, str], list[tuple[float, float]]] = {}
            for n in sizes:
                keys = chain(n, n)
                for _, cache in paths:  # the same blocks in each, in DRAM
                    cache.complete_store(cache.prepare_store(keys, 0))
                for _ in range(repeats):  # rounds interleaved: A B C, A B C, ...
                    for name, cache in paths:
                        timed = _timed(lambda c=cache: c.lookup(keys), calls)
                        assert cache.lookup(keys).num_blocks == n
                        times.setdefault((n, name), []).append(timed)
            for _, cache in paths:
                cache.close()
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)
    return floor + _medians(times)


def _tcp_servers(tmp: str, procs: list):
    """Clients of a tcp:// server with CURVE -- one of the node's own tenant
    (keys unchanged) and one a tenant of its own (keys mapped to its space)
    -- and of a server with --insecure-tcp."""
    import json
    import socket

    from saria.serve.auth import ClientSecurity, write_keypair
    from saria.serve.client import RemoteCache

    keys, clients = os.path.join(tmp, "keys"), os.path.join(tmp, "clients")
    write_keypair(keys, "server")
    for name in ("node", "tenant"):
        write_keypair(clients, name)
    tenants = os.path.join(tmp, "tenants.json")
    with open(tenants, "w") as f:
        json.dump({"node": ["key:node"]}, f)

    def sec(name: str) -> ClientSecurity:
        return ClientSecurity(os.path.join(clients, f"{name}.key_secret"),
                              os.path.join(keys, "server.key"))

    for label, args, users in (
            ("tcp + CURVE", ("--curve-secret", os.path.join(keys, "server.key_secret"),
                             "--curve-clients", clients, "--tenants", tenants),
             (("node's tenant", sec("node")), ("a tenant, keys mapped", sec("tenant")))),
            ("tcp, insecure", ("--insecure-tcp",), (("", None),))):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        d = tempfile.mkdtemp(dir=tmp)
        proc, address = start_server(d, 2200 * SLOT, f"tcp://127.0.0.1:{port}", *args,
                                     security=users[0][1])
        procs.append(proc)
        for who, security in users:
            name = f"saria serve ({label}{', ' + who if who else ''})"
            yield name, RemoteCache(address, LAYOUT, name="bench", heartbeat=False,
                                    security=security)


def _client(address: str, idx: int, clients: int, seconds: float, out) -> None:
    from saria.serve.client import RemoteCache

    c = RemoteCache(address, LAYOUT, name=f"load{idx}")
    pool = np.memmap(c.info["pool"], np.uint8, "r+",
                     shape=(c.info["pool_slots"], c.info["slot_bytes"]))
    rng = np.random.default_rng(idx)
    prefixes = [chain(1000 * i + j, 32) for i in range(clients) for j in range(8)]
    calls = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        keys = prefixes[rng.integers(len(prefixes))][: rng.integers(4, 33)]
        n = c.lookup(keys).num_blocks
        calls += 1
        if n:
            spec = c.prepare_load(keys, n)
            c.complete_load(spec)
            calls += 2
        else:
            spec = c.prepare_store(keys, 0)
            pool[spec.slots, :8] = 1  # the worker's copy, in short
            c.complete_store(spec)
            calls += 2
    c.close()
    out.put(calls)


def load_test(clients: int = 4, seconds: float = 600.0, progress=None) -> dict:
    from saria.serve.client import server_stats

    with tempfile.TemporaryDirectory() as tmp:
        proc, address = start_server(tmp, 256 * SLOT)  # smaller than the prefixes: evictions
        try:
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            procs = [ctx.Process(target=_client, args=(address, i, clients, seconds, q))
                     for i in range(clients)]
            for p in procs:
                p.start()
            srv = psutil.Process(proc.pid)
            samples = []
            t0 = time.monotonic()
            while any(p.is_alive() for p in procs):
                time.sleep(1.0)
                snap = server_stats(address, 5.0)
                samples.append((time.monotonic() - t0, srv.memory_info().rss, snap["sessions"]))
                if progress:
                    progress(min(time.monotonic() - t0, seconds), seconds)
            total = sum(q.get(timeout=10) for _ in procs)
            for p in procs:
                p.join()
            time.sleep(0.5)
            final = server_stats(address, 5.0)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
    rss = [s[1] for s in samples]
    half = len(rss) // 2
    return {"clients": clients, "seconds": seconds, "calls": total,
            "calls_per_s": total / seconds,
            "rss_first_half_mib": float(np.median(rss[:max(half, 1)])) / 2**20,
            "rss_second_half_mib": float(np.median(rss[half:])) / 2**20,
            "rss_end_mib": rss[-1] / 2**20 if rss else 0.0,
            "sessions_during": max((s[2] for s in samples), default=0),
            "sessions_end": final["sessions"], "leases_expired": final["leases_expired"],
            "rpc_errors": final["rpc_errors"]}
