"""The budget admission and the return-gap record it (and promotion) learn
from: against brute-force models of the histogram, the bucket's guarantee
over every window of random streams, and the decisions that matter -- the
spend follows the rating, classes rank first and E2 falls out, the dead go
last, the valuable go first."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from saria.errors import ConfigError
from saria.policy import make_admission, make_promotion
from saria.policy.budget import DAY, BudgetAdmission
from saria.policy.returns import DecayedHistogram, ReturnGaps

KEYS = np.zeros((1024, 32), np.uint8)

gaps = st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=60)


# ------------------------------------------------------------ ReturnGaps

@given(xs=gaps, q=st.floats(0.01, 0.99), probe=st.floats(0, 2e6))
def test_return_gaps_match_a_brute_force_count(xs, q, probe):
    """Observed at one instant (no decay): survival is the share of gaps in
    the probe's bin or above, and at least q of the gaps lie under
    quantile(q) while fewer do under the bin edge below it."""
    g = ReturnGaps()
    g.observe(np.array(xs), now=0.0)
    edges = ReturnGaps.EDGES
    bins = np.clip(np.searchsorted(edges, xs, side="right") - 1, 0, edges.size - 1)
    b = np.clip(np.searchsorted(edges, probe, side="right") - 1, 0, edges.size - 1)
    assert g.survival(np.array([probe]))[0] == pytest.approx(np.mean(bins >= b))
    cut = g.quantile(q)
    arr = np.array(xs)
    assert np.mean(arr < cut) >= q - 1e-9 or cut == math.inf
    lower = edges[edges < cut]
    if lower.size:
        assert np.mean(arr < lower[-1]) < q + 1e-9


def test_return_gaps_forget_at_their_memory():
    """An observation one memory old weighs 1/e; nothing seen: survival 1 and
    no cutoff (no evidence that anything is dead)."""
    g = ReturnGaps(memory_s=100.0)
    assert g.survival(np.array([1e9]))[0] == 1.0 and g.quantile(0.99) == math.inf
    g.observe(np.array([10.0]), now=0.0)
    g.observe(np.array([1000.0]), now=100.0)
    assert g.survival(np.array([500.0]))[0] == pytest.approx(1 / (1 + math.exp(-1)))


@given(counts=st.lists(st.floats(0, 100), min_size=8, max_size=8), share=st.floats(0, 1))
def test_histogram_cut_takes_exactly_the_share(counts, share):
    """Everything from `hi` up plus a fraction p of the bin [lo, hi) is the
    upper `share` of the weight."""
    h = DecayedHistogram(np.arange(8.0), tau=1.0)
    h.counts = np.array(counts)
    if h.total == 0:
        return
    lo, hi, p = h.cut(share)
    if share >= 1:
        assert lo == 0.0 and p == 1.0
        return
    if share <= 0:
        assert hi == math.inf
        return
    above = h.counts[h.edges >= hi].sum()
    inside = h.counts[(h.edges >= lo) & (h.edges < hi)].sum()
    assert above + p * inside == pytest.approx(share * h.total, abs=1e-6 * h.total)


# ---------------------------------------------------------------- budget

def _budget(fraction=1.0, units=86_400, returns=None, **kw) -> BudgetAdmission:
    """A policy whose rating is `fraction` unit per second (86,400 units at 1 DWPD)."""
    p = BudgetAdmission(fraction, **kw)
    p.bind(ssd_units=units, returns=returns)
    return p


def _evict(p, n, now, idle=10.0, ev=1):
    z = np.zeros(n, np.uint32)
    return p.on_evict(KEYS[:n], z, z, np.full(n, ev, np.uint32), now,
                      last_access=np.full(n, now - idle), depth=np.arange(n))


def _gaps():
    returns = ReturnGaps()
    returns.observe(np.geomspace(1, 3000, 400), now=0.0)
    return returns


def test_the_spend_follows_the_rating_under_an_ample_supply():
    """Ten proven candidates a second against a rating of one unit a second
    (and a quarter of it): over two days the spend follows the rating --
    never more than a day's rating in any day, most of it spent -- and
    budget:0.25 spends a quarter."""
    spent = {}
    for fraction in (1.0, 0.25):
        p = _budget(fraction)
        for t in range(0, 2 * 86_400, 60):  # 600 candidates a minute
            _evict(p, 600, float(t), ev=2)
        spent[fraction] = p.spent
        accrued = fraction * 2 * 86_400
        assert 0.75 * accrued <= p.spent <= accrued
        assert p.state(2 * 86_400.0)["budget_used"] == pytest.approx(p.spent / accrued, rel=0.01)
    assert spent[0.25] / spent[1.0] == pytest.approx(0.25, rel=0.1)


def test_value_ranks_classes_first_then_the_live_and_recent():
    """A victim evicted twice outranks any first victim, however fresh; within
    a class the value falls with idle time; past 99% of the gaps seen a
    victim is dead and ranks under every live one; the live term is the
    share of gaps ending between its idle time and the SSD's horizon."""
    returns = _gaps()
    p = _budget(returns=returns)
    idle = np.array([1.0, 100.0, 2000.0, 1e5])
    v1 = p.value(np.ones(4, np.uint32), 1e5, 1e5 - idle)
    v2 = p.value(np.full(4, 2, np.uint32), 1e5, 1e5 - idle)
    assert (np.diff(v1[:3]) < 0).all() and v2[:3].min() > v1.max()
    assert v1[3] < 0.01 and v2[3] < 0.01  # dead, whatever the class
    assert v1[1] - 1 == pytest.approx(returns.survival(np.array([100.0]))[0]
                                      - returns.survival(np.array([100.0 + p.horizon_s]))[0])
    assert p.horizon_s == pytest.approx(DAY)
    assert (p.value(np.array([7, 9]), 0.0, None) == BudgetAdmission.CLASSES).all()  # capped


