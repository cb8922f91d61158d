"""Session-arrival model: start windows, Poisson starts, idle-gap cap, schedule, specs."""

from __future__ import annotations

import numpy as np
import pytest

from saria.errors import ConfigError
from saria.traces import (
    ArrivalModel,
    Trace,
    TraceRequest,
    TraceSession,
    bundled_trace,
    load_trace,
    schedule,
    session_starts,
    think_times,
)
from saria.traces.arrivals import DEFAULT_MAX_IDLE_S, parse_duration, session_offsets

NO_IDS = np.empty(0, dtype=np.uint32)


def make_trace(session_times, *, thinks=None, has_sessions=True) -> Trace:
    sessions = []
    for k, times in enumerate(session_times):
        reqs = [
            TraceRequest(
                namespace=k, session=f"s{k}", time=float(t), input_tokens=64, output_tokens=1,
                hash_ids=NO_IDS, think_time=None if thinks is None else thinks[k][i],
            )
            for i, t in enumerate(times)
        ]
        sessions.append(TraceSession(name=f"s{k}", namespace=k, requests=reqs))
    return Trace("t", "", "test", None, False, has_sessions, sessions)


def test_window_starts_inside_window_and_deterministic():
    trace = make_trace([[0.0]] * 500)
    m = ArrivalModel("window", window_s=600.0, seed=7)
    a, b = session_starts(trace, m), session_starts(trace, m)
    assert np.array_equal(a, b)
    assert a.min() >= 0.0 and a.max() < 600.0 and a.std() > 100  # spread, not clumped
    assert not np.array_equal(a, session_starts(trace, ArrivalModel("window", window_s=600.0, seed=8)))


def test_poisson_mean_gap_is_one_over_rate():
    trace = make_trace([[0.0]] * 20_000)
    starts = session_starts(trace, ArrivalModel("poisson", rate=30.0, seed=1))
    gaps = np.diff(np.sort(starts))
    assert gaps.mean() == pytest.approx(120.0, rel=0.03)  # 3600 s / 30 per hour
    assert np.std(gaps) == pytest.approx(120.0, rel=0.05)  # exponential: sd == mean
    # assigned in a shuffled order, not file order
    assert not np.all(np.diff(starts) > 0)


def test_idle_cap_shortens_exactly_the_long_gaps():
    s = make_trace([[0, 5, 105, 7305, 7308]]).sessions[0]
    capped = session_offsets(s, 60.0)
    assert capped.tolist() == [0, 5, 65, 125, 128]
    gaps, orig = np.diff(capped), np.diff([r.time for r in s.requests])
    assert np.all(gaps == np.where(orig > 60, 60, orig))
    assert np.all(np.diff(capped) >= 0)
    assert session_offsets(s, None).tolist() == [0, 5, 105, 7305, 7308]


def test_schedule_sorted_complete_and_linked():
    trace = make_trace([[0, 10, 20, 5000], [0, 1], [3, 4, 9]], thinks=[[0, 2, 3, 9000], [0, 0.5], [0, 1, 1]])
    m = ArrivalModel("window", window_s=100.0, seed=3, max_idle_s=600.0)
    sched = schedule(trace, m)
    assert [x.time for x in sched] == sorted(x.time for x in sched)
    assert sorted((x.session, x.index) for x in sched) == [(k, i) for k, s in enumerate(trace.sessions)
                                                          for i in range(len(s.requests))]
    starts = session_starts(trace, m)
    for pos, x in enumerate(sched):
        assert x.request is trace.sessions[x.session].requests[x.index]
        assert x.time == pytest.approx(starts[x.session] + session_offsets(trace.sessions[x.session], 600.0)[x.index])
        if x.index == 0:
            assert x.prev == -1 and x.think_time == 0.0
        else:
            p = sched[x.prev]
            assert (p.session, p.index) == (x.session, x.index - 1) and x.prev < pos
    last = next(x for x in sched if (x.session, x.index) == (0, 3))
    assert last.think_time == 600.0  # trace think_time 9000 s, capped
    # session 2 starts at its first request (t=3): offsets are re-based to it
    first2 = next(x for x in sched if (x.session, x.index) == (2, 0))
    assert first2.time == pytest.approx(starts[2])


def test_schedule_ties_keep_session_then_request_order():
    trace = make_trace([[0, 0, 0], [0, 0]])
    sched = schedule(trace, ArrivalModel("trace"))
    assert [(x.session, x.index) for x in sched] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]


