"""KV events from ``saria serve`` and the routing index built from them.

The wire format is checked against vLLM's own msgspec types in both
directions; a live server (real DRAM pool, real O_DIRECT SSD store) is driven
by real clients until its DRAM evicts to the SSD, and the index a subscriber
builds from the events alone must equal what the server holds.
"""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from budgets import examples

from saria.index import Tier
from saria.keys import BlockHasher, keys_to_array
from saria.routing import BIT, EventSubscriber, FleetIndex, wire
from saria.routing.scoring import DYNAMO_WEIGHTS, LLMD_WEIGHTS
from saria.serve.client import RemoteCache
from saria.serve.publisher import residency
from saria.serve.server import CacheServer, ServerConfig

SLOT = 16 << 10
LAYOUT = dict(model="tiny", dtype="float32", block_size=16, page_bytes=SLOT, num_layers=2,
              tp_size=1, kv_layout="default", hash_algo="sha256_cbor", hash_seed="t",
              slot_bytes=SLOT)


def chain(seed: int, n: int) -> np.ndarray:
    return keys_to_array(BlockHasher(16, seed="routing").block_keys(
        [seed * 100_000 + i for i in range(16 * n)]))


# ------------------------------------------------------------ the wire


def test_vllm_decodes_what_saria_publishes():
    pytest.importorskip("vllm")
    import msgspec
    from vllm.distributed.kv_events import (AllBlocksCleared, BlockRemoved, BlockStored,
                                            KVEventBatch)

    events = [wire.Cleared(),
              wire.Stored((11, 12, 13), wire.MEDIUM_CPU, parent=10, block_size=16),
              wire.Stored((b"\x01" * 32,), wire.MEDIUM_STORAGE),
              wire.Removed((12,), wire.MEDIUM_CPU),
              wire.Stored((7,), wire.MEDIUM_CLUSTER, locality="REMOTE")]
    batch = msgspec.msgpack.Decoder(KVEventBatch).decode(wire.pack_batch(events, ts=5.0))
    assert batch.ts == 5.0 and batch.data_parallel_rank is None
    got = batch.events
    assert isinstance(got[0], AllBlocksCleared)
    assert isinstance(got[1], BlockStored) and got[1].block_hashes == [11, 12, 13]
    assert got[1].parent_block_hash == 10 and got[1].medium == "CPU" and got[1].block_size == 16
    assert got[2].block_hashes == [b"\x01" * 32] and got[2].medium == "STORAGE"
    assert got[2].locality == "LOCAL"  # the node's own SSD
    assert isinstance(got[3], BlockRemoved) and got[3].block_hashes == [12]
    # the cluster tier as vLLM marks a remote storage tier (before: medium "CLUSTER",
    # which Dynamo's router refuses and llm-d scores 0)
    assert got[4].medium == "STORAGE" and got[4].locality == "REMOTE"
    # and what vLLM publishes, saria reads
    theirs = KVEventBatch(ts=1.0, events=[
        BlockStored(block_hashes=[1, 2], parent_block_hash=None, token_ids=list(range(32)),
                    block_size=16, lora_id=None, medium="GPU", lora_name=None),
        BlockRemoved(block_hashes=[1], medium="GPU"), AllBlocksCleared()],
        data_parallel_rank=2)
    back = wire.unpack_batch(msgspec.msgpack.Encoder().encode(theirs))
    assert back.data_parallel_rank == 2
    assert back.events == [wire.Stored((1, 2), "GPU", None, tuple(range(32)), 16),
                           wire.Removed((1,), "GPU"), wire.Cleared()]


