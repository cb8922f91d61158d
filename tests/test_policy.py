"""Admission and promotion policies decide what they should, against a
brute-force model of each rule; the coordinator's timing model obeys its
formulas and the properties the design relies on."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from saria.errors import ConfigError
from saria.policy import (
    POLICIES,
    FullPromotion,
    KvbmFrequencyFilter,
    LazyPartialPromotion,
    balanced_dram_share,
    make_admission,
    make_promotion,
)
from saria.transfer import LinkModel, reload_time

KEYS = np.zeros((6, 32), dtype=np.uint8)
KEYS[:, 0] = np.arange(6)
counts = st.lists(st.integers(0, 6), min_size=6, max_size=6).map(lambda x: np.array(x, np.uint32))


@given(reuse=counts, hits=counts, ev=counts)
def test_admission_rules_match_their_definitions(reuse, hits, ev):
    expect = {
        "dram-only": (False, np.zeros(6, bool), np.zeros(6, bool)),
        "full-duplicate": (True, np.zeros(6, bool), np.zeros(6, bool)),
        "write-back": (False, np.zeros(6, bool), np.ones(6, bool)),
        "saria": (False, np.zeros(6, bool), ev >= 2),
        "E3": (False, np.zeros(6, bool), ev >= 3),
        "E5": (False, np.zeros(6, bool), ev >= 5),
        "R2": (False, reuse >= 2, np.zeros(6, bool)),
        "R4": (False, reuse >= 4, np.zeros(6, bool)),
        "E2+R2": (False, reuse >= 2, ev >= 2),
        "hicache-selective": (False, hits >= 2, np.zeros(6, bool)),
    }
    for name, (create, access, evict) in expect.items():
        p = make_admission(name)
        assert p.on_create(KEYS, 0.0).tolist() == [create] * 6, name
        assert p.on_access(KEYS, reuse, hits, 0.0).tolist() == access.tolist(), name
        assert p.on_evict(KEYS, reuse, hits, ev, 0.0).tolist() == evict.tolist(), name


def test_every_documented_policy_name_builds():
    for name in ("dram-only", "full-duplicate", "write-back", "saria", "E2", "E3", "E5", "R2",
                 "R4", "E2+R2", "hicache-selective", "kvbm-filter", "E7", "R3+E4"):
        assert make_admission(name) is not None
    assert set(POLICIES) >= {"dram-only", "saria", "kvbm-filter"}


@pytest.mark.parametrize("bad", ["E0", "E", "X2", "E2+E3", "", "lru"])
def test_unknown_policy_lists_the_valid_ones(bad):
    with pytest.raises(ConfigError, match="valid: dram-only, full-duplicate"):
        make_admission(bad)


def kvbm_reference(events, min_frequency=2, interval=10.0):
    """Dynamo's FrequencyFilter with its periodic sweep run literally."""
    counts, out, next_sweep = {}, [], interval
    for t, key in events:
        while t >= next_sweep:
            counts = {k: c - 1 for k, c in counts.items() if c - 1 > 0}
            next_sweep += interval
        counts[key] = counts[key] * 2 if key in counts else 1
        out.append(counts[key] >= min_frequency)
    return out


@given(st.lists(st.tuples(st.floats(0, 5), st.integers(0, 3)), max_size=40))
def test_kvbm_filter_matches_the_periodic_sweep(steps):
    t, events = 0.0, []
    for dt, key in steps:
        t += dt
        events.append((t, key))
    f = KvbmFrequencyFilter(min_frequency=2, decay_interval_s=10.0)
    got = [bool(f.on_access(KEYS[key:key + 1], None, None, t)[0]) for t, key in events]
    assert got == kvbm_reference(events)


def test_lazy_promotion_fills_up_to_the_dram_share():
    ssd = np.arange(10, 30)
    p = LazyPartialPromotion(r=0.6, min_victim_age_s=5)
    # 10 DRAM + 20 SSD blocks: r=0.6 wants 18 from DRAM -> promote the first 8 SSD blocks.
    assert p.select(ssd, 10).tolist() == list(range(10, 18))
    assert p.select(ssd[:5], 25).size == 0  # 25 of 30 from DRAM: already over the share
    assert FullPromotion().select(ssd, 0).tolist() == ssd.tolist()
    assert make_promotion("none").select(ssd, 0).size == 0


def test_balanced_share_equalises_both_paths():
    d, s = 50e9, 6.5e9
    r = balanced_dram_share(d, s)
    total = 1e9
    assert r * total / d == pytest.approx((1 - r) * total / s)
    assert make_promotion("lazy", dram_bw=d, ssd_bw=s).r == pytest.approx(r)
    with pytest.raises(ConfigError):
        make_promotion("lazy")
    with pytest.raises(ConfigError, match="valid: none, full, lazy"):
        make_promotion("half")


GEN5_1SSD = LinkModel(50e9, 50e9, 6.5e9, pacing_efficiency=0.9)
GEN4_2SSD = LinkModel(25e9, 25e9, 13e9, pacing_efficiency=0.9)