def test_think_times_fall_back_to_capped_gaps():
    s = make_trace([[0, 30, 5030]]).sessions[0]
    assert think_times(s).tolist() == [0, 30, 5000]
    assert think_times(s, 3600.0).tolist() == [0, 30, 3600]
    s = make_trace([[0, 30, 5030]], thinks=[[0, 12, 4000]]).sessions[0]
    assert ArrivalModel().think_times(s).tolist() == [0, 12, DEFAULT_MAX_IDLE_S]


def test_trace_mode_keeps_pseudo_session_times_uncapped():
    trace = make_trace([[0.0, 2.0, 9000.0]], has_sessions=False)
    sched = schedule(trace, ArrivalModel("trace", max_idle_s=10.0))
    assert [x.time for x in sched] == [0.0, 2.0, 9000.0]
    with pytest.raises(ConfigError, match="closed loop needs sessions"):
        schedule(trace, ArrivalModel("trace", closed_loop=True))


def test_trace_mode_on_bailian_keeps_timestamps():
    trace = load_trace(bundled_trace("bailian"))
    sched = schedule(trace, ArrivalModel.from_spec("trace,max-idle=none"))
    assert len(sched) == trace.num_requests == 29
    assert sorted(x.time for x in sched) == sorted(r.time for r in trace.requests())


def test_window_schedule_on_weka_like_sessions_is_deterministic():
    from saria.traces import generate_agent_sessions

    trace = generate_agent_sessions(20, seed=5)
    m = ArrivalModel.from_spec("window:40m,seed=9")
    a, b = schedule(trace, m), schedule(trace, m)
    assert [(x.time, x.session, x.index) for x in a] == [(x.time, x.session, x.index) for x in b]
    assert len(a) == trace.num_requests
    assert all(0 <= s < 2400 for s in session_starts(trace, m))


@pytest.mark.parametrize(
    ("spec", "expect"),
    [
        ("window:2h", dict(mode="window", window_s=7200.0)),
        ("window:12h", dict(mode="window", window_s=43200.0)),
        ("window:40m", dict(mode="window", window_s=2400.0)),
        ("window:90", dict(mode="window", window_s=90.0)),
        ("poisson:30/h", dict(mode="poisson", rate=30.0)),
        ("poisson:0.5/m", dict(mode="poisson", rate=30.0)),
        ("poisson:12", dict(mode="poisson", rate=12.0)),
        ("trace", dict(mode="trace")),
        ("window:2h,seed=4,max-idle=30m,closed", dict(seed=4, max_idle_s=1800.0, closed_loop=True)),
        ("Window:10m, max-idle=none, open", dict(window_s=600.0, max_idle_s=None, closed_loop=False)),
    ],
)
def test_spec_parsing(spec, expect):
    m = ArrivalModel.from_spec(spec)
    for key, value in expect.items():
        assert getattr(m, key) == value
    assert ArrivalModel.from_spec(m.spec()) == m


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("", "empty arrival spec"),
        ("uniform:2h", "unknown arrival mode 'uniform'"),
        ("window", "window needs a length"),
        ("window:2x", "bad duration '2x'"),
        ("window:0h", "window must be positive"),
        ("poisson", "poisson needs a rate"),
        ("poisson:fast", "bad Poisson rate 'fast'"),
        ("poisson:3/week", "bad Poisson rate"),
        ("poisson:0/h", "Poisson rate must be positive"),
        ("trace:2h", "'trace' takes no argument"),
        ("window:2h,seed=-1", "bad option 'seed=-1'"),
        ("window:2h,loop", "bad option 'loop'"),
        ("window:2h,max-idle=soon", "bad duration 'soon'"),
    ],
)
def test_bad_specs_name_the_problem(spec, needle):
    with pytest.raises(ConfigError, match="^arrivals: ") as info:
        ArrivalModel.from_spec(spec)
    assert needle in str(info.value)


def test_overrides_and_field_checks():
    assert ArrivalModel.from_spec("window:2h", seed=3, closed_loop=True).seed == 3
    with pytest.raises(ConfigError, match="unknown field 'speed'"):
        ArrivalModel.from_spec("window:2h", speed=3)
    with pytest.raises(ConfigError, match="max idle gap"):
        ArrivalModel(max_idle_s=-1.0)
    assert parse_duration("1.5d") == 129600.0
