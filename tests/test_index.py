"""Behaviour of the radix index on hand-made cases, and its error handling."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from budgets import examples

from saria.index import KeySet, RadixIndex, Tier, VirtualClock
from saria.keys import BlockHasher, keys_to_array

B = 4  # tokens per block


def prompt_keys(tokens, salt=None, algo="sha256_cbor"):
    return keys_to_array(BlockHasher(B, algo, seed="test").block_keys(tokens, cache_salt=salt))


TOKENS = list(range(40))  # 10 blocks


def test_interleaved_plan_is_recovered_and_beats_tier_by_tier():
    ix = RadixIndex(100)
    k = prompt_keys(TOKENS)
    ix.add(k, Tier.DRAM, np.arange(10))
    ix.remove(k[4:8], Tier.DRAM)
    ix.add(k[:8], Tier.SSD, [40, 41, 42, 43], where=[4, 5, 6, 7])
    plan = ix.match(k)
    assert str(plan) == "DRAM[0:4] SSD[4:8] DRAM[8:10]"
    assert plan.num_blocks == 10 and plan.tier_by_tier_blocks == 4
    assert list(plan.slots) == [0, 1, 2, 3, 40, 41, 42, 43, 8, 9]
    assert plan.blocks_from(Tier.SSD) == 4 and plan.blocks_from(Tier.DRAM) == 6


def test_fastest_tier_wins_and_gap_ends_the_plan():
    ix = RadixIndex(100)
    k = prompt_keys(TOKENS)
    ix.add(k, Tier.SSD, np.arange(100, 110))
    ix.add(k[:3], Tier.DRAM, [0, 1, 2])
    ix.add(k[:3], Tier.GPU, [7], where=[1])
    plan = ix.match(k)
    assert str(plan) == "DRAM[0:1] GPU[1:2] DRAM[2:3] SSD[3:10]"
    assert plan.tier_by_tier_blocks == 3  # DRAM holds block 0, and the run ends at 3
    ix.remove(k[5:6], Tier.SSD)           # a hole: block 5 is now metadata only
    plan = ix.match(k)
    assert plan.num_blocks == 5 and plan.num_known == 10 and plan.num_available == 5


def test_remote_residency_is_a_fourth_tier_in_the_plan():
    """The cluster tier (REMOTE) is one more medium: the slowest, so a plan
    takes a block from it only where no local tier holds a ready copy; a
    filling REMOTE copy (a load whose bytes are still being verified) is in
    no reader's plan; dropping it leaves the local copies."""
    ix = RadixIndex(100)
    k = prompt_keys(TOKENS)
    ix.add(k, Tier.REMOTE, np.zeros(10, np.int64))
    ix.add(k[:4], Tier.DRAM, [0, 1, 2, 3])
    ix.add(k[:7], Tier.SSD, [50, 51], where=[5, 6])
    plan = ix.match(k)
    assert str(plan) == "DRAM[0:4] REMOTE[4:5] SSD[5:7] REMOTE[7:10]"
    assert plan.blocks_from(Tier.REMOTE) == 4 and plan.tier_by_tier_blocks == 4
    ix.remove(k[7:], Tier.REMOTE)                      # the cluster lost them
    ix.add(k[:8], Tier.REMOTE, [0], where=[7], filling=True)
    assert str(ix.match(k)) == "DRAM[0:4] REMOTE[4:5] SSD[5:7]"
    ix.set_ready(k[7:8], Tier.REMOTE)
    assert ix.match(k).num_blocks == 8
    ix.remove(k[:5], Tier.REMOTE)
    assert str(ix.match(k)) == "DRAM[0:4]"
    assert ix.stats().resident["REMOTE"] == 3  # blocks 5, 6, 7