def test_modes_follow_their_formulas():
    d, s = 40e9, 6.5e9
    assert reload_time(d, s, GEN5_1SSD, "serial") == pytest.approx(d / 50e9 + s / 6.5e9)
    assert reload_time(d, 0, GEN5_1SSD, "paced") == pytest.approx(d / 50e9)
    assert reload_time(0, s, GEN5_1SSD, "overlap") == pytest.approx(1.0)
    # Paced: SSD at full speed (1 s), DRAM on 0.9 x (50 - 6.5) GB/s meanwhile,
    # then the rest of the DRAM part at the full 50 GB/s.
    left = d - 0.9 * 43.5e9 * 1.0
    assert reload_time(d, s, GEN5_1SSD, "paced") == pytest.approx(1.0 + left / 50e9)
    # Overlap: DRAM at 50 - 3.25 GB/s while the SSD keeps half its rate, then
    # the SSD's disk-only tail at 6.5 GB/s.
    t_d = d / 46.75e9
    assert reload_time(d, s, GEN5_1SSD, "overlap") == pytest.approx(
        t_d + (s - 3.25e9 * t_d) / 6.5e9)
    with pytest.raises(ValueError, match="valid: serial, overlap, paced"):
        reload_time(d, s, GEN5_1SSD, "eager")


@given(d=st.floats(1e6, 1e11), s=st.floats(1e6, 1e11))
def test_overlap_never_loses_to_serial_and_respects_the_link(d, s):
    for link in (GEN5_1SSD, GEN4_2SSD):
        serial = reload_time(d, s, link, "serial")
        for mode in ("overlap", "paced"):
            t = reload_time(d, s, link, mode)
            assert t <= serial * (1 + 1e-9) or mode == "paced"
            assert t >= (d + s) / link.ingress_Bps * (1 - 1e-9)  # one link carries it all
            assert t >= s / link.ssd_alone * (1 - 1e-9)


def test_pacing_removes_the_disk_tail_with_one_ssd_and_cannot_help_a_saturated_link():
    """One SSD: unpaced DRAM copies leave a disk-only tail that pacing removes.
    SSDs that alone fill the link: pacing has no residual to give DRAM and
    brings nothing (SARIA §4.5)."""
    def split(link, total=20e9):  # the reload split at the balanced share
        r = balanced_dram_share(link.dram_alone, link.ssd_alone)
        return r * total, (1 - r) * total
    d, s = split(GEN5_1SSD)
    assert reload_time(d, s, GEN5_1SSD, "paced") < 0.9 * reload_time(d, s, GEN5_1SSD, "overlap")
    saturated = LinkModel(25e9, 25e9, 4 * 6.5e9, pacing_efficiency=0.9)
    d, s = split(saturated)
    assert reload_time(d, s, saturated, "paced") >= reload_time(d, s, saturated, "overlap")
    ideal_arbiter = LinkModel(50e9, 50e9, 6.5e9, pacing_efficiency=0.9, contention_ssd_share=1.0)
    d, s = split(ideal_arbiter)
    assert reload_time(d, s, ideal_arbiter, "paced") >= reload_time(d, s, ideal_arbiter, "overlap")


def test_reload_queue_is_fifo_without_pacing():
    from saria.transfer import ReloadQueue
    for mode in ("serial", "overlap"):
        q = ReloadQueue(GEN5_1SSD, mode)
        first = q.submit(0.0, 10e9, 6.5e9)
        second = q.submit(0.0, 5e9, 0)
        assert first == pytest.approx(reload_time(10e9, 6.5e9, GEN5_1SSD, mode))
        assert second == pytest.approx(first + 5e9 / 50e9)


def test_paced_queue_gives_the_residual_to_dram_only_reloads():
    """While request 1 reads 6.5 GB from the SSD (1 s) and only 10 GB from
    DRAM, request 2's DRAM-only reload rides the residual ingress."""
    from saria.transfer import ReloadQueue
    q = ReloadQueue(GEN5_1SSD, "paced")
    first = q.submit(0.0, 10e9, 6.5e9)
    assert first == pytest.approx(1.0)               # the SSD read bounds it
    residual = 0.9 * 43.5e9
    dram1 = 10e9 / residual                          # request 1's DRAM part ends early
    second = q.submit(0.0, 5e9, 0)
    early = residual * (1.0 - dram1)
    expect = 1.0 + (5e9 - early) / 50e9 if early < 5e9 else dram1 + 5e9 / residual
    assert second == pytest.approx(expect)
    fifo = ReloadQueue(GEN5_1SSD, "overlap")
    fifo.submit(0.0, 10e9, 6.5e9)
    assert second < fifo.submit(0.0, 5e9, 0)        # pacing let it start earlier
    third = q.submit(0.0, 1e9, 1e9)                  # SSD reloads stay FIFO
    assert third >= max(first, second)


@given(jobs=st.lists(st.tuples(st.floats(0, 2), st.floats(0, 2e10), st.floats(0, 1e10)),
                     min_size=1, max_size=8),
       mode=st.sampled_from(["serial", "overlap", "paced"]))
def test_no_reload_beats_its_own_standalone_time(jobs, mode):
    from saria.transfer import ReloadQueue
    q = ReloadQueue(GEN4_2SSD, mode)
    t = 0.0
    for dt, d, s in jobs:
        t += dt
        done = q.submit(t, d, s)
        assert done >= t + reload_time(d, s, GEN4_2SSD, mode) * (1 - 1e-9) - 1e-12