def test_routers_read_storage_local_and_remote_from_vllms_own_events():
    """Events written with vLLM's own types (STORAGE + LOCAL, STORAGE + REMOTE)
    land in the right tier of the router's index: the node's SSD, the fleet's
    cluster tier (every node can load it); an older publisher's CLUSTER too.
    What Dynamo's and llm-d's documented mappings key on is the medium alone:
    both see STORAGE, a medium they know (disk 0.25; llm-d's storage tier)."""
    pytest.importorskip("vllm")
    import msgspec
    from vllm.distributed.kv_events import BlockStored, KVEventBatch

    def stored(hashes, medium, locality):
        return BlockStored(block_hashes=hashes, parent_block_hash=None, token_ids=[],
                           block_size=0, lora_id=None, medium=medium, lora_name=None,
                           locality=locality)

    enc = msgspec.msgpack.Encoder()
    idx = FleetIndex()
    batch = KVEventBatch(ts=1.0, events=[stored([1, 2], "STORAGE", "LOCAL"),
                                         stored([3], "STORAGE", "REMOTE"),
                                         stored([4], "CLUSTER", None)])
    idx.ingest(b"kv@a@m", (0).to_bytes(8, "big"), enc.encode(batch))
    a, b = idx.holds("a"), idx.holds("b")
    assert a[wire.MEDIUM_STORAGE] == {1, 2} and not b[wire.MEDIUM_STORAGE]
    assert a[wire.MEDIUM_CLUSTER] == b[wire.MEDIUM_CLUSTER] == {3, 4}
    assert idx.media("b", [3, 4, 1]) == [BIT[wire.MEDIUM_CLUSTER]] * 2  # 1 is a's alone
    for ev in wire.unpack_batch(wire.pack_batch([wire.Stored((5,), wire.MEDIUM_CLUSTER),
                                                 wire.Stored((6,), wire.MEDIUM_STORAGE)])).events:
        assert ev.medium in DYNAMO_WEIGHTS and ev.medium in LLMD_WEIGHTS and ev.medium == "STORAGE"


def test_block_hash_is_vllms_conversion():
    pytest.importorskip("vllm")
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

    key = bytes(range(32))
    assert wire.block_hash(key) == maybe_convert_block_hash(key)


def test_a_bad_payload_is_one_clear_error():
    with pytest.raises(ValueError, match="topic 'kv@a@m' seq 3: not a KVEventBatch"):
        FleetIndex().ingest(b"kv@a@m", (3).to_bytes(8, "big"), b"\x93garbage")


# ---------------------------------------------------- index vs a model

MEDIA = [wire.MEDIUM_GPU, wire.MEDIUM_CPU, wire.MEDIUM_STORAGE, wire.MEDIUM_CLUSTER]
event = st.tuples(st.sampled_from(["stored", "removed", "cleared"]), st.sampled_from("ab"),
                  st.sampled_from(MEDIA), st.lists(st.integers(0, 7), min_size=1, max_size=4))


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(event, max_size=40), st.lists(st.integers(0, 7), max_size=8))
def test_fleet_index_equals_a_brute_force_model(evs, query):
    idx, model, cluster = FleetIndex(), {"a": set(), "b": set()}, set()
    for kind, node, medium, hashes in evs:
        if kind == "cleared":
            idx.apply(node, wire.Batch(0.0, [wire.Cleared()]))
            model[node].clear()
            cluster -= {(h, n) for h, n in cluster if n == node}
            continue
        ev = (wire.Stored if kind == "stored" else wire.Removed)(tuple(hashes), medium)
        idx.apply(node, wire.Batch(0.0, [ev]))
        for h in hashes:
            if medium == wire.MEDIUM_CLUSTER:
                if kind == "stored":
                    cluster.add((h, node))
                else:
                    cluster -= {(h, n) for n in "ab"}
            elif kind == "stored":
                model[node].add((h, medium))
            else:
                model[node].discard((h, medium))
    in_cluster = {h for h, _ in cluster}
    for node in "ab":
        holds = idx.holds(node)
        for m in MEDIA[:3]:
            assert holds[m] == {h for h, mm in model[node] if mm == m}
        assert holds[wire.MEDIUM_CLUSTER] == in_cluster
        want = []
        for h in query:
            bits = sum(BIT[m] for hh, m in model[node] if hh == h)
            bits |= BIT[wire.MEDIUM_CLUSTER] if h in in_cluster else 0
            if not bits:
                break
            want.append(bits)
        assert idx.media(node, query) == want


# ------------------------------------------------------- a live server


def start(tmp_path) -> tuple[CacheServer, threading.Thread]:
    cfg = ServerConfig(listen=f"ipc://{tmp_path}/serve.sock", dram_bytes=24 * SLOT,
                       ssd_dirs=(str(tmp_path / "ssd"),), ssd_bytes=256 * SLOT,
                       admission="write-back", lease_s=30.0,
                       events=f"ipc://{tmp_path}/events.sock", node="node-a")
    server = CacheServer(cfg, runtime_dir=str(tmp_path))
    t = threading.Thread(target=server.serve, daemon=True)
    t.start()
    return server, t


def stop(server: CacheServer, t: threading.Thread) -> None:
    server.stop()
    t.join(timeout=30)