def test_eviction_is_lru_and_leaf_first():
    clock = VirtualClock()
    ix = RadixIndex(100, clock=clock)
    a = prompt_keys(TOKENS[:12])                 # 3 blocks
    b = prompt_keys(TOKENS[:8] + [99] * 4)       # shares 2 blocks, diverges at block 2
    ix.add(a, Tier.DRAM, [0, 1, 2])
    clock.advance(1)
    ix.add(b, Tier.DRAM, [3], where=[2])
    clock.advance(1)
    ix.touch(a, hits=3)  # a is now the most recent path
    ev = ix.evict(Tier.DRAM, 5)
    # b's leaf first (oldest), then a's path deepest first; shared blocks last.
    order = [bytes(x) for x in ev.keys]
    assert order == [bytes(b[2]), bytes(a[2]), bytes(a[1]), bytes(a[0])]
    assert list(ev.dram_evictions) == [1, 1, 1, 1]
    assert list(ev.tiers_after) == [0, 0, 0, 0]
    assert ix.stats().resident["DRAM"] == 0


def test_recency_cutoff_and_history_survive_eviction():
    clock = VirtualClock()
    ix = RadixIndex(100, clock=clock)
    k = prompt_keys(TOKENS[:8])
    ix.add(k, Tier.DRAM, [0, 1], session=7)
    clock.advance(10)
    assert len(ix.evict(Tier.DRAM, 2, older_than=30)) == 0  # touched 10 s ago
    clock.advance(30)
    ix.touch(k, hits=2)
    clock.advance(5)
    assert len(ix.evict(Tier.DRAM, 2, older_than=30)) == 0
    ev = ix.evict(Tier.DRAM, 2, older_than=4)
    assert len(ev) == 2
    # Metadata-only now, with its history kept: re-adding keeps the counters.
    plan = ix.match(k)
    assert plan.num_blocks == 0 and plan.num_known == 2
    ix.touch(k)
    ix.add(k, Tier.DRAM, [5, 6])
    d = ix.dump()
    assert sorted(d["reuse"]) == [2, 2] and sorted(d["hits"]) == [1, 1]
    assert sorted(d["dram_evictions"]) == [1, 1] and sorted(d["session"]) == [7, 7]


def test_locked_blocks_are_never_evicted():
    ix = RadixIndex(100)
    k = prompt_keys(TOKENS[:16])
    ix.add(k, Tier.DRAM, np.arange(4))
    ix.lock(k[:4])
    assert len(ix.evict(Tier.DRAM, 10)) == 0
    ix.unlock(k[:4])
    assert len(ix.evict(Tier.DRAM, 10)) == 4
    with pytest.raises(ValueError, match="not locked"):
        ix.unlock(k[:1])


def test_metadata_budget_drops_oldest_childless_ghosts_only():
    ix = RadixIndex(6)
    a, b = prompt_keys(TOKENS[:16]), prompt_keys(TOKENS[16:32])
    ix.add(a, Tier.DRAM, np.arange(4))
    ix.evict(Tier.DRAM, 4)                # a: 4 ghosts
    ix.add(b, Tier.DRAM, np.arange(4))    # 8 nodes > 6: two of a's ghosts go, leaf first
    assert len(ix) == 6 and ix.stats().ghosts_dropped == 2
    assert ix.match(a).num_known == 2
    # A locked, childless ghost is kept even over budget.
    ix.lock(a[:2])
    ix.evict(Tier.DRAM, 4)
    c = prompt_keys(TOKENS[32:40])
    ix.add(c, Tier.DRAM, [0, 1])
    assert ix.match(a).num_known == 2
    ix.check()


def test_budget_is_soft_for_resident_blocks():
    ix = RadixIndex(2)
    k = prompt_keys(TOKENS)
    ix.add(k, Tier.DRAM, np.arange(10))
    assert len(ix) == 10  # resident blocks are always tracked


def test_hybrid_hit_ends_at_deepest_checkpoint():
    ix = RadixIndex(100, hybrid=True)
    k = prompt_keys(TOKENS)
    ix.add(k, Tier.DRAM, np.arange(10))
    assert ix.match(k).num_blocks == 0  # no checkpoint, no usable hit
    ix.add_checkpoint(bytes(k[3]), Tier.SSD, 500)
    ix.add_checkpoint(bytes(k[6]), Tier.DRAM, 600)
    plan = ix.match(k)
    assert plan.num_blocks == 7 and plan.num_available == 10
    assert (plan.checkpoint.boundary, plan.checkpoint.tier, plan.checkpoint.slot) == (7, Tier.DRAM, 600)
    ix.remove(k[5:6], Tier.DRAM)  # the KV before the deeper checkpoint is gone
    plan = ix.match(k)
    assert plan.num_blocks == 4 and plan.checkpoint.slot == 500
    # The checkpoint shares its block's history.
    ix.touch(k, hits=4, checkpoint_at=4)
    d = ix.dump()
    row = [i for i, key in enumerate(d["keys"]) if bytes(key) == bytes(k[3])][0]
    assert d["reuse"][row] == 1 and d["hits"][row] == 1
    assert list(ix.evict_checkpoints(Tier.DRAM, 5).slots) == [600]


