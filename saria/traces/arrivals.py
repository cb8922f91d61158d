"""Session-arrival model: when each session of a trace starts, and when its requests arrive.

WEKA sessions all start at ``t = 0`` (their times are per session), so a replay must choose
session start times; the SARIA paper keeps "each session's request sequence and
inter-request intervals while varying session-start windows to create different
cache-pressure levels" (2-hour vs 12-hour windows; also 10 to 40 minutes). An
``ArrivalModel`` says how:

- ``window``: session starts uniform at random in ``[0, window_s)`` (seeded).
- ``poisson``: session starts form a Poisson process of ``rate`` sessions per hour
  (seeded); sessions are assigned to the arrivals in a seeded random order, not file order.
- ``trace``: keep the trace's own times; a session starts at its first request's time.
  For Mooncake/Azure (one pseudo-session with absolute times) and Bailian (sessions with
  absolute times) this replays the trace as recorded; for WEKA every session starts at 0.

Open loop (``closed_loop=False``): a request arrives at ``session start + offset``, where
the offset is its time minus the session's first request time, with every gap between
consecutive requests of the session shortened to at most ``max_idle_s``. The cap never
reorders a session (offsets stay non-decreasing) and leaves gaps <= the cap unchanged.
Pseudo-sessions (``trace.has_sessions`` False) hold independent requests, not a
conversation, so their gaps are never capped.

Closed loop (``closed_loop=True``): the replay, not the trace, decides when a session's
next request is issued: after the previous request's *simulated* completion plus the
request's think time. WEKA's ``t`` already contains the original server time
(``t[i] - t[i-1] ~= api_time[i-1] + think_time[i]``, within 1 s on the bundled data), so
replaying ``t`` and adding simulated latency would count server time twice; closed loop
uses ``think_time`` (the client/tool delay) instead and takes the server time from the
simulation. The arrival model then supplies only session starts (``session_starts``) and
per-request think times (``think_times``); ``schedule`` gives both per request too.
Subagent requests (merged into their parent session by the WEKA loader) are chained in
the session's time order, i.e. parallel subagents are serialised: an approximation that
affects 1.4% of WEKA's requests.

``max_idle_s`` default: 3600 s. WEKA's gaps have median 18 s, p99 2,134 s and max
143,128 s (40 h); one hour keeps 99.5% of gaps exact (the paper preserves intervals) while
bounding the multi-day tails that would push a session's requests far outside any
start window (session span p90 24.0 K s -> 14.7 K s, max 5.1 days -> 21 h; median
unchanged at 3,589 s). It also equals the longest prompt-cache TTL hosted APIs offer, past
which the original session returned to a cold cache anyway. ``None`` disables the cap.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields, replace

import numpy as np

from saria.errors import ConfigError
from saria.traces.model import Trace, TraceRequest, TraceSession

MODES = ("window", "poisson", "trace")
DEFAULT_WINDOW_S = 2 * 3600.0  # the paper's high-pressure setting
DEFAULT_MAX_IDLE_S = 3600.0  # see the module docstring
_KEY = "arrivals"
_UNITS = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "hour": 3600.0, "d": 86400.0, "day": 86400.0}
_NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-z]*)\s*$")


def parse_duration(text: str, *, key: str = _KEY) -> float:
    """``"2h"`` -> 7200.0. Units s, m, h, d (or sec, min, hour, day); bare numbers are seconds."""
    m = _NUMBER.match(text.lower())
    if m is None or (m.group(2) and m.group(2) not in _UNITS):
        raise ConfigError(key, f"bad duration {text!r}; expected e.g. 90s, 40m, 2h, 1d or seconds")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def _parse_rate(text: str) -> float:
    """``"30/h"`` -> 30 sessions per hour; ``/s``, ``/m``, ``/h``, ``/d``; bare = per hour."""
    num, slash, unit = text.partition("/")
    unit = unit.strip().lower() if slash else "h"
    m = _NUMBER.match(num.lower())
    if m is None or m.group(2) or unit not in _UNITS:
        raise ConfigError(_KEY, f"bad Poisson rate {text!r}; expected sessions per time, e.g. 30/h or 0.5/m")
    return float(m.group(1)) * 3600.0 / _UNITS[unit]


@dataclass(frozen=True, slots=True)
class ArrivalModel:
    """How session starts and request times are chosen; see the module docstring.

    ``window_s`` is used by ``window`` mode, ``rate`` (sessions per hour) by ``poisson``
    mode; ``seed`` makes both reproducible. ``max_idle_s`` caps intra-session gaps (and
    closed-loop think times); ``closed_loop`` tells the replay to issue a session's next
    request after the previous one's simulated completion plus its think time.
    """

    mode: str = "window"
    window_s: float = DEFAULT_WINDOW_S
    rate: float | None = None
    seed: int = 0
    max_idle_s: float | None = DEFAULT_MAX_IDLE_S
    closed_loop: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(_KEY, f"unknown arrival mode {self.mode!r}; valid: {', '.join(MODES)}")
        if self.mode == "window" and not (0 < self.window_s < math.inf):
            raise ConfigError(_KEY, f"window must be positive and finite, got {self.window_s!r} s")
        if self.mode == "poisson" and (self.rate is None or not (0 < self.rate < math.inf)):
            raise ConfigError(_KEY, f"Poisson rate must be positive sessions per hour, got {self.rate!r}")
        if self.max_idle_s is not None and not (0 <= self.max_idle_s):
            raise ConfigError(_KEY, f"max idle gap must be >= 0 s or None, got {self.max_idle_s!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(_KEY, f"seed must be a non-negative integer, got {self.seed!r}")

    @property
    def sessions_per_hour(self) -> float | None:
        return self.rate

    @classmethod
    def from_spec(cls, text: str, **overrides: object) -> ArrivalModel:
        """Parse a CLI spec, then apply keyword ``overrides`` (dataclass fields).

        Specs: ``window:2h``, ``window:40m``, ``window:7200`` (seconds), ``poisson:30/h``,
        ``poisson:0.5/m``, ``trace``; optionally followed by comma-separated options
        ``seed=N``, ``max-idle=30m`` (or ``none``), ``closed`` / ``open``. Example:
        ``window:12h,seed=3,max-idle=none,closed``.
        """
        if not isinstance(text, str) or not text.strip():
            raise ConfigError(_KEY, "empty arrival spec; expected one of window:2h, poisson:30/h, trace")
        head, *opts = [part.strip() for part in text.split(",")]
        mode, colon, arg = head.partition(":")
        mode = mode.strip().lower()
        kw: dict[str, object] = {"mode": mode}
        if mode == "window":
            if not arg.strip():
                raise ConfigError(_KEY, f"{text!r}: window needs a length, e.g. window:2h")
            kw["window_s"] = parse_duration(arg)
        elif mode == "poisson":
            if not arg.strip():
                raise ConfigError(_KEY, f"{text!r}: poisson needs a rate, e.g. poisson:30/h")
            kw["rate"] = _parse_rate(arg)
        elif mode == "trace":
            if colon:
                raise ConfigError(_KEY, f"{text!r}: 'trace' takes no argument")
        else:
            raise ConfigError(
                _KEY, f"unknown arrival mode {mode!r} in {text!r}; expected window:2h, poisson:30/h or trace"
            )
        for opt in opts:
            key, eq, value = (s.strip().lower() for s in opt.partition("="))
            if not eq and key in ("closed", "open"):
                kw["closed_loop"] = key == "closed"
            elif eq and key == "seed" and value.isdigit():
                kw["seed"] = int(value)
            elif eq and key in ("max-idle", "max_idle", "idle"):
                kw["max_idle_s"] = None if value in ("none", "off", "inf") else parse_duration(value)
            else:
                raise ConfigError(
                    _KEY, f"bad option {opt!r} in {text!r}; valid: seed=N, max-idle=DURATION|none, closed, open"
                )
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ConfigError(_KEY, f"unknown field {unknown[0]!r}; valid: {', '.join(sorted(names))}")
        return replace(cls(**kw), **overrides)  # type: ignore[arg-type]

    def spec(self) -> str:
        """A spec string that ``from_spec`` parses back to an equal model."""
        if self.mode == "window":
            head = f"window:{self.window_s!r}s"
        elif self.mode == "poisson":
            head = f"poisson:{self.rate!r}/h"
        else:
            head = "trace"
        idle = "none" if self.max_idle_s is None else f"{self.max_idle_s!r}s"
        loop = "closed" if self.closed_loop else "open"
        return f"{head},seed={self.seed},max-idle={idle},{loop}"

    def think_times(self, session: TraceSession) -> np.ndarray:
        return think_times(session, self.max_idle_s)


@dataclass(frozen=True, slots=True)
class ScheduledRequest:
    """One request placed on the replay's clock.

    ``time``: absolute open-loop arrival (s). ``session``: index into ``trace.sessions``;
    ``index``: index in that session's ``requests``. ``think_time``: closed-loop delay
    after the previous request of the session completes (0 for a session's first
    request, which is issued at the session start). ``prev``: position in the schedule
    list of the session's previous request, -1 for its first.
    """

    time: float
    session: int
    index: int
    request: TraceRequest
    think_time: float
    prev: int


def _times(session: TraceSession) -> np.ndarray:
    return np.fromiter((r.time for r in session.requests), dtype=np.float64, count=len(session.requests))


def _removed_idle(times: np.ndarray, max_idle_s: float | None) -> np.ndarray:
    """Seconds the cap removes before each request (cumulative, 0 where nothing is capped)."""
    if max_idle_s is None or times.size < 2:
        return np.zeros(times.size)
    excess = np.maximum(np.diff(times) - max_idle_s, 0.0)
    return np.concatenate(([0.0], np.cumsum(excess)))


def session_offsets(session: TraceSession, max_idle_s: float | None = DEFAULT_MAX_IDLE_S) -> np.ndarray:
    """Request times relative to the session's first request, gaps capped at ``max_idle_s``.

    Non-decreasing; a gap <= the cap is kept exactly, a longer one becomes the cap.
    """
    times = _times(session)
    if times.size == 0:
        return times
    # Subtracting the removed time (rather than summing capped gaps) keeps uncapped
    # times bit-exact, so ``trace`` mode reproduces the trace's own timestamps.
    return (times - times[0]) - _removed_idle(times, max_idle_s)


def think_times(session: TraceSession, max_idle_s: float | None = None) -> np.ndarray:
    """Closed-loop think time per request: ``think_time`` if the trace has it, else the
    gap from the previous request's arrival; 0 for the first request; capped at ``max_idle_s``."""
    reqs = session.requests
    out = np.zeros(len(reqs), dtype=np.float64)
    for i in range(1, len(reqs)):
        r = reqs[i]
        out[i] = r.think_time if r.think_time is not None else reqs[i].time - reqs[i - 1].time
    if max_idle_s is not None:
        np.minimum(out, max_idle_s, out=out)
    return out


