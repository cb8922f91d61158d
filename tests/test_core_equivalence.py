"""The replay's decisions are the engine's decisions: the same request stream
through the cache core over the simulator's counting backend and over the
real tiers (DRAM pool, O_DIRECT SSD store, synthetic bytes verified on every
load) gives the same per-request hits, the same keys written to the SSD, the
same evictions and the same final index -- for every admission policy, with
and without promotion, on WEKA, Mooncake, Bailian, a synthetic hybrid-model
trace and hypothesis-generated streams."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from budgets import examples

from saria.index import Tier, VirtualClock
from saria.policy import POLICIES
from saria.policy.budget import BudgetAdmission
from saria.runtime import TieredCache
from saria.sim.engine import Arrival, Replay
from saria.sim.presets import get_preset
from saria.sim.real import SyntheticBytes, real_cache_config
from saria.sim.replay import ReadPath, make_setup, open_loop_arrivals
from saria.traces import bundled_trace, generate_agent_sessions, load_trace
from saria.traces.arrivals import ArrivalModel

BLOCK_BYTES = 4096  # real bytes per block: small, so every run is quick
INDEX_FIELDS = ("tiers", "ckpt", "reuse", "hits", "dram_evictions", "last_access", "session",
                "depth")


def run_both(arrivals, policy, preset, *, promotion, dram_blocks, ssd_blocks, trace_block_size,
             tmp_path):
    """The simulated and the real replay of one stream; both kept for comparison."""
    block = preset.block_size * preset.model.kv_bytes_per_token

    age = "auto" if promotion.endswith("-auto") else 30.0  # learned from return gaps, or fixed

    def setup():
        return make_setup(policy, preset, read_path=ReadPath(promotion=promotion.split("-")[0],
                                                             r=0.5, min_victim_age_s=age),
                          dram_bytes=dram_blocks * block, ssd_bytes=ssd_blocks * block,
                          trace_block_size=trace_block_size)

    sim = Replay(setup())
    sim.run(arrivals)
    real_setup = setup()
    dirs = [str(tmp_path / f"drive{i}") for i in range(preset.hardware.ssd_count)]
    cfg = real_cache_config(real_setup, policy, BLOCK_BYTES, dirs)
    clock = VirtualClock()
    with TieredCache(cfg, clock=clock) as cache:
        mover = SyntheticBytes(cache)
        real = Replay(real_setup, cache=cache, mover=mover, clock=clock)
        real.run(arrivals)
        state = dict(index=cache.index.dump(), stats=cache.stats, mover=mover,
                     store=cache.backend.ssd.stats() if cache.backend.ssd else None)
    return sim, real, state


def assert_same(sim, real, state):
    assert state["mover"].mismatched == 0, "a load returned wrong bytes"
    assert state["stats"].ssd_read_failures == 0
    assert real.stats.hit_blocks == sim.stats.hit_blocks
    assert real.stats.hit_tokens == sim.stats.hit_tokens
    assert real._ssd_written == sim._ssd_written           # the same keys, not just a count
    assert (real.stats.ssd_bytes_written == sim.stats.ssd_bytes_written).all()
    for name in ("dram_evictions", "ssd_evictions", "promoted_blocks", "stored_blocks",
                 "ssd_write_blocks", "ssd_write_states", "writes_dropped", "hit_blocks"):
        assert getattr(real.cache.stats, name) == getattr(sim.cache.stats, name), name
    a, b = sim.cache.index.dump(), state["index"]
    order_a, order_b = _by_key(a["keys"]), _by_key(b["keys"])
    assert (a["keys"][order_a] == b["keys"][order_b]).all()
    for f in INDEX_FIELDS:
        if f in a:
            assert (a[f][order_a] == b[f][order_b]).all(), f
    if state["store"] is not None:  # the store holds exactly what the index says is on SSD
        on_ssd = int(np.count_nonzero(b["tiers"] & Tier.SSD.bit))
        states = int(np.count_nonzero(b["ckpt"] & Tier.SSD.bit)) if "ckpt" in b else 0
        units = real.setup.state_units
        used = state["store"]["total"]["capacity_slots"] - state["store"]["total"]["free_slots"]
        assert used == on_ssd + states * units


def _by_key(keys: np.ndarray) -> np.ndarray:
    return np.lexsort(keys.T[::-1])


ALL_POLICIES = [*POLICIES, "budget", "budget:0.25"]
PRESET = get_preset("qwen3-8b/h100-gen5-1ssd").with_(gpu_cache_bytes=0)


def weka_stream():
    trace = load_trace(bundled_trace("weka"), limit_sessions=4)
    return open_loop_arrivals(trace, ArrivalModel.from_spec("window:20m,seed=3"),
                              max_context=40_000)


def mooncake_stream():
    trace = load_trace(bundled_trace("mooncake"))
    trace.sessions[0].requests = trace.sessions[0].requests[:300]
    return open_loop_arrivals(trace, ArrivalModel.from_spec("trace"))


def bailian_stream():
    return open_loop_arrivals(load_trace(bundled_trace("bailian")), ArrivalModel.from_spec("trace"))


def hybrid_stream():
    """Synthetic agent sessions for Qwen3.5-9B: state checkpoints (many block
    slots each) in DRAM and on the SSD share their blocks' admission; hits
    end at checkpoints; two drives."""
    trace = generate_agent_sessions(3, seed=5)
    for s in trace.sessions:
        s.requests = [r for r in s.requests if r.input_tokens < 60_000][:12]
    return open_loop_arrivals(trace, ArrivalModel.from_spec("window:10m,seed=1"))


# trace -> (stream, preset, DRAM blocks, SSD blocks, trace block size, promotions). The
# capacities make every trace evict from DRAM and from the SSD and read from both.
TRACES = {
    "weka": (weka_stream, PRESET, 120, 400, 64, ("none", "lazy", "lazy-auto")),
    "mooncake": (mooncake_stream, PRESET.with_(block_size=128), 100, 2000, 512, ("none", "full")),
    "bailian": (bailian_stream, PRESET.with_(block_size=16), 24, 40, 16, ("none", "lazy")),
    "hybrid": (hybrid_stream, get_preset("qwen3.5-9b/h100-gen5-2ssd").with_(gpu_cache_bytes=0),
               600, 500, 64, ("none", "lazy")),
}


@pytest.fixture(scope="module")
def streams():
    cache: dict[str, list] = {}

    def get(name: str) -> list:
        if name not in cache:
            cache[name] = TRACES[name][0]()
        return cache[name]

    return get


@pytest.mark.parametrize("trace, promotion", [(t, p) for t, case in TRACES.items()
                                              for p in case[-1]])
@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_real_tiers_decide_as_the_simulation(streams, trace, promotion, policy, tmp_path):
    _, preset, dram, ssd, trace_block_size, _ = TRACES[trace]
    sim, real, state = run_both(streams(trace), policy, preset, promotion=promotion,
                                dram_blocks=dram, ssd_blocks=ssd,
                                trace_block_size=trace_block_size, tmp_path=tmp_path)
    assert sum(sim.stats.hit_blocks) > 0
    assert_same(sim, real, state)


BUDGET_MODES = {  # the budget's two modes, reached within the short streams
    "create": dict(create_young_s=60.0, create_share=1e9),  # written at creation
    "class-first": dict(young_s=60.0, proven_high=0.0, proven_low=0.0),
}


@pytest.mark.parametrize("trace", ["weka", "hybrid"])
@pytest.mark.parametrize("mode", BUDGET_MODES)
def test_budget_modes_decide_as_the_simulation(streams, trace, mode, tmp_path, monkeypatch):
    """The budget's writes at creation and its class-first mode (watched a
    minute, not 2 h / 10 min, with the bar lowered so the streams reach
    them): the engine decides as the replay, and the mode did write."""
    for k, v in BUDGET_MODES[mode].items():
        monkeypatch.setattr(BudgetAdmission, k, v)
    _, preset, dram, ssd, trace_block_size, _ = TRACES[trace]
    sim, real, state = run_both(streams(trace), "budget", preset, promotion="none",
                                dram_blocks=dram, ssd_blocks=ssd,
                                trace_block_size=trace_block_size, tmp_path=tmp_path)
    used = sim.cache.admission.state(sim.clock.now)
    assert used["created_units" if mode == "create" else "class_first_units"] > 0
    assert_same(sim, real, state)


@settings(max_examples=examples(25), deadline=None)
@given(data=st.data(), policy=st.sampled_from(ALL_POLICIES),
       promotion=st.sampled_from(["none", "full", "lazy", "lazy-auto"]),
       dram=st.integers(3, 30), ssd=st.integers(0, 40))
def test_generated_streams(tmp_path_factory, data, policy, promotion, dram, ssd):
    """Random sessions over a small tree of shared prefixes, random times."""
    n = data.draw(st.integers(1, 25))
    trunk = np.arange(100, 112)
    arrivals, t = [], 0.0
    for _ in range(n):
        t += data.draw(st.floats(0, 120))
        keep = data.draw(st.integers(0, 12))
        branch = data.draw(st.integers(0, 3))
        tail = data.draw(st.integers(0, 10))
        # an id names its whole prefix (trace ids are prefix-chained)
        ids = np.concatenate([trunk[:keep], 10_000 + 1000 * keep + 100 * branch + np.arange(tail)])
        tokens = 64 * ids.size + data.draw(st.integers(0, 63))
        arrivals.append(Arrival(t, branch % 2, tokens, ids.astype(np.int64), branch))
    sim, real, state = run_both(arrivals, policy, PRESET, promotion=promotion, dram_blocks=dram,
                                ssd_blocks=ssd, trace_block_size=64,
                                tmp_path=tmp_path_factory.mktemp("gen"))
    assert_same(sim, real, state)
