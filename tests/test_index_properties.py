"""Property tests: random operation sequences on the native index agree with
the brute-force reference model (tests/reference_index.py) on every answer and
on the whole state after every step, including hybrid checkpoints, locks, the
metadata budget and salted prefixes."""

from __future__ import annotations

import hashlib

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from budgets import examples

from reference_index import RefIndex
from saria.index import RadixIndex, Tier

TIERS = list(Tier)


def chain_keys(salt: str | None, tokens: tuple[int, ...]) -> list[bytes]:
    """A stand-in chained hash with block size 1: the salt enters block 0."""
    keys, parent = [], b"root"
    for i, tok in enumerate(tokens):
        extra = salt if i == 0 and salt is not None else ""
        parent = hashlib.sha256(parent + bytes([tok]) + extra.encode()).digest()
        keys.append(parent)
    return keys


prompts = st.tuples(
    st.sampled_from([None, "tenant-a", "tenant-b"]),
    st.lists(st.integers(0, 2), min_size=1, max_size=7).map(tuple),
)


def native_snapshot(ix: RadixIndex) -> dict[bytes, tuple]:
    d = ix.dump()
    key_of = {int(i): bytes(k) for i, k in zip(d["index"], d["keys"])}
    out = {}
    for j, idx in enumerate(d["index"]):
        parent = int(d["parent"][j])
        tiers = tuple((t, int(d["slots"][j][t])) for t in range(len(Tier)) if d["tiers"][j] >> t & 1)
        ckpt = tuple((t, int(d["ckpt_slots"][j][t])) for t in range(len(Tier)) if d["ckpt"][j] >> t & 1)
        out[key_of[int(idx)]] = (
            key_of[parent] if parent else None, int(d["depth"][j]), tiers, ckpt,
            int(d["reuse"][j]), int(d["hits"][j]), int(d["dram_evictions"][j]),
            int(d["session"][j]), int(d["lock"][j]), float(d["last_access"][j]),
            int(d["filling"][j]), int(d["ckpt_filling"][j]))
    return out


class IndexMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.next_slot = 0

    @initialize(max_blocks=st.integers(1, 24), hybrid=st.booleans())
    def setup(self, max_blocks: int, hybrid: bool) -> None:
        self.ix = RadixIndex(max_blocks, hybrid=hybrid)
        self.ref = RefIndex(max_blocks, hybrid=hybrid)

    def both(self, native_call, ref_call):
        """Runs one operation on both; they must agree on raising ValueError."""
        try:
            expected = ref_call()
        except ValueError:
            before = native_snapshot(self.ix)
            try:
                native_call()
            except ValueError:
                assert native_snapshot(self.ix) == before, "failed call changed the index"
                return None, None
            raise AssertionError("reference rejected a call the index accepted")
        return native_call(), expected

    @rule(dt=st.sampled_from([0.0, 0.5, 1.0, 3.0]))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule(p=prompts)
    def stale_clock(self, p) -> None:
        """A reading older than the last one counts as the last one."""
        keys = chain_keys(*p)
        got, want = self.both(lambda: self.ix.touch(keys, now=self.now - 2.0),
                              lambda: self.ref.touch(keys, 0, 0, self.now - 2.0))
        assert got == want

    @rule(p=prompts)
    def match(self, p) -> None:
        keys = chain_keys(*p)
        plan = self.ix.match(keys)
        r = self.ref.match(keys)
        assert plan.num_known == r["n_known"]
        assert plan.num_available == r["n_avail"]
        assert plan.tier_by_tier_blocks == r["tbt"]
        assert plan.num_blocks == r["usable"]
        assert list(plan.tiers) == r["tiers"]
        assert list(plan.slots) == r["slots"]
        assert list(plan.masks) == r["masks"]
        assert list(plan.checkpoint_masks) == r["ckpt_masks"]
        known, held, held_ckpt = self.ix.residency(keys)
        assert (known, list(held), list(held_ckpt)) == (r["n_known"], r["held"], r["held_ckpt"])
        h = self.ix.history(keys)
        assert list(zip(h["reuse"], h["hits"], h["dram_evictions"], h["last_access"])) == \
            self.ref.history(keys)
        assert list(h["tiers"]) == r["masks"] and list(h["checkpoints"]) == r["ckpt_masks"]
        slots, which = self.ix.slots_in(keys, *TIERS)
        assert list(which) == [min((t for t in TIERS if m & t.bit), default=-1)
                               for m in r["masks"]]
        if r["ckpt_tier"] >= 0:
            assert plan.checkpoint is not None
            assert (plan.checkpoint.tier, plan.checkpoint.slot) == (r["ckpt_tier"], r["ckpt_slot"])
        else:
            assert plan.checkpoint is None
        # Segments tile the plan in order and alternate tiers.
        pos = 0
        for s in plan.segments:
            assert s.start == pos and s.end > s.start
            assert all(plan.tiers[s.start:s.end] == s.tier)
            pos = s.end
        assert pos == plan.num_blocks

    @rule(p=prompts, hits=st.integers(0, 8), ckpt_at=st.integers(0, 8))
    def touch(self, p, hits: int, ckpt_at: int) -> None:
        keys = chain_keys(*p)
        got, want = self.both(
            lambda: self.ix.touch(keys, hits=hits, checkpoint_at=ckpt_at, now=self.now),
            lambda: self.ref.touch(keys, hits, ckpt_at, self.now))
        assert got == want

    @rule(p=prompts, hits=st.integers(0, 8), ckpt_at=st.integers(0, 8))
    def touch_history(self, p, hits: int, ckpt_at: int) -> None:
        """One walk for a touch and its history: the same as touch then history."""
        keys = chain_keys(*p)
        got, want = self.both(
            lambda: self.ix.touch_history(keys, hits=hits, checkpoint_at=ckpt_at, now=self.now),
            lambda: self.ref.touch_history(keys, hits, ckpt_at, self.now))
        if want is None:
            return
        m, h = got
        assert m == want[0]
        assert list(zip(h["reuse"], h["hits"], h["dram_evictions"], h["last_access"],
                        h["previous_access"], h["tiers"], h["checkpoints"], h["filling"])) == \
            want[1]

    @rule(p=prompts)
    def match_lock(self, p) -> None:
        """A lookup that locks what it found: match, then lock of its blocks."""
        keys = chain_keys(*p)
        plan = self.ix.match(keys, lock=True)
        r = self.ref.match_lock(keys)
        assert (plan.num_known, plan.num_blocks, list(plan.masks), list(plan.slots)) == \
            (r["n_known"], r["usable"], r["masks"], r["slots"])

    @rule(tier=st.sampled_from(TIERS), count=st.integers(0, 5), p=prompts,
          n=st.integers(0, 7), unpin=st.booleans(),
          older_than=st.sampled_from([None, 0.0, 1.0]))
    def evict_pinned(self, tier, count: int, p, n: int, unpin: bool, older_than) -> None:
        """Pinned eviction: lock, evict and (with unpin) unlock in one call;
        an unknown block in the pin makes the call invalid."""
        pin = chain_keys(*p)[:n]
        cutoff = float("inf") if older_than is None else self.now - older_than
        got, want = self.both(
            lambda: self.ix.evict(tier, count, older_than=older_than, now=self.now, pin=pin,
                                  unpin=unpin),
            lambda: self.ref.evict_pinned(int(tier), count, cutoff, self.now, pin, unpin))
        if want is None:
            return
        assert [(bytes(k), int(s)) for k, s in zip(got.keys, got.slots)] == \
            [(w["key"], w["slot"]) for w in want]

    @rule(p=prompts, tier=st.sampled_from(TIERS), data=st.data(), session=st.integers(0, 3),
          filling=st.booleans(), lock=st.booleans())
    def add(self, p, tier, data, session: int, filling: bool, lock: bool) -> None:
        """With `lock` the store pins what it placed: add then lock."""
        keys = chain_keys(*p)
        where = sorted(data.draw(st.sets(st.integers(0, len(keys)), max_size=len(keys))))
        slots = list(range(self.next_slot, self.next_slot + len(where)))
        self.next_slot += len(where)
        got, want = self.both(
            lambda: self.ix.add(keys, tier, slots, where=where, session=session,
                                filling=filling, lock=lock, now=self.now),
            lambda: self.ref.add(keys, int(tier), where, slots, session, self.now, filling,
                                 lock))
        assert got == want

    @rule(p=prompts, tier=st.sampled_from(TIERS), free=st.integers(0, 8),
          session=st.integers(0, 3))
    def place(self, p, tier, free: int, session: int) -> None:
        """A slotless tier's placement (the replay's GPU prefix cache) in one
        call: residency, pinned eviction when short of room, add."""
        keys = chain_keys(*p)
        got, want = self.both(
            lambda: self.ix.place(keys, tier, free=free, session=session, now=self.now),
            lambda: self.ref.place(keys, int(tier), free, session, self.now))
        assert got == want

    @rule(tier=st.sampled_from(TIERS), data=st.data())
    def set_ready(self, tier, data) -> None:
        pool = sorted(k for k, n in self.ref.nodes.items() if n.tiers) + [b"\x03" * 32]
        keys = data.draw(st.lists(st.sampled_from(pool), max_size=3))
        self.both(lambda: self.ix.set_ready(keys, tier, now=self.now),
                  lambda: self.ref.set_ready(keys, int(tier), self.now))

    @rule(data=st.data())
    def hold(self, data) -> None:
        pool = sorted(self.ref.nodes) + [b"\x04" * 32]
        keys = data.draw(st.lists(st.sampled_from(pool), max_size=3))
        self.both(lambda: self.ix.hold(keys), lambda: self.ref.hold(keys))

    @rule(data=st.data())
    def release(self, data) -> None:
        pool = sorted(k for k, n in self.ref.nodes.items() if n.lock) + [b"\x05" * 32]
        keys = data.draw(st.lists(st.sampled_from(pool), max_size=3))
        got, want = self.both(lambda: list(self.ix.release(keys, now=self.now)),
                              lambda: self.ref.release(keys, self.now))
        assert got == want

    @rule(tier=st.sampled_from(TIERS), data=st.data())
    def add_existing(self, tier, data) -> None:
        pool = sorted(self.ref.nodes) + [b"\x02" * 32]  # an unknown key is invalid
        keys = data.draw(st.lists(st.sampled_from(pool), max_size=4))
        slots = list(range(self.next_slot, self.next_slot + len(keys)))
        self.next_slot += len(keys)
        self.both(lambda: self.ix.add_existing(keys, tier, slots, now=self.now),
                  lambda: self.ref.add_existing(keys, int(tier), slots, self.now))

    @rule(tier=st.sampled_from(TIERS), data=st.data())
    def remove(self, tier, data) -> None:
        resident = sorted(k for k, n in self.ref.nodes.items() if int(tier) in n.tiers)
        pool = resident + [b"\x01" * 32]  # an unknown key makes the call invalid
        keys = data.draw(st.lists(st.sampled_from(pool), max_size=4)) if pool else []
        got, want = self.both(lambda: list(self.ix.remove(keys, tier, now=self.now)),
                              lambda: self.ref.remove(keys, int(tier), self.now))
        assert got == want

    @rule(tier=st.sampled_from(TIERS), count=st.integers(0, 5),
          older_than=st.sampled_from([None, 0.0, 1.0, 4.0]))
    def evict(self, tier, count: int, older_than) -> None:
        ev = self.ix.evict(tier, count, older_than=older_than, now=self.now)
        cutoff = float("inf") if older_than is None else self.now - older_than
        want = self.ref.evict(int(tier), count, cutoff, self.now)
        got = [dict(key=bytes(ev.keys[i]), slot=int(ev.slots[i]), reuse=int(ev.reuse[i]),
                    hits=int(ev.hits[i]), dram_evictions=int(ev.dram_evictions[i]),
                    depth=int(ev.depth[i]), tiers_after=int(ev.tiers_after[i]),
                    child_tiers=int(ev.child_tiers[i]), ckpt=int(ev.checkpoints[i]))
               for i in range(len(ev))]
        assert got == want

    @rule(p=prompts, n=st.integers(0, 7))
    def lock(self, p, n: int) -> None:
        keys = chain_keys(*p)[:n]
        self.both(lambda: self.ix.lock(keys), lambda: self.ref.lock(keys))

    @rule(p=prompts, n=st.integers(0, 7))
    def unlock(self, p, n: int) -> None:
        keys = chain_keys(*p)[:n]
        self.both(lambda: self.ix.unlock(keys, now=self.now),
                  lambda: self.ref.unlock(keys, self.now))

    def path_to(self, key: bytes) -> list[bytes]:
        path = []
        while key is not None:
            path.append(key)
            key = self.ref.nodes[key].parent
        return path[::-1]

    @rule(data=st.data())
    def lock_known(self, data) -> None:
        """Locks the path to a tracked block (ghosts included), so that locked
        blocks meet eviction and the metadata budget."""
        if not self.ref.nodes:
            return
        key = data.draw(st.sampled_from(sorted(self.ref.nodes)))
        keys = self.path_to(key)
        self.both(lambda: self.ix.lock(keys), lambda: self.ref.lock(keys))

    @rule(data=st.data())
    def unlock_known(self, data) -> None:
        locked = sorted(k for k, n in self.ref.nodes.items() if n.lock)
        if not locked:
            return
        keys = self.path_to(data.draw(st.sampled_from(locked)))
        self.both(lambda: self.ix.unlock(keys, now=self.now),
                  lambda: self.ref.unlock(keys, self.now))

    @rule(p=prompts, pos=st.integers(0, 6), tier=st.sampled_from(TIERS), filling=st.booleans())
    def checkpoint_add(self, p, pos: int, tier, filling: bool) -> None:
        keys = chain_keys(*p)
        key = keys[min(pos, len(keys) - 1)]
        slot = self.next_slot
        self.next_slot += 1
        self.both(lambda: self.ix.add_checkpoint(key, tier, slot, filling=filling, now=self.now),
                  lambda: self.ref.ckpt_add(key, int(tier), slot, self.now, filling))

    @rule(p=prompts, pos=st.integers(0, 6), tier=st.sampled_from(TIERS))
    def checkpoint_ready(self, p, pos: int, tier) -> None:
        keys = chain_keys(*p)
        key = keys[min(pos, len(keys) - 1)]
        self.both(lambda: self.ix.set_checkpoint_ready(key, tier, now=self.now),
                  lambda: self.ref.ckpt_set_ready(key, int(tier), self.now))

    @rule(p=prompts, pos=st.integers(0, 6), tier=st.sampled_from(TIERS))
    def checkpoint_remove(self, p, pos: int, tier) -> None:
        keys = chain_keys(*p)
        key = keys[min(pos, len(keys) - 1)]
        got, want = self.both(lambda: self.ix.remove_checkpoint(key, tier, now=self.now),
                              lambda: self.ref.ckpt_remove(key, int(tier), self.now))
        assert got == want

    @rule(tier=st.sampled_from(TIERS), count=st.integers(0, 3),
          older_than=st.sampled_from([None, 1.0]))
    def checkpoint_evict(self, tier, count: int, older_than) -> None:
        ev = self.ix.evict_checkpoints(tier, count, older_than=older_than, now=self.now)
        cutoff = float("inf") if older_than is None else self.now - older_than
        want = self.ref.ckpt_evict(int(tier), count, cutoff, self.now)
        assert [(bytes(k), int(s)) for k, s in zip(ev.keys, ev.slots)] == \
            [(w["key"], w["slot"]) for w in want]

    @invariant()
    def same_state(self) -> None:
        if not hasattr(self, "ix"):
            return
        self.ix.check()
        assert native_snapshot(self.ix) == self.ref.snapshot()
        assert len(self.ix) == len(self.ref.nodes)


IndexMachine.TestCase.settings = settings(
    max_examples=examples(300), stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestIndexAgainstReference = IndexMachine.TestCase


def test_salts_never_share_blocks() -> None:
    """Same tokens under two salts: no block of one is ever a hit for the other."""
    ix = RadixIndex(1000)
    tokens = (1, 2, 0, 1, 2)
    a, b = chain_keys("tenant-a", tokens), chain_keys("tenant-b", tokens)
    ix.add(a, Tier.DRAM, np.arange(len(a)))
    assert ix.match(a).num_blocks == len(a)
    assert ix.match(b).num_blocks == 0
    assert ix.match(b).num_known == 0
    assert not set(a) & set(b)
