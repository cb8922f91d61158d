"""The cache core's rules, one at a time, on the counting backend and on a
backend double whose SSD writes finish when the test says (CacheLib Navy's
MockDevice idea): what admission is shown, what a request may evict, what a
failed copy or read leaves behind, and that a write in flight is never
issued twice."""

from __future__ import annotations

import numpy as np

from saria.core import CacheManager, CountingBackend, SsdWrite
from saria.index import RadixIndex, Tier, VirtualClock
from saria.keys import BlockHasher, keys_to_array
from saria.policy import AdmissionPolicy, make_admission, make_promotion

DRAM, SSD = Tier.DRAM, Tier.SSD
HASHER = BlockHasher(4, seed="core-test")


def chain(prefix: int, n: int) -> np.ndarray:
    return keys_to_array(HASHER.block_keys([prefix * 1000 + i for i in range(4 * n)]))


def core(admission="write-back", *, dram=8, ssd=32, promotion="none", backend=None):
    backend = backend or CountingBackend({DRAM: dram, SSD: ssd})
    return CacheManager(RadixIndex(1000, clock=VirtualClock()),
                        admission if isinstance(admission, AdmissionPolicy)
                        else make_admission(admission),
                        make_promotion(promotion, r=1.0, min_victim_age_s=0.0), backend,
                        record_writes=True)


def store(c: CacheManager, keys: np.ndarray, start: int = 0, **kw) -> int:
    spec = c.prepare_store(keys, start, **kw)
    return c.complete_store(spec)


def written(c: CacheManager) -> set[bytes]:
    return {bytes(k) for keys, _ in c.take_ssd_writes() for k in keys}


class Recorder(AdmissionPolicy):
    """Admits nothing; remembers what each moment showed it."""

    name = "recorder"
    writes_nothing = False

    def __init__(self) -> None:
        self.seen = {"create": [], "access": [], "evict": []}

    def on_create(self, keys, now):
        self.seen["create"].append({bytes(k) for k in keys})
        return np.zeros(len(keys), bool)

    def on_access(self, keys, reuse, hits, now, **history):
        self.seen["access"].append({bytes(k) for k in keys})
        return np.zeros(len(keys), bool)

    def on_evict(self, keys, reuse, hits, dram_evictions, now, **history):
        self.seen["evict"].append({bytes(k) for k in keys})
        return np.zeros(len(keys), bool)


def test_admission_sees_every_dram_resident_a_request_touches():
    """Even those already on the SSD: a stateful policy (KVBM) counts every sighting."""
    rec = Recorder()
    c = core(rec)
    a = chain(1, 3)
    store(c, a)                            # the recorder admits nothing: nothing written
    c.index.add_existing(a[:1], SSD, [0])  # say block 0 reached the SSD some other way
    c.touch(a, hits=3)
    assert rec.seen["create"] == [{bytes(k) for k in a}]
    assert rec.seen["access"] == [{bytes(k) for k in a}]


def test_admission_hears_of_returns_to_blocks_that_left_dram():
    """A request that comes back to evicted blocks reports them, with their
    eviction counts, whether the SSD kept them or not; blocks still in DRAM
    are not returns after an eviction."""

    class Returns(Recorder):
        wants_returns = True
        wants_evicted_returns = True

        def on_returns(self, dram_evictions, now):
            self.returned = getattr(self, "returned", []) + [dram_evictions.tolist()]

    rec = Returns()
    c = core(rec, dram=4)
    a, b = chain(1, 4), chain(2, 4)
    store(c, a)
    c.touch(a, hits=0)
    assert not hasattr(rec, "returned")       # a is in DRAM: no return after eviction
    store(c, b)                               # a leaves DRAM (nothing written: the recorder refuses)
    c.touch(a, hits=0)
    assert rec.returned == [[1, 1, 1, 1]]


def test_write_back_writes_victims_once_and_frees_their_slots():
    c = core("write-back", dram=4)
    a, b = chain(1, 4), chain(2, 4)
    store(c, a)
    store(c, b)                                     # a leaves DRAM, onto the SSD
    assert written(c) == {bytes(k) for k in a}
    assert c.backend.used[DRAM] == 4 and c.backend.used[SSD] == 4
    assert c.lookup(a).blocks_from(SSD) == 4
    store(c, a)                                     # a back in DRAM, b out: a not rewritten
    assert written(c) == {bytes(k) for k in b}


def test_a_store_never_evicts_its_own_prefix():
    """DRAM holds the request's prefix: its new blocks take what is left, the
    leading ones first, and nothing else is written or evicted for them."""
    c = core("dram-only", dram=6)
    keys = chain(1, 10)
    store(c, keys[:5])
    spec = c.prepare_store(keys, 5)
    assert spec.positions.tolist() == [5]           # one free slot: the first new block
    c.complete_store(spec)
    assert c.lookup(keys).blocks_from(DRAM) == 6 and c.stats.dram_evictions == 0


