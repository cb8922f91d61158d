"""The store behind saria's LMCache adapters (``saria.lmcache.ChunkStore``),
without LMCache: bytes back are the bytes in, admission as documented,
persistence across instances, bad copies are misses, params checked by key."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from budgets import examples

from saria.errors import ConfigError
from saria.lmcache import AdapterParams, ChunkStore
from saria.lmcache.chunks import HEADER

CHUNK = 16 << 10


def digest(i: int) -> bytes:
    return hashlib.sha256(f"chunk-{i}".encode()).digest()


def payload(i: int, n: int = CHUNK) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, n, dtype=np.uint8)


def make(path, **kw) -> ChunkStore:
    params = {"path": str(path), "capacity": "64MiB", "chunk_bytes": CHUNK,
              "dram": 4 * (CHUNK + HEADER), **kw}
    return ChunkStore(AdapterParams.from_dict(params))


def get(cs: ChunkStore, ids, n: int = CHUNK) -> list[np.ndarray | None]:
    outs = [np.zeros(n, np.uint8) for _ in ids]
    ok = cs.get([digest(i) for i in ids], outs)
    return [o if k else None for o, k in zip(outs, ok)]


def test_round_trip_from_dram_and_ssd_with_a_partial_chunk(tmp_path):
    cs = make(tmp_path, admission="full-duplicate")
    ids = list(range(12))
    sizes = [CHUNK] * 11 + [CHUNK // 3]   # a request's last chunk is partial
    taken = cs.put([digest(i) for i in ids], [payload(i, n) for i, n in zip(ids, sizes)])
    assert taken == sizes
    cs.flush()
    st_ = cs.status()
    assert st_["dram_used_slots"] == 4 and st_["ssd_writes"] == 12
    for i, n in zip(ids, sizes):
        (got,) = get(cs, [i], n)
        assert got is not None and np.array_equal(got, payload(i, n)), i
    assert cs.status()["ssd_bytes_read"] > 0          # the early ones came from the SSD
    assert get(cs, [11], CHUNK) == [None]            # asked with another size: a miss
    cs.close()


def test_a_stored_chunk_is_not_taken_twice_and_a_too_large_one_not_at_all(tmp_path):
    cs = make(tmp_path)
    assert cs.put([digest(1)], [payload(1)]) == [CHUNK]
    assert cs.put([digest(1)], [payload(1)]) == [0]
    assert cs.put([digest(2)], [payload(2, CHUNK + 1)]) == [0]
    assert cs.status()["too_large"] == 1
    assert get(cs, [2], CHUNK + 1) == [None]
    cs.close()


def test_saria_admission_writes_a_chunk_on_its_second_drop_from_the_buffer(tmp_path):
    """E2: the buffer drops a chunk the first time unwritten; a request that
    wants it again (an L1 miss) and its re-store make the next drop a write."""
    cs = make(tmp_path, admission="saria")
    cs.put([digest(i) for i in range(8)], [payload(i) for i in range(8)])  # 0-3 dropped
    cs.flush()
    assert cs.status()["ssd_writes"] == 0
    assert cs.lookup_lock([digest(0)]) == [False]       # wanted again: a miss
    cs.put([digest(0)], [payload(0)])                    # recomputed, stored again
    cs.put([digest(i) for i in range(10, 14)], [payload(i) for i in range(10, 14)])
    cs.flush()
    assert cs.status()["ssd_writes"] == 1                # only chunk 0, on its second drop
    (got,) = get(cs, [0])
    assert got is not None and np.array_equal(got, payload(0))
    assert get(cs, [1]) == [None]
    cs.close()


def test_full_duplicate_writes_every_chunk_and_dram_only_none(tmp_path):
    for policy, writes in (("full-duplicate", 10), ("write-back", 6), ("dram-only", 0)):
        cs = make(tmp_path / policy, admission=policy)
        cs.put([digest(i) for i in range(10)], [payload(i) for i in range(10)])
        cs.flush()
        assert cs.status()["ssd_writes"] == writes, policy
        cs.close()


def test_a_new_store_on_the_same_directory_serves_what_the_last_one_wrote(tmp_path):
    cs = make(tmp_path, admission="full-duplicate")
    cs.put([digest(i) for i in range(6)], [payload(i) for i in range(6)])
    cs.close()
    again = ChunkStore(AdapterParams.from_dict({"path": str(tmp_path), "capacity": "64MiB"}))
    assert again.chunk_bytes == CHUNK                    # read back from the store
    assert again.lookup_lock([digest(i) for i in range(7)]) == [True] * 6 + [False]
    got = get(again, range(6))
    assert all(g is not None and np.array_equal(g, payload(i)) for i, g in enumerate(got))
    again.unlock([digest(i) for i in range(6)])
    again.close()
    with pytest.raises(ConfigError, match="^chunk_bytes: 4096 differs"):
        make(tmp_path, chunk_bytes=4096)


def flip(cs: ChunkStore, i: int) -> None:
    """Flips one payload byte of chunk `i`'s SSD copy in the data file."""
    cache = cs.cache
    handle = cache.index.slot_of(digest(i), "SSD")
    ssd = cache.backend.ssd
    off = 4096 + handle * ssd.slot_bytes + 64 + HEADER + 100
    with open(os.path.join(ssd.dirs[0], "saria-ssd.data"), "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0xFF]))


def test_a_chunk_corrupted_on_the_drive_is_a_miss_and_leaves_the_ssd(tmp_path):
    cs = make(tmp_path, admission="full-duplicate")
    cs.put([digest(i) for i in range(8)], [payload(i) for i in range(8)])
    cs.flush()
    flip(cs, 0)                                          # 0 is on the SSD only
    assert cs.lookup_lock([digest(0)]) == [True]         # the index still has it
    assert get(cs, [0]) == [None]                        # its crc32c does not check out
    cs.unlock([digest(0)])
    assert cs.lookup_lock([digest(0)]) == [False]        # gone from the SSD tier
    assert cs.status()["ssd_read_failures"] == 1
    flip(cs, 1)                                          # and without a lock first
    assert get(cs, [1]) == [None] and not cs.contains(digest(1))
    (two,) = get(cs, [2])
    assert two is not None and np.array_equal(two, payload(2))
    flip(cs, 3)
    cs.close()
    again = make(tmp_path)                               # a restart reads the journal: 3 is
    assert again.lookup_lock([digest(3), digest(4)]) == [True, True]  # listed, its read a miss
    assert get(again, [3]) == [None]
    (four,) = get(again, [4])
    assert four is not None and np.array_equal(four, payload(4))
    again.unlock([digest(3), digest(4)])
    assert again.lookup_lock([digest(3)]) == [False]     # and it left the SSD tier
    assert again.status()["ssd_read_failures"] == 1
    again.close()


def test_remove_skips_locked_chunks(tmp_path):
    cs = make(tmp_path)
    cs.put([digest(i) for i in range(3)], [payload(i) for i in range(3)])
    assert cs.lookup_lock([digest(0)]) == [True]
    assert cs.remove([digest(0), digest(1)]) == [digest(1)]
    assert get(cs, [1]) == [None]
    cs.unlock([digest(0)])
    assert cs.remove([digest(0)]) == [digest(0)]
    ch = cs.take_changes()
    assert set(ch.added) == {digest(i) for i in range(3)}
    assert set(ch.removed) == {digest(0), digest(1)}
    cs.close()


@pytest.mark.parametrize("params, key", [
    ({"capacity": "1GB"}, "path"),
    ({"path": "/no/such/dir/x", "capacity": "1GB"}, "path"),
    ({"path": ".", "capacity": "lots"}, "capacity"),
    ({"path": "."}, "capacity"),
    ({"path": ".", "capacity": "1GB", "admission": "sometimes"}, "admission"),
    ({"path": ".", "capacity": "1GB", "admission": "budget:x"}, "admission"),
    ({"path": ".", "capacity": "1GB", "dwpd": 0}, "dwpd"),
    ({"path": ".", "capacity": "1GB", "chunk_size": 4}, "chunk_size"),
    ({"path": [".", "."], "capacity": "1GB"}, "path"),
    ({"path": ".", "capacity": "1GB", "write_queue": 0}, "write_queue"),
])
def test_bad_params_name_the_key(tmp_path, monkeypatch, params, key):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        AdapterParams.from_dict(params)
    assert str(e.value).startswith(f"{key}: ")


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["put", "lookup", "get", "unlock", "remove", "flush"]),
                          st.lists(st.integers(0, 9), min_size=1, max_size=4)), max_size=40),
       st.sampled_from(["saria", "full-duplicate", "write-back", "R2", "budget"]))
