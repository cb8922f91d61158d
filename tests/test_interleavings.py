"""Never wrong KV, under every interleaving: randomized schedules over the real tiers.

A ``TieredCache`` over the real DRAM pool and the O_DIRECT SSD store, with
SSD writes queued until the schedule lands them (``write_mode="manual"``:
the writer thread's own code, run when the test says). Requests share
prefixes; each one's load is read some steps after it was prepared, its
store slots are filled some steps later and completed later still -- or the
fill fails, a copy times out, an SSD write or read fails -- for every
admission policy, both promotion modes, and hybrid checkpoints. Hypothesis
draws the schedules.

What must hold at every step, whatever the order:

* every byte a load returns is its block's own bytes (``synthetic_rows`` of
  its key, as ``saria replay --mode real`` uses), every state checkpoint a
  load returns is its own;
* every block the SSD acknowledged and the index still lists reads back, and
  after a restart on the same drive every one of them is found again;
* nothing leaks: once the schedule drains, every DRAM slot and SSD slot is
  the index's, and the write-behind reserve is whole again.

The test fails without the readiness rule: with ``CacheManager._allocate``
adding its slots as ready (``filling=False``), loads read unfilled slots and
early persistence writes them to the SSD (see the closing note of issue 19).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from budgets import examples

from saria.index import Tier
from saria.keys import BlockHasher, keys_to_array
from saria.runtime import CacheConfig, TieredCache
from saria.sim.real import synthetic_rows, synthetic_state
from saria.tiers.ssd import slot_bytes_for

DRAM, SSD = Tier.DRAM, Tier.SSD
BLOCK = 4096
TOKENS = 4                      # tokens per block (the keys only need a chain)
HASHER = BlockHasher(TOKENS, seed="interleavings")
POLICIES = ["dram-only", "full-duplicate", "write-back", "saria", "E2", "R2", "E2+R2",
            "hicache-selective", "kvbm-filter", "budget"]
EXAMPLES = 12  # per combo, every combo alike (x10 under the long profile: tests/budgets.py)


def prompts() -> list[np.ndarray]:
    """Key chains that share prefixes: 3 roots, each with branches."""
    rng = np.random.default_rng(7)
    out = []
    for root in range(3):
        base = [root * 10_000 + t for t in range(TOKENS * int(rng.integers(2, 6)))]
        for branch in range(4):
            tail = [root * 10_000 + 5_000 + branch * 100 + t
                    for t in range(TOKENS * int(rng.integers(0, 5)))]
            out.append(keys_to_array(HASHER.block_keys(base + tail)))
    return out


PROMPTS = prompts()
ALL_KEYS = {bytes(k) for keys in PROMPTS for k in keys}


class Schedule:
    """One randomized run: requests in flight, their specs, the checks."""

    def __init__(self, cache: TieredCache, draw) -> None:
        self.cache = cache
        self.draw = draw
        self.units = cache.cfg.state_units
        self.loads: list[tuple] = []      # (keys, LoadSpec)
        self.stores: list[dict] = []      # {spec, rows, filled, direct}
        self.states: list[dict] = []      # {spec, filled}
        self.verified = 0

    # ---------------------------------------------------------------- steps

    def arrive(self) -> None:
        keys = PROMPTS[self.draw(st.integers(0, len(PROMPTS) - 1))]
        c = self.cache
        plan = c.lookup(keys)
        hit = plan.num_blocks
        c.touch(keys, hits=hit, checkpoint_at=hit if plan.checkpoint is not None else 0)
        self.loads.append((keys, c.prepare_load(keys, hit)))

    def read(self) -> None:
        """A load's copy runs: every block it returns must be its own."""
        keys, spec = self.loads.pop(self.pick(self.loads))
        c = self.cache
        if self.draw(st.integers(0, 9)) == 0:
            c.cancel_load(spec)
            return
        fault = spec.positions(SSD).size and self.draw(st.integers(0, 4)) == 0
        if fault:  # the drive fails this load's read
            c.backend.ssd.inject_failure(0, "read", "EIO", count=1)
        out = np.zeros((spec.num_blocks, BLOCK), np.uint8)
        failed = c.read(spec, out)
        if fault:
            c.backend.ssd.inject_failure(0, "read", "EIO", count=0)
        good = np.setdiff1d(np.arange(spec.num_blocks), failed)
        bad = np.flatnonzero((out[good] != synthetic_rows(spec.path[good], BLOCK)).any(axis=1))
        assert bad.size == 0, f"a load returned wrong bytes for blocks {good[bad].tolist()}"
        self.verified += good.size
        if spec.checkpoint is not None and not failed.size:
            ck = spec.checkpoint
            state = c.backend.read_state(ck.tier, ck.slot, spec.path[ck.boundary - 1])
            if state is not None:
                want = synthetic_state(spec.path[ck.boundary - 1], self.units, BLOCK)
                assert np.array_equal(state, want), "a load returned another block's state"
        served = c.complete_load(spec, failed)
        # The request computes the rest and stores it; SSD hits may be promoted.
        store = c.prepare_store(keys, served, direct=bool(self.draw(st.booleans())))
        self.stores.append({"spec": store, "filled": False,
                            "rows": synthetic_rows(store.keys, BLOCK)})
        ssd = spec.positions(SSD)
        ssd = ssd[ssd < served]
        if ssd.size:
            promo = c.prepare_promotion(keys, ssd, served - ssd.size)
            row_of = {int(p): out[p] for p in ssd}
            rows = np.array([row_of[int(p)] for p in promo.positions]).reshape(-1, BLOCK)
            self.stores.append({"spec": promo, "filled": False, "rows": rows})
        if self.units and len(keys):
            state = c.prepare_checkpoint(keys, keep=served)
            if state is not None:
                self.states.append({"spec": state, "filled": False})

    def fill(self) -> None:
        """A worker copies a store's bytes into its slots (maybe half of them)."""
        todo = [s for s in self.stores + self.states if not s["filled"]]
        if not todo:
            return
        s = todo[self.pick(todo)]
        pool = self.cache.backend.pool
        if "rows" not in s:  # a checkpoint
            h = s["spec"].dram_handle
            if h is not None:
                slots = self.cache.backend.state_slots(h)
                pool.scatter(slots, synthetic_state(s["spec"].path[-1], self.units, BLOCK))
            s["filled"] = True
            return
        spec = s["spec"]
        if self.draw(st.integers(0, 7)) == 0 and spec.num_blocks > 1:  # a copy dies half-way
            pool.scatter(spec.slots[:1], s["rows"][:1])
            s["torn"] = True
        elif spec.num_blocks:
            pool.scatter(spec.slots, s["rows"])
        s["filled"] = True

    def complete(self) -> None:
        """The workers' acks arrive (or the op's deadline passes: a failure)."""
        if self.stores and (not self.states or self.draw(st.booleans())):
            s = self.stores.pop(self.pick(self.stores))
            spec = s["spec"]
            ok = s["filled"] and not s.get("torn") and self.draw(st.integers(0, 9)) > 0
            direct = None
            if spec.direct.size:
                direct = synthetic_rows(spec.direct_keys, BLOCK)
            self.cache.complete_store(spec, success=ok, direct_rows=direct)
        elif self.states:
            s = self.states.pop(self.pick(self.states))
            self.cache.complete_checkpoint(s["spec"], success=s["filled"])

    def land(self) -> None:
        """The SSD writer finishes the oldest queued write (sometimes it fails)."""
        ssd = self.cache.backend.ssd
        if ssd is None:
            return
        fail = self.draw(st.integers(0, 5)) == 0
        if fail:
            ssd.inject_failure(0, "write", "EIO", count=1)
        self.cache.run_writes(self.draw(st.integers(1, 3)))
        if fail:
            ssd.inject_failure(0, "write", "EIO", count=0)
            ssd.revive(0)

    # --------------------------------------------------------------- checks

    def check_ssd(self) -> set[bytes]:
        """Every block the index lists on the SSD reads back as its own."""
        d = self.cache.index.dump()
        on_ssd = (d["tiers"] & SSD.bit) != 0
        keys = d["keys"][on_ssd]
        handles = d["slots"][on_ssd][:, SSD.value].astype(np.int64)
        if keys.shape[0]:
            out = np.zeros((keys.shape[0], BLOCK), np.uint8)
            ok = self.cache.backend.read_ssd(handles, keys, out)
            assert ok.all(), "an acknowledged SSD block failed its read"
            assert np.array_equal(out, synthetic_rows(keys, BLOCK))
        return {bytes(k) for k in keys}

    def drain(self) -> None:
        while self.loads:
            self.read()
        while self.stores or self.states:
            for s in self.stores + self.states:
                s["filled"] = s["filled"] or self.fill_all(s)
            self.complete()
        self.cache.flush()

    def fill_all(self, s) -> bool:
        pool = self.cache.backend.pool
        if "rows" in s and s["spec"].num_blocks and not s.get("torn"):
            pool.scatter(s["spec"].slots, s["rows"])
        elif "rows" not in s and s["spec"].dram_handle is not None:
            pool.scatter(self.cache.backend.state_slots(s["spec"].dram_handle),
                         synthetic_state(s["spec"].path[-1], self.units, BLOCK))
        return True

    def pick(self, items: list) -> int:
        return self.draw(st.integers(0, len(items) - 1))


