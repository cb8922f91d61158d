"""TieredCache's two-phase calls as the vLLM connector drives them while a
worker process moves the bytes -- DRAM slots through the shared pool, SSD
blocks through a read-only reader of the same drive files: the bytes a load
names are the bytes a completed store accepted, whatever evictions, SSD round
trips, promotions and failures happened in between (a hypothesis state
machine against a plain dict model); plus the shared DRAM pool and the one
owner per drive."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from budgets import examples

from saria.index import Tier
from saria.keys import BlockHasher, keys_to_array
from saria.runtime import CacheConfig, TieredCache
from saria.sim.real import synthetic_rows
from saria.tiers.dram import DramPool, DramPoolError
from saria.tiers.ssd import SsdStore

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


def worker_read(cache: TieredCache, reader: SsdStore, spec) -> tuple[np.ndarray, np.ndarray]:
    """What the connector's worker does with a load: DRAM slots from the
    shared pool, SSD handles through its own read-only view of the drives.
    Returns the rows and the positions whose SSD read failed."""
    rows = np.zeros((spec.num_blocks, BB), np.uint8)
    dram, ssd = spec.positions(Tier.DRAM), spec.positions(Tier.SSD)
    if dram.size:
        cache.backend.pool.gather(spec.slots[dram], part := np.empty((dram.size, BB), np.uint8))
        rows[dram] = part
    failed = ssd[:0]
    if ssd.size:
        part = np.empty((ssd.size, BB), np.uint8)
        ok = reader.read(spec.slots[ssd], spec.path[ssd], part)
        rows[ssd] = part
        failed = ssd[~ok]
    return rows, failed


def test_worker_reads_ssd_blocks_and_promotes_from_its_copy(tmp_path):
    with make(tmp_path) as cache, SsdStore.reader(cache.backend.ssd.dirs, BB) as reader:
        a, b = chain(1, 4), chain(2, 6)
        fill(cache, a)
        fill(cache, b)                                 # pushes a out of DRAM, a is on SSD
        plan = cache.lookup(a)
        assert plan.blocks_from(Tier.SSD) == 4
        spec = cache.prepare_load(a, 4)
        assert spec.positions(Tier.SSD).tolist() == [0, 1, 2, 3]
        rows, failed = worker_read(cache, reader, spec)
        assert failed.size == 0 and (rows == synthetic_rows(a, BB)).all()
        assert cache.complete_load(spec, failed) == 4
        promo = cache.prepare_promotion(a, spec.positions(Tier.SSD), 0)   # "full"
        cache.backend.pool.scatter(promo.slots, rows[promo.positions])     # from the KV copy
        assert cache.complete_store(promo) == 4
        assert cache.lookup(a).blocks_from(Tier.DRAM) == 4
        assert cache.stats.promoted_blocks == 4


def test_a_corrupt_ssd_block_is_dropped_and_shortens_the_hit(tmp_path):
    with make(tmp_path, promotion="none") as cache, \
            SsdStore.reader(cache.backend.ssd.dirs, BB) as reader:
        a, b = chain(1, 4), chain(2, 6)
        fill(cache, a)
        fill(cache, b)
        handles = cache.lookup(a).slots
        _flip_payload(cache, int(handles[2]))
        spec = cache.prepare_load(a, 4)
        rows, failed = worker_read(cache, reader, spec)
        assert failed.tolist() == [2] and not rows[2].any()        # zeroed, never wrong bytes
        assert cache.complete_load(spec, failed) == 2
        assert cache.stats.ssd_read_failures == 1
        assert cache.lookup(a).num_blocks == 2         # the bad copy left the SSD tier
        assert cache.index.slot_of(bytes(a[3]), Tier.SSD) is not None  # the others stay


def test_one_owner_per_drive(tmp_path):
    with make(tmp_path) as cache:
        with pytest.raises(OSError, match=f"{tmp_path / 'd0'} is in use by another saria cache "
                                          f"\\(pid {os.getpid()}\\)"):
            make(tmp_path)
        reader = SsdStore.reader(cache.backend.ssd.dirs, BB)   # readers take no lock
        with pytest.raises(Exception, match="read-only"):
            reader.write(chain(9, 1), np.zeros((1, BB), np.uint8))
        reader.close()
    with make(tmp_path) as again:                      # the owner closed: free again
        assert again.backend.ssd is not None


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
    """Random requests over a small prefix tree, read by a worker from DRAM
    and SSD; every block a load names must hold exactly the bytes committed
    for its key (the model: key -> committed)."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="saria-ext-")
        self.cache = make(type("P", (), {"__truediv__": lambda s, x: os.path.join(self.dir, x)})(),
                          promotion="lazy", admission="saria")
        self.reader = SsdStore.reader(self.cache.backend.ssd.dirs, BB)
        self.committed: set[bytes] = set()

    def teardown(self) -> None:
        self.reader.close()
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
        plan = self.cache.lookup(keys)
        spec = self.cache.prepare_load(keys, plan.num_blocks)
        rows, failed = worker_read(self.cache, self.reader, spec)
        assert failed.size == 0
        assert (rows == synthetic_rows(spec.path, BB)).all()
        for k in spec.path:
            assert bytes(k) in self.committed
        served = self.cache.complete_load(spec, failed)
        res = self.cache.prepare_store(keys, served)
        self.cache.backend.pool.scatter(res.slots, synthetic_rows(res.keys, BB))
        self.cache.complete_store(res, success=not fail)
        if not fail:
            self.committed.update(bytes(k) for k in res.path[res.positions])
        promo = self.cache.prepare_promotion(keys, spec.positions(Tier.SSD), 0)
        self.cache.backend.pool.scatter(promo.slots, rows[promo.positions])
        self.cache.complete_store(promo)

    @invariant()
    def index_consistent(self):
        self.cache.index.check()


ExternalCopyMachine.TestCase.settings = settings(max_examples=examples(40), stateful_step_count=25,
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
    from saria.tiers.ssd import DATA_FILE_NAME, slot_bytes_for

    d = cache.backend.ssd.dirs[0]
    with open(os.path.join(d, DATA_FILE_NAME), "r+b") as f:
        off = 4096 + handle * slot_bytes_for(BB) + 64 + 100
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0xFF]))