def test_checkpoints_need_a_hybrid_index():
    ix = RadixIndex(10)
    k = prompt_keys(TOKENS[:4])
    ix.add(k, Tier.DRAM, [0])
    with pytest.raises(ValueError, match="hybrid"):
        ix.add_checkpoint(bytes(k[0]), Tier.DRAM, 1)


def test_salted_prompts_share_nothing_and_same_salt_shares_all():
    ix = RadixIndex(100)
    a1, a2 = prompt_keys(TOKENS, salt="a"), prompt_keys(TOKENS, salt="a")
    b = prompt_keys(TOKENS, salt="b")
    ix.add(a1, Tier.DRAM, np.arange(10))
    assert ix.match(a2).num_blocks == 10
    assert ix.match(b).num_known == 0


def test_xxhash_keys_are_padded_and_indexable():
    with pytest.warns(UserWarning):
        k = prompt_keys(TOKENS, algo="xxhash_cbor")
    assert k.shape == (10, 32) and not k[:, 16:].any()
    ix = RadixIndex(100)
    ix.add(k, Tier.DRAM, np.arange(10))
    assert ix.match(k).num_blocks == 10


# ------------------------------------------------------------------ errors

def _state(ix: RadixIndex):
    d = ix.dump()
    return {k: v.tolist() for k, v in d.items()}


@pytest.fixture
def loaded():
    ix = RadixIndex(100)
    k = prompt_keys(TOKENS)
    ix.add(k, Tier.DRAM, np.arange(10))
    return ix, k


@pytest.mark.parametrize("call, exc, msg", [
    (lambda ix, k: ix.add([b"short"], Tier.DRAM, [0]), ValueError, "key 0 has 5 bytes"),
    (lambda ix, k: ix.add(["text"], Tier.DRAM, [0]), TypeError, "key 0 must be bytes"),
    (lambda ix, k: ix.match(b"x" * 32), TypeError, "not a single bytes"),
    (lambda ix, k: ix.match(k.astype(np.int64)), ValueError, "dtype uint8"),
    (lambda ix, k: ix.match(k[:, :16]), ValueError, r"shape \(n, 32\)"),
    (lambda ix, k: ix.add(k, "HBM", np.arange(10)), ValueError, "unknown tier 'HBM'"),
    (lambda ix, k: ix.add(k, 5, np.arange(10)), ValueError, "unknown tier 5"),
    (lambda ix, k: ix.evict(Tier.DRAM, -1), ValueError, "count must not be negative"),
    (lambda ix, k: ix.evict(Tier.DRAM, 1, older_than=-3), ValueError, "older_than"),
    (lambda ix, k: ix.add(k, Tier.SSD, [-1] * 10), ValueError, "negative"),
    (lambda ix, k: ix.add(k, Tier.SSD, np.arange(9)), ValueError, "9 slots for 10 positions"),
    (lambda ix, k: ix.add(k, Tier.DRAM, np.arange(10)), ValueError, "already resident"),
    (lambda ix, k: ix.add(k, Tier.SSD, [1, 2], where=[3, 3]), ValueError, "ascending"),
    (lambda ix, k: ix.add(k, Tier.SSD, [1], where=[10]), ValueError, "outside"),
    (lambda ix, k: ix.remove(k[:2], Tier.SSD), ValueError, "not resident in tier 2"),
    (lambda ix, k: ix.remove(np.vstack([k[:1], k[:1]]), Tier.DRAM), ValueError, "listed twice"),
    (lambda ix, k: ix.touch(k, hits=11), ValueError, "exceeds"),
    (lambda ix, k: ix.touch(k, hits=True), TypeError, "hits must be an int"),
    (lambda ix, k: ix.lock(prompt_keys(TOKENS, salt="z")), ValueError, "not in the index"),
    (lambda ix, k: ix.touch(k, now="soon"), TypeError, "now must be a number"),
    (lambda ix, k: ix.add(k, Tier.SSD, np.arange(10), session=-2), ValueError, "session"),
])
def test_bad_input_raises_and_leaves_the_index_unchanged(loaded, call, exc, msg):
    ix, k = loaded
    before = _state(ix)
    with pytest.raises(exc, match=msg):
        call(ix, k)
    assert _state(ix) == before
    ix.check()