def make_cache(root, admission: str, promotion: str, hybrid: bool, *, mode="manual"):
    return TieredCache(CacheConfig(
        block_bytes=BLOCK, dram_bytes=12 * BLOCK, ssd_dirs=(str(root),),
        ssd_bytes=4096 + 28 * slot_bytes_for(BLOCK), admission=admission, promotion=promotion,
        promotion_r=0.5, min_victim_age_s=0, write_mode=mode, write_queue=64, write_behind=3,
        state_bytes=2 * BLOCK if hybrid else 0, max_blocks=64, pin=False))


def run_schedule(tmp_path, data, admission: str, promotion: str, hybrid: bool) -> None:
    root = tmp_path / f"ssd-{os.urandom(4).hex()}"
    cache = make_cache(root, admission, promotion, hybrid)
    sched = Schedule(cache, data.draw)
    steps = data.draw(st.lists(st.sampled_from(
        ["arrive", "arrive", "read", "read", "fill", "fill", "complete", "complete", "land"]),
        min_size=10, max_size=90))
    try:
        for step in steps:
            if step == "arrive" or not (sched.loads or sched.stores or sched.states):
                sched.arrive()
            elif step == "read" and sched.loads:
                sched.read()
            elif step == "fill":
                sched.fill()
            elif step == "complete":
                sched.complete()
            elif step == "land":
                sched.land()
            cache.index.check()
        sched.check_ssd()
        sched.drain()
        kept = sched.check_ssd()
        g = cache.gauges()
        st_ = cache.index.stats()
        # nothing leaked: every slot is the index's (staging none, write-behind whole)
        dram_ckpt_slots = 0
        if hybrid:
            d = cache.index.dump()
            dram_ckpt_slots = int(np.count_nonzero(d["ckpt"] & DRAM.bit)) * cache.cfg.state_units
        assert g["dram_used_slots"] == st_.resident["DRAM"] + dram_ckpt_slots
        assert g["dram_write_behind_used"] == 0
        if cache.backend.ssd is not None:
            held = st_.resident["SSD"] + len(cache.backend.recovered)
            if hybrid:
                d = cache.index.dump()
                held += int(np.count_nonzero(d["ckpt"] & SSD.bit)) * cache.cfg.state_units
            assert g["ssd_slots"] - g["ssd_free_slots"] == held
    finally:
        cache.close()
    if cache.backend.ssd is None:
        return
    # A restart on the same drive finds every acknowledged block again, each
    # one verified against its own bytes (a block evicted from the SSD may
    # come back too: its bytes are still its own).
    again = make_cache(root, admission, promotion, hybrid, mode="sync")
    try:
        rec = again.backend.recovered
        assert kept <= set(rec), f"{len(kept - set(rec))} acknowledged blocks lost at restart"
        block_keys = [k for k in rec if k in ALL_KEYS]
        if block_keys:
            keys = np.frombuffer(b"".join(block_keys), np.uint8).reshape(-1, 32)
            out = np.zeros((keys.shape[0], BLOCK), np.uint8)
            ok = again.backend.read_ssd(np.array([rec[k] for k in block_keys]), keys, out)
            assert ok.all() and np.array_equal(out, synthetic_rows(keys, BLOCK))
    finally:
        again.close()