def test_first_victims_alone_are_paced_at_their_share():
    """A supply of first victims only, ten a second against a rating of one:
    they are bought at their share of the rate (plus their lead), never more,
    and never into the room kept for the proven (half of each day's)."""
    p = _budget()
    for t in range(0, 2 * 86_400, 60):
        _evict(p, 600, float(t))
    cap = p.first_share * p.rate * (2 * 86_400 - 60 + p.first_lead_s)
    kept = (1 - p.reserve_floor) * p.rate * 2 * 86_400
    assert p.spent <= min(cap, kept) + 1
    assert p.spent >= 0.9 * min(cap, kept)


def test_e2_falls_out_when_the_budget_pays_for_second_victims():
    """Each ten seconds, 50 first victims and 5 second victims against a
    rating of one unit a second: once the supply is learned, the policy
    writes the second victims -- what E2 writes -- and almost no first
    victim (the room they would use is kept for the proven)."""
    p = _budget(returns=_gaps())
    bought = {1: 0, 2: 0}
    offered = {1: 0, 2: 0}
    for t in range(0, 86_400, 10):
        now = float(t)
        for ev, n in ((1, 50), (2, 5)):
            want = _evict(p, n, now, idle=30.0, ev=ev)
            if t >= 6 * 3600:
                bought[ev] += int(want.sum())
                offered[ev] += n
    assert bought[2] / offered[2] > 0.9
    assert bought[1] / offered[1] < 0.05


def test_a_burst_of_proven_victims_is_written_whole_while_the_day_has_room():
    """A three-hour burst of second victims at twice the rating (a quarter
    of the day's room): all of them are written, as E2 would, though the
    share alone would buy half."""
    p = _budget(returns=_gaps())
    offered = bought = 0
    for t in range(0, 3 * 3600, 10):
        want = _evict(p, 20, float(t), idle=30.0, ev=2)
        offered += 20
        bought += int(want.sum())
    assert bought == offered
    assert p.state()["level"] >= p.proven_level