def test_write_through_reaches_the_ssd_even_for_blocks_dram_cannot_take():
    c = core("full-duplicate", dram=2)
    keys = chain(1, 6)
    spec = c.prepare_store(keys, direct=True)
    assert spec.positions.tolist() == [0, 1] and spec.direct.tolist() == [2, 3, 4, 5]
    c.complete_store(spec)
    assert written(c) == {bytes(k) for k in keys}
    plan = c.lookup(keys)
    assert plan.num_blocks == 6 and plan.blocks_from(SSD) == 4
    # Without a way to hand over the bytes (the vLLM workers), nothing goes direct.
    other = chain(2, 6)
    assert c.prepare_store(other).direct.size == 0


def test_a_failed_copy_leaves_nothing_behind():
    c = core("full-duplicate")
    keys = chain(1, 3)
    spec = c.prepare_store(keys)
    assert c.complete_store(spec, success=False) == 0
    assert c.lookup(keys).num_blocks == 0 and c.backend.used[DRAM] == 0
    assert written(c) == set()                       # admission never saw the blocks


def test_a_failed_ssd_read_drops_that_copy_and_shortens_the_hit():
    c = core("write-back", dram=3)
    a, b = chain(1, 3), chain(2, 3)
    store(c, a)
    store(c, b)                                     # a only on the SSD now
    load = c.prepare_load(a, 3)
    assert load.positions(SSD).tolist() == [0, 1, 2]
    assert len(c.index.evict(SSD, 3)) == 0          # locked while the mover reads
    assert c.complete_load(load, np.array([1])) == 1
    assert c.stats.ssd_read_failures == 1 and c.stats.hit_blocks["SSD"] == 1
    plan = c.lookup(a)
    assert plan.num_blocks == 1 and c.index.slot_of(bytes(a[2]), SSD) is not None


def test_promotion_copies_ssd_hits_back_into_dram():
    c = core("write-back", dram=3, promotion="full")
    a, b = chain(1, 3), chain(2, 3)
    store(c, a)
    store(c, b)
    load = c.prepare_load(a, 3)
    c.complete_load(load)
    spec = c.prepare_promotion(a, load.positions(SSD), 0)
    assert spec.promotion and spec.positions.tolist() == [0, 1, 2]
    assert c.complete_store(spec) == 3
    assert c.lookup(a).blocks_from(DRAM) == 3 and c.stats.promoted_blocks == 3
    assert c.stats.stored_blocks == 6                # promotion is not a new block


class LaterBackend(CountingBackend):
    """SSD writes complete only when ``finish()`` is called (``ok=False``:
    they fail)."""

    asynchronous = True

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.queued: list[SsdWrite] = []

    def write_ssd(self, job: SsdWrite) -> bool:
        self.used[SSD] += job.keys.shape[0]
        self.queued.append(job)
        return True

    def finish(self, ok: bool = True) -> None:
        jobs, self.queued = self.queued, []
        for job in jobs:
            n = job.keys.shape[0]
            if not ok:
                self.used[SSD] -= n
            self._on_written(job, np.arange(n) if ok else np.full(n, -1))


def test_a_filling_copy_is_no_copy_for_any_reader():
    """Between prepare_store and complete_store a block holds a DRAM slot
    that no lookup, load, early persistence or eviction may use; the
    request's own prefix is not stored twice; success makes it ready."""
    c = core("R2", dram=8)
    a = chain(1, 4)
    store(c, a[:2])
    spec = c.prepare_store(a, 2)                    # blocks 2, 3: filling
    assert spec.positions.tolist() == [2, 3]
    assert c.lookup(a).num_blocks == 2 and c.prepare_load(a, 4).num_blocks == 2
    c.touch(a, hits=2)
    c.touch(a, hits=2)                              # reuse 2 reached: early persistence
    assert written(c) == {bytes(k) for k in a[:2]}  # never the filling blocks
    assert c.prepare_store(a, 0).num_blocks == 0    # no second slot for a filling block
    c.complete_store(spec)
    assert c.lookup(a).num_blocks == 4


def test_a_filling_promotion_leaves_the_ready_ssd_copy_in_the_plan():
    """The promotion window: a promoted block is read from the SSD until its
    DRAM copy is filled, then from DRAM."""
    c = core("write-back", dram=3, promotion="full")
    a, b = chain(1, 3), chain(2, 3)
    store(c, a)
    store(c, b)                                     # a only on the SSD
    load = c.prepare_load(a, 3)
    c.complete_load(load)
    promo = c.prepare_promotion(a, load.positions(SSD), 0)
    assert promo.num_blocks == 3
    plan = c.lookup(a)
    assert plan.num_blocks == 3 and plan.blocks_from(SSD) == 3    # not the unfilled DRAM slots
    c.complete_store(promo)
    assert c.lookup(a).blocks_from(DRAM) == 3


