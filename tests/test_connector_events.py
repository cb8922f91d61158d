"""SariaConnector's KV events, metrics and plugin registration, on the real engine."""

from __future__ import annotations

import os
import re
import socket
import time
import urllib.request

import pytest

from test_listeners import listeners, off_loopback
from vllm_harness import BS, SLOT, engine, generate, model_dir, prompts, scheduler_connector



@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return model_dir(tmp_path_factory)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_events_published_in_vllms_format_with_the_engines_hashes(model, tmp_path):
    """vLLM's ZMQ publisher carries saria's BlockStored/BlockRemoved, decoded
    with vLLM's own classes; with the engine hashing sha256_cbor under the
    default seed, saria's CPU blocks carry the engine's own GPU block hashes."""
    import msgspec
    import zmq
    from vllm.config import KVEventsConfig
    from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch

    port = _free_port()
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    ev_cfg = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq",
                            endpoint=f"tcp://*:{port}")
    extra = {"dram_bytes": 12 * SLOT, "ssd_dirs": [str(tmp_path / "ssd")],
             "ssd_bytes": 64 * SLOT, "admission": "full-duplicate"}
    a, _ = prompts(0)
    c, _ = prompts(1)
    e, _ = prompts(2)
    dec = msgspec.msgpack.Decoder(type=KVEventBatch)
    events = []
    with engine(model, extra, kv_events_config=ev_cfg, enable_prefix_caching=True,
                prefix_caching_hash_algo="sha256_cbor") as llm:
        # the engine hashes sha256_cbor under saria's seed: its hashes are the keys
        assert scheduler_connector(llm)._scheduler.engine_hashes
        time.sleep(0.5)  # let the subscription reach the publisher
        for p in (a, c, e):
            generate(llm, p)
        scheduler_connector(llm)._scheduler.cache.flush()
        generate(llm, a[:40])  # one more step drains the SSD writes' events
        deadline = time.time() + 10
        while time.time() < deadline:
            if sub.poll(200):
                _, _, payload = sub.recv_multipart()
                events.extend(dec.decode(payload).events)
            elif any(getattr(x, "medium", None) == "STORAGE" for x in events):
                break
    sub.close(0)
    stored = [x for x in events if isinstance(x, BlockStored)]
    by_medium = {}
    for x in stored:
        by_medium.setdefault(x.medium, []).append(x)
    gpu = {h for x in by_medium.get("GPU", []) for h in x.block_hashes}
    cpu = [x for x in by_medium.get("CPU", [])]
    assert cpu, f"no CPU BlockStored among {len(events)} events"
    cpu_hashes = {h for x in cpu for h in x.block_hashes}
    assert len(cpu_hashes) == 27                    # 9 full blocks of each of 3 prompts
    assert cpu_hashes <= gpu                        # the engine's own hashes
    first = next(x for x in cpu if x.parent_block_hash is None)
    assert first.token_ids[:BS] in (a[:BS], c[:BS], e[:BS]) and first.block_size == BS
    ssd = {h for x in by_medium.get("STORAGE", []) for h in x.block_hashes}
    assert ssd and ssd <= cpu_hashes                # full-duplicate: DRAM blocks reach the SSD
    removed = [x for x in events if isinstance(x, BlockRemoved) and x.medium == "CPU"]
    assert removed                                  # 27 blocks through 12 slots


def test_prometheus_endpoint_and_vllm_stats(model, monkeypatch):
    from saria.connector.vllm import SariaConnector

    seen = []  # what vLLM's scheduler collected through the stats hook, step by step
    real = SariaConnector.get_kv_connector_stats

    def spy(self):
        st = real(self)
        if st is not None and self._scheduler is not None:
            seen.append(dict(st.data))
        return st

    monkeypatch.setattr(SariaConnector, "get_kv_connector_stats", spy)
    a, _ = prompts(0)
    with engine(model, {"dram_bytes": 64 * SLOT, "metrics_port": 0}) as llm:
        port = scheduler_connector(llm)._scheduler.metrics_server.server_port  # the OS's pick
        # issue 41: it bound 0.0.0.0; now every listener in the engine's process is on loopback
        assert any(p == port for _, p in listeners(os.getpid()))
        assert off_loopback(os.getpid()) == []
        generate(llm, a)
        generate(llm, a)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    got = {m.group(1): float(m.group(2)) for m in
           re.finditer(r"^saria_(\w+?)(?:_total)? ([0-9.e+]+)$", text, re.M)}
    assert got["dram_hit_blocks"] == 9
    assert got["dram_hit_bytes"] == 9 * SLOT
    assert got["stored_blocks"] == 9
    assert got["dram_used_slots"] == 9
    assert got["load_failures"] == 0
    # vLLM pulled increments every step; they add up to the totals
    total = SariaConnector.build_kv_connector_stats()
    for d in seen:
        total.aggregate(type(total)(data=d))
    assert total.reduce()["dram_hit_blocks"] == 9 and total.reduce()["stored_blocks"] == 9
    assert len(seen) >= 2   # one per step that moved something (a step that did not says nothing)


def test_connector_by_name_through_the_plugin_entry_point(model):
    """kv_connector="SariaConnector" without a module path: saria's
    vllm.general_plugins entry point registered the name."""
    from vllm_harness import connector_config

    a, _ = prompts(0)
    by_name = connector_config({"dram_bytes": 64 * SLOT}, by_name=True)
    with engine(model, None, kv_transfer_config=by_name) as llm:
        assert type(scheduler_connector(llm)).__name__ == "SariaConnector"
        generate(llm, a)
        assert generate(llm, a)[1] == 288