@pytest.fixture
def live(tmp_path):
    server, t = start(tmp_path)
    sub = EventSubscriber([server.publisher.address])
    time.sleep(0.3)  # a PUB drops what it sends before the SUB has joined
    yield server, sub
    stop(server, t)
    sub.close()


def _drain(sub: EventSubscriber, quiet_s: float = 0.5) -> None:
    last = time.monotonic()
    while time.monotonic() - last < quiet_s:
        if sub.poll(100):
            last = time.monotonic()


def _store(client: RemoteCache, keys: np.ndarray) -> None:
    spec = client.prepare_store(keys, 0)
    i = client.info
    pool = np.memmap(i["pool"], np.uint8, "r+", shape=(i["pool_slots"], i["slot_bytes"]))
    pool[spec.slots] = np.tile(keys[spec.positions], (1, SLOT // 32))
    pool.flush()
    client.complete_store(spec)


def test_the_index_from_a_live_servers_events_equals_its_residency(live):
    """Two engines store and load random prefixes until DRAM evicts to the SSD
    many times; a subscriber's index, built from the events only, equals the
    server's ready residency per medium, and no batch was lost."""
    server, sub = live
    rng = random.Random(5)
    a = RemoteCache(server.address, LAYOUT, name="A")
    b = RemoteCache(server.address, LAYOUT, name="B")
    chains = [chain(s, rng.randrange(2, 9)) for s in range(12)]
    for _ in range(60):
        c, keys = rng.choice([a, b]), rng.choice(chains)
        n = c.lookup(keys).num_blocks
        if n:
            spec = c.prepare_load(keys, n)
            c.complete_load(spec)
        if n < keys.shape[0]:
            _store(c, keys)
    a.flush()
    _drain(sub)
    cache = next(iter(server.caches.values()))
    want = residency(cache, digest=32)
    got = sub.index.holds("node-a")
    assert want[wire.MEDIUM_STORAGE], "the test must drive DRAM victims to the SSD"
    assert got[wire.MEDIUM_CPU] == want[wire.MEDIUM_CPU]
    assert got[wire.MEDIUM_STORAGE] == want[wire.MEDIUM_STORAGE]
    assert sub.index.gaps == 0 and sub.errors == 0
    # a router's plan for a stored chain names the media the server holds it in
    keys = chains[0]
    plan = cache.lookup(keys)
    media = sub.index.media("node-a", [wire.block_hash(bytes(k)) for k in keys])
    assert len(media) == plan.num_available
    for bits, tiers in zip(media, plan.masks[:len(media)]):
        assert bool(bits & BIT[wire.MEDIUM_CPU]) == bool(tiers & Tier.DRAM.bit)
        assert bool(bits & BIT[wire.MEDIUM_STORAGE]) == bool(tiers & Tier.SSD.bit)
    a.close(), b.close()


def test_a_restarted_server_clears_what_routers_knew(tmp_path):
    """After a restart the first batch clears the node; blocks the SSD kept
    come back as lookups adopt them, and the index follows the server."""
    server, t = start(tmp_path)
    sub = EventSubscriber([server.publisher.address])
    time.sleep(0.3)
    a = RemoteCache(server.address, LAYOUT, name="A", timeout_s=2.0)
    chains = [chain(s, 6) for s in range(8)]  # 48 blocks through 24 DRAM slots
    for keys in chains:
        _store(a, keys)
    a.flush()
    _drain(sub)
    before = sub.index.holds("node-a")
    assert before[wire.MEDIUM_STORAGE] and before[wire.MEDIUM_CPU]
    a.close()
    stop(server, t)
    server, t = start(tmp_path)
    _drain(sub, 1.0)  # the SUB reconnects to the new publisher while it is polled
    a = RemoteCache(server.address, LAYOUT, name="A")
    a.lookup(chains[0][:1])  # hello opens the namespace: AllBlocksCleared
    _drain(sub)
    after = sub.index.holds("node-a")
    assert not after[wire.MEDIUM_CPU]   # DRAM did not survive the restart
    for keys in chains:
        a.lookup(keys)                  # adopts what the SSD kept
    _drain(sub)
    want = residency(next(iter(server.caches.values())), digest=32)
    got = sub.index.holds("node-a")
    assert got[wire.MEDIUM_STORAGE] == want[wire.MEDIUM_STORAGE] != set()
    assert got[wire.MEDIUM_STORAGE] <= before[wire.MEDIUM_STORAGE]
    assert sub.index.gaps == 0  # a restarted publisher counts from 0 again: no gap
    a.close()
    stop(server, t)
    sub.close()