def session_starts(trace: Trace, model: ArrivalModel) -> np.ndarray:
    """Absolute start time (s) of each session of ``trace``, in ``trace.sessions`` order.

    Deterministic for a given ``model.seed`` and number of sessions.
    """
    n = trace.num_sessions
    rng = np.random.default_rng(model.seed)
    if model.mode == "window":
        return rng.uniform(0.0, model.window_s, size=n)
    if model.mode == "poisson":
        assert model.rate is not None
        arrivals = np.cumsum(rng.exponential(3600.0 / model.rate, size=n))
        starts = np.empty(n, dtype=np.float64)
        starts[rng.permutation(n)] = arrivals  # file order may correlate with size or date
        return starts
    return np.array([s.requests[0].time if s.requests else 0.0 for s in trace.sessions], dtype=np.float64)


def schedule(trace: Trace, model: ArrivalModel) -> list[ScheduledRequest]:
    """Every request of ``trace`` exactly once, at its open-loop arrival time.

    Sorted by time; ties keep session order, then request order. Each entry also carries
    the closed-loop think time and a link to the session's previous request.
    """
    if model.closed_loop and not trace.has_sessions:
        raise ConfigError(
            _KEY, f"closed loop needs sessions; {trace.name!r} ({trace.format}) holds independent requests"
        )
    cap = model.max_idle_s if trace.has_sessions else None
    starts = session_starts(trace, model)
    times, sess, idx, thinks = [], [], [], []
    for k, s in enumerate(trace.sessions):
        n = len(s.requests)
        t = _times(s)
        shift = starts[k] - t[0] if t.size else 0.0  # 0.0 in trace mode: times stay exact
        times.append(t - _removed_idle(t, cap) + shift)
        sess.append(np.full(n, k, dtype=np.int64))
        idx.append(np.arange(n, dtype=np.int64))
        thinks.append(think_times(s, model.max_idle_s))
    if not times:
        return []
    t, si, ri, th = (np.concatenate(a) for a in (times, sess, idx, thinks))
    order = np.lexsort((ri, si, t))  # last key is primary: time, then session, then index
    pos = np.empty_like(order)
    pos[order] = np.arange(order.size)
    first = np.concatenate(([0], np.cumsum([len(s.requests) for s in trace.sessions])[:-1]))
    out: list[ScheduledRequest] = []
    for j in order.tolist():
        k, i = int(si[j]), int(ri[j])
        prev = int(pos[first[k] + i - 1]) if i else -1
        out.append(ScheduledRequest(float(t[j]), k, i, trace.sessions[k].requests[i], float(th[j]), prev))
    return out