def test_a_victim_on_its_way_to_the_ssd_stays_readable_until_it_lands():
    backend = LaterBackend({DRAM: 2, SSD: 16}, write_behind=2)
    c = core("write-back", backend=backend)
    a, b = chain(1, 2), chain(2, 2)
    store(c, a)
    slots = c.prepare_load(a, 2)
    c.cancel_load(slots)
    store(c, b)                                     # a evicted, its write queued
    assert [len(j.keys) for j in backend.queued] == [2]
    plan = c.lookup(a)
    assert plan.blocks_from(DRAM) == 2 and plan.slots.tolist() == slots.slots.tolist()
    assert c.lookup(b).blocks_from(DRAM) == 2       # b got the DRAM capacity all the same
    assert backend.free_units(DRAM) == 0
    store(c, a)                                     # a is in DRAM: nothing issued twice
    assert len(backend.queued) == 1
    backend.finish()
    plan = c.lookup(a)
    assert plan.blocks_from(SSD) == 2 and plan.blocks_from(DRAM) == 0
    assert backend.used[DRAM] == 2 and backend.write_behind_room() == 2
    assert c.stats.ssd_write_blocks == 2


def test_a_written_victim_a_reader_holds_leaves_dram_when_the_reader_lets_go():
    backend = LaterBackend({DRAM: 2, SSD: 16}, write_behind=2)
    c = core("write-back", backend=backend)
    a, b = chain(1, 2), chain(2, 2)
    store(c, a)
    store(c, b)
    load = c.prepare_load(a, 2)                     # a reader of the victims' DRAM copies
    assert load.positions(DRAM).tolist() == [0, 1]
    backend.finish()
    assert c.lookup(a).blocks_from(DRAM) == 2       # still the reader's
    assert c.complete_load(load) == 2
    assert c.lookup(a).blocks_from(SSD) == 2 and backend.used[DRAM] == 2
    assert backend.write_behind_room() == 2


def test_past_the_write_behind_a_victim_is_written_from_a_copy_and_a_failed_write_is_a_miss():
    """With one write-behind slot, one of two victims stays readable while
    it is written, the other is written from a copy (counted); when both
    writes fail, both are clean misses and every slot is back."""
    backend = LaterBackend({DRAM: 2, SSD: 16}, write_behind=1)
    c = core("write-back", backend=backend)
    a, b = chain(1, 2), chain(2, 2)
    store(c, a)
    store(c, b)
    assert [(len(j.keys), j.held) for j in backend.queued] == [(1, True), (1, False)]
    assert c.stats.write_behind_full == 1 and c.stats.writes_dropped == 0
    assert c.lookup(a).num_blocks == 1     # block 0 (the shallower) readable, block 1 on its way
    backend.finish(ok=False)
    assert c.lookup(a).num_blocks == 0 and c.stats.ssd_write_failures == 2
    assert backend.used[DRAM] == 2 and backend.write_behind_room() == 1


def test_a_block_removed_while_in_flight_leaves_when_its_write_completes():
    backend = LaterBackend({DRAM: 2, SSD: 16}, write_behind=2)
    c = core("write-back", backend=backend)
    a, b = chain(1, 2), chain(2, 2)
    store(c, a)
    store(c, b)
    assert c.remove(a) == 2                         # both deferred: being written
    backend.finish()
    assert c.lookup(a).num_blocks == 0
    assert backend.used == {Tier.GPU: 0, DRAM: 2, SSD: 0, Tier.REMOTE: 0}


def test_a_write_in_flight_is_not_issued_twice_and_an_evicted_one_stays_readable():
    """Early persistence queues a write; another access issues nothing more.
    Evicted while that write is queued, the block stays readable in DRAM
    (write-behind) until it lands, then it is an SSD block."""
    backend = LaterBackend({DRAM: 2, SSD: 16}, write_behind=2)
    c = core("R1", backend=backend)
    a, b = chain(1, 2), chain(2, 2)
    store(c, a)
    c.touch(a, hits=2)                              # reuse 1: persisted early, queued
    c.touch(a, hits=2)
    assert [len(j.keys) for j in backend.queued] == [2]
    store(c, b)                                     # a evicted while its write is queued
    assert len(backend.queued) == 1 and c.lookup(a).blocks_from(DRAM) == 2
    assert c.lookup(b).blocks_from(DRAM) == 2
    backend.finish()
    assert c.stats.ssd_write_blocks == 2
    assert c.lookup(a).blocks_from(SSD) == 2 and backend.write_behind_room() == 2