COMBOS = [(a, p, False) for a in POLICIES for p in ("lazy", "full")] + \
    [(a, "lazy", True) for a in ("full-duplicate", "write-back", "saria", "E2+R2")]


@pytest.mark.parametrize("admission,promotion,hybrid", COMBOS,
                         ids=[f"{a}-{p}{'-hybrid' if h else ''}" for a, p, h in COMBOS])
@settings(max_examples=examples(EXAMPLES), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(data=st.data())
def test_every_load_returns_its_own_bytes_under_any_interleaving(tmp_path, data, admission,
                                                                 promotion, hybrid):
    run_schedule(tmp_path, data, admission, promotion, hybrid)


def test_a_superseded_checkpoint_a_load_holds_keeps_its_own_bytes(tmp_path):
    """The shrunk failure of issue 40: a load names prefix A's DRAM checkpoint;
    before it reads the state, a request extending A stores its blocks and its
    deeper checkpoint, which supersedes A's (removed from the index). A's
    handle used to go back at once, so the load read the newer checkpoint's
    state through the reused handle (or a freed one: ``KeyError``). Now the
    handle is parked until the load lets go; no new reader finds it."""
    cache = make_cache(tmp_path / "ssd", "dram-only", "lazy", True)
    units = cache.cfg.state_units
    tokens = list(range(TOKENS * 3))
    a = keys_to_array(HASHER.block_keys(tokens))
    b = keys_to_array(HASHER.block_keys(tokens + list(range(900, 900 + TOKENS * 2))))
    pool = cache.backend.pool

    def store(keys, start):
        spec = cache.prepare_store(keys, start)
        pool.scatter(spec.slots, synthetic_rows(spec.keys, BLOCK))
        cache.complete_store(spec)
        state = cache.prepare_checkpoint(keys, keep=start)
        pool.scatter(cache.backend.state_slots(state.dram_handle),
                     synthetic_state(keys[-1], units, BLOCK))
        cache.complete_checkpoint(state)

    try:
        store(a, 0)
        plan = cache.lookup(a)
        assert plan.num_blocks == 3 and plan.checkpoint is not None
        load = cache.prepare_load(a, plan.num_blocks)
        store(b, 3)                      # supersedes A's checkpoint while the load holds it
        assert cache.lookup(a).checkpoint is None, "a superseded checkpoint is no hit"
        ck = load.checkpoint
        got = cache.backend.read_state(ck.tier, ck.slot, a[-1])
        assert np.array_equal(got, synthetic_state(a[-1], units, BLOCK)), \
            "a load returned another block's state"
        used = cache.gauges()["dram_used_slots"]
        cache.complete_load(load)        # the last holder: the parked slots go back
        assert cache.gauges()["dram_used_slots"] == used - units
        d = cache.index.dump()
        assert cache.gauges()["dram_used_slots"] == cache.index.stats().resident["DRAM"] + \
            int(np.count_nonzero(d["ckpt"] & DRAM.bit)) * units
    finally:
        cache.close()


def test_a_checkpoint_whose_ssd_read_failed_leaves_the_tier(tmp_path):
    """A worker reports a checkpoint's SSD read failed (I/O, checksum): that
    copy leaves the SSD tier and its blocks go back, the hit serves nothing
    past its start, and the next lookup ends at no checkpoint there -- else
    vLLM would retry the same unreadable state at every step."""
    root = tmp_path / "ssd"
    tokens = list(range(TOKENS * 3))
    keys = keys_to_array(HASHER.block_keys(tokens))
    cache = make_cache(root, "full-duplicate", "none", True)
    units = cache.cfg.state_units
    try:
        spec = cache.prepare_store(keys, 0)
        cache.backend.pool.scatter(spec.slots, synthetic_rows(spec.keys, BLOCK))
        cache.complete_store(spec)
        state = cache.prepare_checkpoint(keys, keep=0)
        cache.backend.pool.scatter(cache.backend.state_slots(state.dram_handle),
                                   synthetic_state(keys[-1], units, BLOCK))
        cache.complete_checkpoint(state)
        cache.flush()
    finally:
        cache.close()
    cache = make_cache(root, "full-duplicate", "none", True)   # the drive's copies only
    try:
        plan = cache.lookup(keys)
        assert plan.num_blocks == 3 and plan.checkpoint is not None
        assert plan.checkpoint.tier == SSD
        free = cache.gauges()["ssd_free_slots"]
        load = cache.prepare_load(keys, plan.num_blocks)
        assert cache.complete_load(load, state_failed=True) == 0
        assert cache.stats.ssd_read_failures == 1
        assert cache.gauges()["ssd_free_slots"] == free + units
        assert cache.lookup(keys).checkpoint is None
        assert cache.lookup(keys).num_blocks == 0      # a hybrid hit ends at a checkpoint
    finally:
        cache.close()
