"""The budget admission and the return-gap record it (and promotion) learn
from: against brute-force models of the histogram, the bucket's invariants
under random streams, and the decisions that matter -- the spend follows the
rating, the dead are never written, the valuable go first."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from budgets import examples

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


@example(counts=[0.0] * 7 + [0.5], share=5e-324)  # the wanted weight underflows to 0
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


def test_the_spend_follows_the_rating_under_an_ample_supply():
    """Ten candidates a second against a rating of one unit a second (and a
    quarter of it): over two days the spend converges to the rating --
    within the bucket's savings and debt room -- and budget:0.25 spends a
    quarter."""
    spent = {}
    for fraction in (1.0, 0.25):
        p = _budget(fraction)
        for t in range(0, 2 * 86_400, 60):  # 600 candidates a minute
            _evict(p, 600, float(t))
        spent[fraction] = p.spent
        accrued = fraction * 2 * 86_400
        room = fraction * p.burst_s
        assert accrued - room <= p.spent <= accrued + room
        assert p.state(2 * 86_400.0)["budget_used"] == pytest.approx(p.spent / accrued, rel=0.01)
    assert spent[0.25] / spent[1.0] == pytest.approx(0.25, rel=0.1)


def test_the_dead_are_never_written_whatever_the_savings():
    """Returns seen come within 100 s; a victim idle ten times longer than
    any of them is worth nothing and is refused with a full bucket, while a
    victim idle 5 s is taken."""
    returns = ReturnGaps()
    returns.observe(np.linspace(1, 100, 500), now=0.0)
    p = _budget(returns=returns)
    p.tick(0.0)
    p.tick(p.burst_s)  # the savings are full
    assert p.state()["level"] == 1.0
    assert not _evict(p, 16, p.burst_s, idle=1000.0).any()
    assert _evict(p, 16, p.burst_s, idle=5.0).all()


def test_in_debt_the_most_valuable_go_first():
    """With the debt room nearly used, a mixed batch (short and long idles,
    first and later evictions) gets only part admitted, and no refused
    candidate is worth more than an admitted one."""
    returns = ReturnGaps()
    returns.observe(np.geomspace(1, 3000, 400), now=0.0)
    p = _budget(units=8640, returns=returns)  # 0.1 unit/s: 4,320 units of debt room
    rng = np.random.default_rng(0)
    for step in range(200):
        n = 64
        idle = rng.uniform(0, 2500, n)
        ev = rng.integers(1, 4, n).astype(np.uint32)
        z = np.zeros(n, np.uint32)
        now = float(step)
        want = p.on_evict(KEYS[:n], z, z, ev, now, last_access=now - idle, depth=np.arange(n))
        value = p.return_rates()[ev] * returns.survival(idle)
        p.on_returns(np.repeat(np.array([1, 2, 3]), [5, 10, 15]), now)  # steady class rates
        if want.any() and (~want).any():
            assert value[~want].max() <= value[want].min() * 2 ** 0.25 + 1e-12  # bin resolution
    assert p.tokens >= -p.rate * p.burst_s - 1
    assert 0 < p.spent < 200 * 64


def test_victims_are_rated_by_the_returns_their_class_earned():
    """Victims evicted for the second time come back four times as often as
    first victims (returns reported by the core): the learned rates say so,
    and in debt a batch of equal idles buys second victims first."""
    returns = ReturnGaps()
    returns.observe(np.geomspace(1, 3000, 400), now=0.0)
    p = _budget(units=8640, returns=returns)
    for step in range(100):
        now = float(step)
        _evict(p, 100, now, ev=1)
        _evict(p, 100, now, ev=2)
        p.on_returns(np.array([1] * 10 + [2] * 40), now)
    rates = p.return_rates()
    assert rates[2] == pytest.approx(0.4, rel=0.05) and rates[1] == pytest.approx(0.1, rel=0.1)
    assert rates[0] == rates[1]  # an early write is rated as a first victim
    bought = {1: 0, 2: 0}
    for step in range(100, 300):
        ev = np.repeat(np.array([1, 2], np.uint32), 32)
        z = np.zeros(64, np.uint32)
        want = p.on_evict(KEYS[:64], z, z, ev, float(step), last_access=np.full(64, step - 10.0))
        for k in (1, 2):
            bought[k] += int(want[ev == k].sum())
    assert bought[2] > 0 and bought[1] < bought[2] / 2


@settings(max_examples=examples(60), deadline=None)
@given(batches=st.lists(st.tuples(st.floats(0, 600), st.integers(0, 40),
                                  st.floats(0, 5000), st.booleans()), min_size=1, max_size=40))
def test_bucket_invariants_under_random_streams(batches):
    """Whatever the stream: the spend never runs past what accrued plus the
    debt room, the savings never exceed theirs, already-persisted blocks are
    never admitted, and the state's figures are consistent."""
    p = _budget(units=864)  # 0.01 unit/s
    now = 0.0
    for dt, n, idle, early in batches:
        now += dt
        skip = np.arange(n) % 3 == 0
        z = np.zeros(n, np.uint32)
        if early:
            want = p.on_access(KEYS[:n], z, z, now, last_access=np.full(n, now), on_ssd=skip)
        else:
            want = p.on_evict(KEYS[:n], z, z, np.ones(n, np.uint32), now,
                              last_access=np.full(n, now - idle), on_ssd=skip)
        assert not (want & skip).any()
        accrued = p.rate * now
        assert p.spent <= accrued + p.rate * p.burst_s + 1e-9
        assert p.tokens <= p.rate * p.burst_s + 1e-9
        assert p.tokens >= -p.rate * p.burst_s - 1e-9
    s = p.state(now)
    assert s["spent_units"] == p.spent and 0.0 <= s["level"] <= 1.0