def test_in_debt_the_most_valuable_go_first():
    """With the rating short of the supply, a mixed batch (short and long
    idles, first to third evictions) gets only part admitted, and no refused
    candidate is worth more than an admitted one (at the histogram's
    resolution)."""
    returns = _gaps()
    p = _budget(units=8640, returns=returns)  # 0.1 unit/s
    rng = np.random.default_rng(0)
    for step in range(400):
        n = 64
        idle = rng.uniform(0, 4000, n)
        ev = rng.integers(1, 4, n).astype(np.uint32)
        z = np.zeros(n, np.uint32)
        now = float(step)
        want = p.on_evict(KEYS[:n], z, z, ev, now, last_access=now - idle, depth=np.arange(n))
        value = p.value(ev, now, now - idle)
        if want.any() and (~want).any():
            assert value[~want].max() <= value[want].min() + 1 / 32 + 1e-12
    assert p.state()["room_units"] >= 0
    assert 0 < p.spent < 400 * 64


@settings(max_examples=60, deadline=None)
@given(batches=st.lists(st.tuples(st.floats(0, 20_000), st.integers(0, 60),
                                  st.floats(0, 5000), st.integers(1, 3), st.booleans()),
                        min_size=1, max_size=40))
def test_the_guarantee_over_every_window(batches):
    """Whatever the stream: no window of a day holds more than a day's
    rating, no window of length T more than the rating over T plus a day
    (brute force over all windows, and the replay's write_excess_h agrees),
    already-persisted blocks are never admitted, the state's figures are
    consistent."""
    from saria.sim.report import write_excess_h

    p = _budget(units=864, returns=_gaps())  # 0.01 unit/s: 864 units a day
    now, log = 0.0, []
    p.tick(now)
    for dt, n, idle, ev, early in batches:
        now += dt
        skip = np.arange(n) % 3 == 0
        z = np.zeros(n, np.uint32)
        if early:
            want = p.on_access(KEYS[:n], z, z, now, last_access=np.full(n, now), on_ssd=skip)
        else:
            want = p.on_evict(KEYS[:n], z, z, np.full(n, ev, np.uint32), now,
                              last_access=np.full(n, now - idle), on_ssd=skip)
        assert not (want & skip).any()
        log.append((now, int(want.sum())))
    t = np.array([0.0] + [x[0] for x in log])
    w = np.array([0] + [x[1] for x in log])
    day = p.rate * DAY
    excess = 0.0
    for i in range(len(t)):
        for j in range(i, len(t)):
            written = w[i:j + 1].sum()
            if t[j] - t[i] < DAY:
                assert written <= day + 1e-9
            assert written <= p.rate * (t[j] - t[i]) + day + 1e-9
            excess = max(excess, written - p.rate * (t[j] - t[i]))
    assert write_excess_h(log, p.rate, 0.0) * 3600 * p.rate == pytest.approx(excess, abs=1e-6)
    s = p.state(now)
    assert s["spent_units"] == p.spent == w.sum() and 0.0 <= s["level"] <= 1.0


def test_budget_names_and_bad_settings():
    assert make_admission("budget").name == "budget"
    p = make_admission("budget:0.5", dwpd=3)
    assert p.name == "budget:0.5" and p.fraction == 0.5 and p.dwpd == 3
    p.bind(ssd_units=86_400)
    assert p.rate == pytest.approx(1.5)
    for bad in ("budget:x", "budget:0", "budget:-1"):
        with pytest.raises(ConfigError):
            make_admission(bad)
    with pytest.raises(ConfigError, match="dwpd"):
        make_admission("budget", dwpd=0)
    with pytest.raises(ConfigError, match="day_s"):
        BudgetAdmission(day_s=0)


# ------------------------------------------------------------- promotion

def test_promotion_cutoff_learned_from_return_gaps():
    """``auto``: no evidence, no displacement (inf); once returns are seen,
    victims must be idle past 99% of them."""
    p = make_promotion("lazy", r=0.5, min_victim_age_s="auto")
    returns = ReturnGaps()
    assert p.wants_returns and p.victim_age(returns) == math.inf
    returns.observe(np.concatenate([np.full(990, 30.0), np.full(10, 5000.0)]), now=0.0)
    assert 30.0 < p.victim_age(returns) <= 64.0
    fixed = make_promotion("lazy", r=0.5, min_victim_age_s=60)
    assert not fixed.wants_returns and fixed.victim_age(returns) == 60.0
    with pytest.raises(ConfigError):
        make_promotion("lazy", r=0.5, min_victim_age_s="soon")
    assert DAY == 86_400.0