def test_key_under_a_different_prefix_is_rejected(loaded):
    ix, k = loaded
    other = prompt_keys(TOKENS, salt="other")
    # k[5] placed after a different block 0 would make the tree a lie.
    mixed = np.vstack([other[:1], k[5:6]])
    before = _state(ix)
    with pytest.raises(ValueError, match="different prefix"):
        ix.add(mixed, Tier.SSD, [1, 2])
    assert _state(ix) == before


@pytest.mark.parametrize("bad", [-1, 0, 1.5, "10"])
def test_bad_budget(bad):
    with pytest.raises((ValueError, TypeError), match="max_blocks"):
        RadixIndex(bad)


def test_threads_share_one_index():
    ix = RadixIndex(10_000)
    errors = []

    def worker(w: int) -> None:
        try:
            for r in range(50):
                k = prompt_keys([w * 1000 + r] + TOKENS[:15])
                plan = ix.match(k)
                ix.touch(k, hits=plan.num_blocks)
                missing = np.arange(plan.num_known, 4)
                if missing.size:
                    ix.add(k, Tier.DRAM, missing + w * 1000 + r * 4, where=missing)
                ix.evict(Tier.DRAM, 1)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    ix.check()
    assert len(ix) == 4 * 50 * 4


def test_virtual_clock_never_goes_back():
    c = VirtualClock(5)
    c.advance_to(7)
    with pytest.raises(ValueError):
        c.advance_to(6)
    with pytest.raises(ValueError):
        c.advance(-1)
    assert c() == 7


def test_path_handle_never_outlives_a_dropped_node():
    """The core keeps the last walked path (keys and nodes) for the next verb
    on the same prefix. Here the nodes of path A are dropped by the metadata
    budget and their ids reused by path B: a walk of A must not see B's nodes."""
    ix = RadixIndex(3)
    a, b = prompt_keys(TOKENS[:12]), prompt_keys(TOKENS[:12], salt="other")
    ix.add(a, Tier.DRAM, [0, 1, 2])
    assert ix.match(a).num_blocks == 3  # the handle now holds A's nodes
    ix.remove(a, Tier.DRAM)             # A becomes metadata only
    ix.add(b, Tier.DRAM, [3, 4, 5])     # the budget drops A; B takes its node ids
    plan = ix.match(a)
    assert plan.num_known == 0 and plan.num_blocks == 0
    assert ix.match(b).num_blocks == 3
    ix.check()


def test_path_handle_follows_prefixes_extensions_and_divergence():
    """Verbs on prefixes and extensions of one request's keys, and on a path
    that leaves it midway, answer as fresh walks."""
    ix = RadixIndex(100)
    k = prompt_keys(TOKENS)                    # 10 blocks
    other = prompt_keys(TOKENS[:20] + [99] * 20)  # shares 5 blocks, then differs
    ix.add(k[:4], Tier.DRAM, [0, 1, 2, 3])
    assert ix.match(k).num_known == 4          # the handle stops at block 4
    ix.add(k[:7], Tier.SSD, [10, 11, 12], where=[4, 5, 6])  # extends it
    assert ix.match(k[:2]).num_blocks == 2
    assert ix.match(k).num_blocks == 7
    ix.lock(k[:7])
    assert ix.evict(Tier.DRAM, 4).keys.shape[0] == 0  # all locked
    assert ix.match(other).num_known == 5
    ix.add(other, Tier.DRAM, np.arange(20, 25), where=range(5, 10))
    ix.unlock(k[:7])
    assert ix.residency(k)[0] == 7 and ix.residency(other)[0] == 10
    ix.check()