def _gaps():
    returns = ReturnGaps()
    returns.observe(np.geomspace(1, 3000, 400), now=0.0)
    return returns


def test_class_first_once_the_proven_fill_the_rate():
    """Each ten seconds, 50 first victims and 8 second victims (0.8 of a
    rating of one unit a second): once the proven supply has been watched,
    the policy writes the second victims -- what E2 writes -- and no first
    victim. With 2 second victims (0.2 of the rate) it stays cross-class and
    buys first victims too."""
    for second, class_first in ((8, True), (2, False)):
        p = _budget(returns=_gaps())
        bought, offered = {1: 0, 2: 0}, {1: 0, 2: 0}
        for t in range(0, 86_400, 10):
            for ev, n in ((1, 50), (2, second)):
                want = _evict(p, n, float(t), idle=30.0, ev=ev)
                if t >= 3600:
                    bought[ev] += int(want.sum())
                    offered[ev] += n
        assert p.class_first is class_first
        if class_first:
            assert bought[2] == offered[2] and bought[1] == 0
        else:
            assert bought[1] > 0.05 * offered[1]


def _create(p, n, now):
    return p.on_create(KEYS[:n], now)


def test_written_at_creation_while_creating_fits_the_rate():
    """Blocks created at half the rating are written as they are created once
    their cost has been watched ``create_young_s`` (none before); created at
    twice the rating, none is; neither ever takes the day past its room."""
    for per_10s, fits in ((5, True), (20, False)):
        p = _budget()
        early = late = 0
        for t in range(0, 86_400, 10):
            got = int(_create(p, per_10s, float(t)).sum())
            if t < p.create_young_s:
                early += got
            elif t >= p.create_young_s + 3600:
                late += got
        assert early == 0
        assert late == ((86_400 - p.create_young_s - 3600) // 10 * per_10s if fits else 0)
        assert p.state(86_400.0)["day_room_units"] >= 0


@settings(max_examples=examples(80), deadline=None)
@given(batches=st.lists(st.tuples(st.floats(0, 20_000), st.integers(0, 60), st.floats(0, 5000),
                                  st.integers(1, 3), st.sampled_from(["evict", "access", "create"])),
                        min_size=1, max_size=40))
def test_the_guarantee_over_every_window(batches):
    """Whatever the stream of victims (any class), early writes and
    creations: no window of a day holds more than a day's rating, no window
    of length T more than the rating over T plus a day (brute force over all
    windows, and the replay's write_excess_h agrees), already-persisted
    blocks are never admitted, the state's figures are consistent."""
    from saria.sim.report import write_day_peak, write_excess_h

    p = _budget(units=864, returns=_gaps())  # 0.01 unit/s: 864 units a day
    now, log = 0.0, []
    p.tick(now)
    for dt, n, idle, ev, kind in batches:
        now += dt
        skip = np.arange(n) % 3 == 0
        z = np.zeros(n, np.uint32)
        if kind == "create":
            want = _create(p, n, now)
        elif kind == "access":
            want = p.on_access(KEYS[:n], z, z, now, last_access=np.full(n, now), on_ssd=skip)
        else:
            want = p.on_evict(KEYS[:n], z, z, np.full(n, ev, np.uint32), now,
                              last_access=np.full(n, now - idle), on_ssd=skip)
        if kind != "create":
            assert not (want & skip).any()
        log.append((now, int(want.sum())))
    t = np.array([0.0] + [x[0] for x in log])
    w = np.array([0] + [x[1] for x in log])
    day = p.rate * DAY
    excess = peak = 0.0
    for i in range(len(t)):
        for j in range(i, len(t)):
            written = w[i:j + 1].sum()
            if t[j] - t[i] < DAY:
                assert written <= day + 1e-9
                peak = max(peak, written)
            assert written <= p.rate * (t[j] - t[i]) + day + 1e-9
            excess = max(excess, written - p.rate * (t[j] - t[i]))
    assert write_excess_h(log, p.rate, 0.0) * 3600 * p.rate == pytest.approx(excess, abs=1e-6)
    assert write_day_peak(log, p.rate) * day == pytest.approx(peak, abs=1e-6)
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


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                          st.sampled_from(list(ReturnGaps.EDGES[:12]) + [-0.0, 0.0])),
                max_size=40),
       st.booleans())
def test_histogram_counts_are_numpys_binning(xs, sort) -> None:
    """The native binning DecayedHistogram.add counts with is numpy's
    clip(searchsorted(edges, x, 'right') - 1) bincount, on edges, between
    them, below, above, signed zeros, NaN and infinities, in runs or not."""
    from saria import _native
    x = np.sort(np.asarray(xs, float)) if sort else np.asarray(xs, float)
    for edges in (ReturnGaps.EDGES, np.arange(5.0)):
        h = DecayedHistogram(edges, DAY)
        want = np.bincount(h.bin(x), minlength=edges.shape[0]) if x.size else np.zeros(len(edges))
        assert list(_native.bin_counts(x, h.edges)) == list(want)