def test_gets_return_the_bytes_put_or_miss_and_locks_balance(tmp_path_factory, ops, policy):
    """Against a model of what was put (one content per digest, as LMCache's
    keys are content hashes): a hit returns the chunk's bytes, a chunk never
    put never hits, a locked chunk is never removed, and once every lookup is
    unlocked no lock is left."""
    cs = make(tmp_path_factory.mktemp("p"), admission=policy)
    put: set[int] = set()
    locks: dict[int, int] = {}
    for op, ids in ops:
        ids = list(dict.fromkeys(ids))
        if op == "put":
            cs.put([digest(i) for i in ids], [payload(i) for i in ids])
            put.update(ids)
        elif op == "lookup":
            for i, hit in zip(ids, cs.lookup_lock([digest(i) for i in ids])):
                assert not hit or i in put
                locks[i] = locks.get(i, 0) + hit
        elif op == "get":
            for i, got in zip(ids, get(cs, ids)):
                assert got is None or (i in put and np.array_equal(got, payload(i))), i
        elif op == "unlock":
            cs.unlock([digest(i) for i in ids])
            for i in ids:
                locks[i] = max(0, locks.get(i, 0) - 1)
        elif op == "remove":
            for d in cs.remove([digest(i) for i in ids]):
                assert not locks.get(next(j for j in ids if digest(j) == d))
        else:
            cs.flush()
    for i, n in locks.items():
        cs.unlock([digest(i)] * n)
    assert not cs._held and not cs._busy
    cs.close()