def _fresh_walk(ix: RadixIndex, keys: np.ndarray) -> tuple[int, int]:
    """(known, available) blocks of `keys` from a dump: a walk with no handle."""
    d = ix.dump()
    key_of = {int(i): bytes(k) for i, k in zip(d["index"], d["keys"])}
    node = {bytes(k): (key_of.get(int(p)), int(t) & ~int(f))
            for k, p, t, f in zip(d["keys"], d["parent"], d["tiers"], d["filling"])}
    known = avail = 0
    parent = None
    for k in map(bytes, keys):
        if k not in node or node[k][0] != parent:
            break
        known += 1
        avail += avail == known - 1 and node[k][1] != 0
        parent = k
    return known, avail


def test_saved_handles_serve_interleaved_sessions_as_fresh_walks():
    """Requests of many sessions interleave: a walk that leaves the current
    handle takes the saved one sharing the most with its keys. Every answer
    must be a fresh walk's -- with more sessions than saved handles, with
    paths grown since they were saved, and after the budget dropped nodes."""
    rng = np.random.default_rng(7)
    ix = RadixIndex(120)
    # 12 sessions (more than the 8 saved handles), 3 sharing each opening
    sessions = [prompt_keys([s // 3] * 8 + list(rng.integers(0, 50, 56))) for s in range(12)]
    grown = [0] * len(sessions)  # leading blocks of each session made resident so far
    slot = 0
    for step in range(300):
        s = int(rng.integers(0, len(sessions)))
        keys = sessions[s]
        assert (ix.match(keys).num_known, ix.match(keys).num_blocks) == _fresh_walk(ix, keys)
        if step % 5 == 4 and grown[s] >= 3:  # the tail leaves DRAM: history only, droppable
            ix.remove(keys[grown[s] - 3:grown[s]], Tier.DRAM)
            grown[s] -= 3
        else:
            known = ix.residency(keys)[0]
            n = min(keys.shape[0], known + 3)
            pos = [p for p in range(n) if not ix.residency(keys[:p + 1])[1][p:p + 1].any()]
            if pos:
                ix.add(keys[:n], Tier.DRAM, np.arange(slot, slot + len(pos)), where=pos)
                slot += len(pos)
            grown[s] = n
        other = sessions[int(rng.integers(0, len(sessions)))]
        assert ix.residency(other)[0] == _fresh_walk(ix, other)[0]
        ix.check()
    assert ix.stats().ghosts_dropped > 0  # the budget dropped nodes on the way


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.lists(st.integers(0, 40), max_size=30), max_size=12), st.integers(0, 3))
def test_key_set_against_a_python_set(batches, split) -> None:
    """KeySet (the replay's distinct SSD-written and read blocks) answers as a
    Python set of the same keys does, across table growth (a pool of 41 keys
    differing in one byte and several with one first word)."""
    def keys(ids):
        a = np.zeros((len(ids), 32), np.uint8)
        a[:, 31] = ids
        a[:, 0] = np.asarray(ids, np.int64) % 3
        return a
    a, b = KeySet(), KeySet()
    ra, rb, order = set(), set(), []
    for i, ids in enumerate(batches):
        target, ref = (a, ra) if i % 4 != split else (b, rb)
        new = [k for k in dict.fromkeys(bytes(k) for k in keys(ids)) if k not in ref]
        assert target.add(keys(ids)) == len(new)
        ref.update(new)
        if target is a:
            order += new
    assert len(a) == len(ra) and len(b) == len(rb)
    assert [bytes(k) for k in a.keys()] == order
    assert a.count_absent_from(b) == len(ra - rb)
    probe = keys(list(range(41)))
    assert list(a.contains(probe)) == [bytes(k) in ra for k in probe]
    big = KeySet()  # past the first table size (1024 entries at load 1/2)
    many = np.random.default_rng(0).integers(0, 256, (5000, 32), dtype=np.uint8)
    assert big.add(many) == 5000 and big.add(many[::7]) == 0 and len(big) == 5000
    assert big.contains(many).all() and not big.contains(probe).any()
