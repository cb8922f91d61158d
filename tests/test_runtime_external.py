"""TieredCache's copier-facing calls (prepare/complete store, stage/release), which the
vLLM connector drives while a worker process moves the bytes: the bytes a
stage exposes are the bytes a commit accepted, whatever evictions, SSD round
trips and failures happened in between -- checked by a hypothesis state
machine against a plain dict model -- plus the shared DRAM pool."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from saria.index import Tier
from saria.keys import BlockHasher, keys_to_array
from saria.runtime import CacheConfig, TieredCache
from saria.sim.real import synthetic_rows
from saria.tiers.dram import DramPool, DramPoolError

BB = 4096
HASHER = BlockHasher(4, seed="external-test")


def chain(prefix: int, n: int) -> np.ndarray:
    return keys_to_array(HASHER.block_keys([prefix * 1000 + i for i in range(4 * n)]))


def make(tmp_path, **kw) -> TieredCache:
    cfg = dict(block_bytes=BB, dram_bytes=6 * BB, ssd_dirs=(str(tmp_path / "d0"),),
               ssd_bytes=4096 + 24 * (BB + 4096), admission="full-duplicate",
               promotion="full", write_mode="sync", events=True)
    cfg.update(kw)
    return TieredCache(CacheConfig(**cfg), clock=lambda: 0.0)


def fill(cache: TieredCache, keys: np.ndarray, start: int = 0) -> int:
    """The worker's part of a store: copy the blocks' bytes into the reserved slots."""
    res = cache.prepare_store(keys, start)
    cache.backend.pool.scatter(res.slots, synthetic_rows(res.keys, BB))
    return cache.complete_store(res)


def test_reserved_slots_are_locked_until_commit(tmp_path):
    with make(tmp_path, dram_bytes=4 * BB, ssd_dirs=()) as cache:
        a, b = chain(1, 3), chain(2, 3)
        res = cache.prepare_store(a)
        assert res.num_blocks == 3
        assert cache.prepare_store(b).num_blocks == 1        # only the free slot: a's are locked
        cache.complete_store(res)
        assert cache.lookup(a).num_blocks == 3


def test_failed_fill_leaves_no_trace(tmp_path):
    with make(tmp_path) as cache:
        a = chain(1, 3)
        res = cache.prepare_store(a)
        cache.complete_store(res, success=False)
        assert cache.lookup(a).num_blocks == 0
        assert cache.backend.pool.used_slots == 0
        assert cache.backend.ssd.stats()["total"]["blocks_written"] == 0   # admission never saw them


def test_stage_reads_ssd_blocks_into_spare_slots_and_promotes(tmp_path):
    with make(tmp_path) as cache:
        a, b = chain(1, 4), chain(2, 6)
        fill(cache, a)
        fill(cache, b)                                 # pushes a out of DRAM, a is on SSD
        plan = cache.lookup(a)
        assert plan.blocks_from(Tier.SSD) == 4
        s = cache.stage(a)
        assert s.num_blocks == 4 and s.ssd_positions.tolist() == [0, 1, 2, 3]
        rows = np.empty((4, BB), np.uint8)
        cache.backend.pool.gather(s.slots, rows)
        assert (rows == synthetic_rows(a, BB)).all()
        assert cache.release(s) == 4                   # promotion "full": kept, no copy
        assert cache.lookup(a).blocks_from(Tier.DRAM) == 4


def test_stage_stops_before_a_corrupt_ssd_block(tmp_path):
    with make(tmp_path, promotion="none") as cache:
        a, b = chain(1, 4), chain(2, 6)
        fill(cache, a)
        fill(cache, b)
        handles = cache.lookup(a).slots
        _flip_payload(cache, int(handles[2]))
        s = cache.stage(a)
        assert s.num_blocks == 2 and s.failed == 1
        assert cache.stats.ssd_read_failures == 1
        cache.release(s)
        assert cache.lookup(a).num_blocks == 2         # the bad copy left the SSD tier
        # the spare slots all went back: only b's DRAM blocks hold slots
        assert cache.backend.pool.used_slots == cache.lookup(b).blocks_from(Tier.DRAM)


def test_events_follow_residency(tmp_path):
    with make(tmp_path) as cache:
        a, b = chain(1, 4), chain(2, 6)
        fill(cache, a)
        ev = cache.take_events()
        dram = [e for e in ev if e.tier == Tier.DRAM and e.kind == "stored"]
        assert [e.keys for e in dram] == [tuple(bytes(k) for k in a)] and dram[0].parent is None
        assert {k for e in ev if e.tier == Tier.SSD for k in e.keys} == {bytes(k) for k in a}
        fill(cache, b)
        removed = [k for e in cache.take_events() if e.kind == "removed" for k in e.keys]
        assert set(removed) == {bytes(k) for k in a}
        assert cache.take_events() == []


class ExternalCopyMachine(RuleBasedStateMachine):
    """Random requests over a small prefix tree; every staged slot must hold
    exactly the bytes committed for its key (the model: key -> committed)."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="saria-ext-")
        self.cache = make(type("P", (), {"__truediv__": lambda s, x: os.path.join(self.dir, x)})(),
                          promotion="lazy", admission="saria")
        self.committed: set[bytes] = set()

    def teardown(self) -> None:
        self.cache.close()

    def _keys(self, trunk: int, branch: int, n: int) -> np.ndarray:
        head = chain(trunk, 3)
        tail = keys_to_array(HASHER.block_keys([branch * 7 + i for i in range(4 * n)],
                                               parent=bytes(head[-1])))
        return np.concatenate([head, tail])

    @rule(trunk=st.integers(0, 2), branch=st.integers(0, 3), n=st.integers(0, 4),
          fail=st.booleans())
    def request(self, trunk, branch, n, fail):
        keys = self._keys(trunk, branch, n)
        s = self.cache.stage(keys)
        rows = np.empty((s.num_blocks, BB), np.uint8)
        self.cache.backend.pool.gather(s.slots, rows)
        assert (rows == synthetic_rows(s.path, BB)).all()
        for k in s.path:
            assert bytes(k) in self.committed
        res = self.cache.prepare_store(keys, s.num_blocks)
        self.cache.release(s)
        self.cache.backend.pool.scatter(res.slots, synthetic_rows(res.keys, BB))
        self.cache.complete_store(res, success=not fail)
        if not fail:
            self.committed.update(bytes(k) for k in res.path[res.positions])

    @invariant()
    def index_consistent(self):
        self.cache.index.check()


ExternalCopyMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=25,
                                                 deadline=None)
TestExternalCopy = ExternalCopyMachine.TestCase


def test_shared_pool_is_one_memory_in_two_mappings(tmp_path):
    path = str(tmp_path / "pool")
    with DramPool(4, 8192, shared=path, pin=False) as p1, \
            DramPool(4, 8192, shared=path, pin=False) as p2:
        assert p1.shared_id == p2.shared_id
        h = p1.alloc(2)
        p1.scatter(h, np.full((2, 8192), 7, np.uint8))
        assert (p2.array[h[1]] == 7).all()             # an attach never zeroes the bytes
        p2.array[3] = 9                                # (the attacher's own free list is unused)
        assert (p1.array[3] == 9).all()
        with pytest.raises(DramPoolError, match="holds 32,768 bytes, expected 16,384"):
            DramPool(2, 8192, shared=path, pin=False)
        p1.unlink()
        assert not os.path.exists(path)
        assert (p2.array[h[0]] == 7).all()             # mappings outlive the name


def _flip_payload(cache: TieredCache, handle: int) -> None:
    from saria.tiers.ssd import slot_bytes_for

    d = cache.backend.ssd.dirs[0]
    (name,) = [f for f in os.listdir(d) if not f.startswith(".")]
    with open(os.path.join(d, name), "r+b") as f:
        off = 4096 + handle * slot_bytes_for(BB) + 64 + 100
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0xFF]))