def test_a_lock_lmcache_never_releases_expires_after_its_lease(tmp_path):
    """A lookup whose request was aborted never unlocks: past ``lock_ttl``
    saria releases the chunk (it can be removed and evicted again); a late
    unlock of it is a no-op."""
    import time

    cs = make(tmp_path, admission="write-back", lock_ttl=0.2)
    cs.put([digest(0)], [payload(0)])
    assert cs.lookup_lock([digest(0)]) == [True]
    assert cs.remove([digest(0)]) == []              # locked: it stays
    time.sleep(0.3)
    cs.lookup_lock([digest(1)])                      # any call: the lease is over
    assert cs.status()["expired_locks"] == 1
    cs.unlock([digest(0)])                           # nothing left to release
    assert cs.remove([digest(0)]) == [digest(0)]
    assert get(cs, [0]) == [None]
    cs.close()


def test_lmcache_bench_l2s_shape_finds_every_stored_chunk_with_the_smallest_buffer(tmp_path):
    """Stores right after stores with a 4-chunk buffer and write-back: every
    chunk a store took is found by a lookup right after -- in the buffer,
    in a write-behind slot while its SSD write is queued, or on the SSD --
    and reads back byte-exact."""
    cs = ChunkStore(AdapterParams.from_dict(
        {"path": str(tmp_path), "capacity": "64MiB", "chunk_bytes": CHUNK,
         "dram": 4 * (CHUNK + HEADER), "admission": "write-back"}), backpressure=True)
    ids = list(range(64))
    assert all(cs.put([digest(i)], [payload(i)]) == [CHUNK] for i in ids)
    assert cs.lookup_lock([digest(i) for i in ids]) == [True] * 64
    got = get(cs, ids)
    assert all(g is not None and np.array_equal(g, payload(i)) for i, g in zip(ids, got))
    cs.unlock([digest(i) for i in ids])
    assert cs.status()["ssd_writes_dropped"] == 0
    cs.close()
