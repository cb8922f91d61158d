"""Budget admission: spend the SSD's endurance budget on the blocks worth it most.

An operator buys a drive rated for so many drive writes per day (DWPD) over
its warranty; that rating, not a reuse threshold, is the real constraint.
``BudgetAdmission`` turns it into a write rate -- capacity x DWPD / 86,400 s,
times a fraction (``budget:0.5`` spends half) -- and spends it on the
candidates most likely to be read before the SSD itself evicts them.

**Value: the expected reads of a write before the SSD's own horizon.** An
SSD block written now is evicted by the SSD tier's LRU once the tier has
taken its capacity in newer writes: at this policy's write rate that is
``H = ssd_units / rate`` seconds (a day at 1 DWPD). A candidate -- a DRAM
victim (``on_evict``), a hybrid context (``on_context``), a DRAM resident a
request touched (``on_access``, an early write) -- is ranked by

    value = class + P(a return in (t, t + H] | idle t so far)

``class`` is its DRAM evictions (1, 2, ..., 5+; an early write or a
superseded checkpoint is a first victim): a block evicted k times came back
k - 1 times after leaving DRAM, the strongest evidence the cache has that a
request will come back again. The second term, in [0, 1), is learned from the
return gaps the cache sees (``saria.policy.returns``, kept by the core):
``S(t) - S(t + H)``, the share of the gaps seen lately that are longer than
the candidate's idle time ``t`` and end within the SSD's horizon. A candidate
idle longer than 99% of the gaps seen is *dead* -- worth ``class / 1000``: it
is written only from a surplus (see below). So a class always outranks
the class below it, and within a class the live and recent go first.

SARIA's eviction gate falls out as a special case: when the budget pays for
the supply of victims evicted twice or more and no more, the threshold sits at
2 and the policy writes exactly what ``E2`` writes; with more room it adds the
best first victims, with less it keeps to ``E3``'s, ``E5``'s ... and the most
recent of the class at the edge. Two other values were measured and dropped
(experiment 8's notes): a learned return rate per class times survival let a
fresh first victim outrank an older second one, and at 180 WEKA sessions
picked worse than ``E2`` (13.7% of tokens from the SSD out of 3.54 TB written
against E2's 18.3% out of 3.84 TB); reuse and hits are not monotone in the
chance of a read on the bundled slices, and depth made it worse.

**Spending: the drive's day, paced.** The rating is a day's writes, so the
hard limit is a sliding window of ``day_s`` (24 h): a candidate is bought only
while the units written in the last ``day_s`` leave room for it (a hybrid
checkpoint charged after its context was admitted may overdraw by that one
context). Hence the guarantee:

    for every t:  written in (t - day_s, t] <= rate x day_s

-- never above the rating over any window of a day (a replay of a day or
less never writes more than a day's rating; ``write_day_peak_fraction`` in
the replay's report), and over any window of length T at most ``rate x (T +
day_s)``: its room over the rating is one day of it (``write_excess_h``
measures the largest excess). A replay shorter than a day can therefore use
more than 100% of the rating *over its own length*: the one-hour Mooncake
share writes at 3.7x the rating, 15% of a day's. The
window lets a burst borrow the rest of the day; the pacing keeps a load from
spending the day before it knows what the day brings:

* the share of the candidates bought is what the rate pays for at the
  supply's recent rate (candidates per second, a histogram of values decaying
  over ``window_s``), times ``pace x level`` (2 x the share of the day's room
  left): twice the rate's share with the day untouched, the rate's share
  with half of it left, none at the limit (until the supply has been watched
  for ``young_s``, 10 min, it has no rate yet and the room alone limits:
  an engine's first minutes). The threshold is the lowest
  value whose upper tail in the histogram holds that share (a bin of equal
  values is bought in proportion, by error diffusion);
* first victims (with the dead and early writes, rated as first victims) are
  paced on their own, at ``first_share`` (50%) of the rate since the first
  request plus a lead of ``first_lead_s`` (6 h of it), and never use the room
  kept for the proven (victims evicted twice or more): half the day's, or 1.5
  days of the proven supply at its recent rate if more. At 180 WEKA sessions
  the second evictions come in a wave ten hours in that ``E2`` writes at 11 h
  of the rating in two hours; a day spent on first victims before it leaves
  nothing for the victims that matter;
* victims evicted twice or more -- what ``E2`` writes -- are all bought while
  a quarter of the day's room is left (``proven_level``), whatever the share:
  the policy writes a superset of ``E2``'s writes wherever they fit in
  three quarters of the day;
* the dead and early writes are bought only while three quarters of the
  day's room is left: a surplus, not a bet.

Decisions are made by the one cache core, so the replay and the engine spend
the budget alike; ``state()`` is the engine's metric (rate, threshold, level,
budget used). Nothing is written at creation: a block proves its value first.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from saria.errors import ConfigError
from saria.policy.admission import AdmissionPolicy
from saria.policy.returns import DecayedHistogram, ReturnGaps

DAY = 86_400.0


class BudgetAdmission(AdmissionPolicy):
    """Spends ``fraction`` of the drives' DWPD rating; see the module docstring."""

    writes_nothing = False
    wants_returns = True
    #: a victim's class is its DRAM evictions, capped here (E2 .. E5 fall out)
    CLASSES = 5
    #: a block idle longer than this share of the returns seen is dead
    alive_quantile = 0.99
    #: the day's room left above which the dead and early writes may be bought
    surplus_level = 0.75
    #: room kept for the proven (evicted 2+ times), in days of their recent supply
    reserve_x = 1.5
    #: ... and at least this share of the day's room
    reserve_floor = 0.5
    #: first victims are paced at this share of the rate (since the first
    #: request, with a lead of first_lead_s)
    first_share = 0.5
    first_lead_s = 6 * 3600.0
    #: the share bought is the rate's share x pace x the day's room left
    pace = 2.0
    #: the supply's rate is estimated once it has been watched this long
    young_s = 600.0
    #: victims evicted twice or more are all bought while this share of the day's room is left
    proven_level = 0.25

    def __init__(self, fraction: float = 1.0, *, dwpd: float = 1.0, day_s: float = DAY,
                 window_s: float = 6 * 3600.0) -> None:
        if not 0 < fraction <= 10:
            raise ConfigError("admission", f"budget fraction must be in (0, 10], got {fraction}")
        if not dwpd > 0:
            raise ConfigError("dwpd", f"must be positive, got {dwpd}")
        for name, v in (("day_s", day_s), ("window_s", window_s)):
            if not v > 0:
                raise ConfigError("admission", f"budget {name} must be positive, got {v}")
        self.fraction = float(fraction)
        self.dwpd = float(dwpd)
        self.day_s = float(day_s)
        self.window_s = float(window_s)
        self.name = "budget" if fraction == 1.0 else f"budget:{fraction:g}"
        self.rate = 0.0           # units per second (set by bind)
        self.horizon_s = math.inf  # the SSD tier's LRU horizon at the rate (set by bind)
        self.threshold = 0.0
        self.spent = 0.0          # units admitted since the start
        self._t0: float | None = None
        self._recent: deque[tuple[float, float]] = deque()  # (time, units) in the last day
        self._in_day = 0.0        # units in _recent
        self._values = DecayedHistogram(_VALUE_EDGES, self.window_s)
        self._proven = DecayedHistogram(np.zeros(1), self.window_s)  # victims evicted 2+ times
        self._returns = ReturnGaps()  # replaced by the core's in bind
        self._v0: float | None = None  # the supply's first candidate
        self._carry = 0.0  # error diffusion over the threshold's bin
        self._first = 0.0  # units spent on first victims (and the dead, and early writes)

    # ---------------------------------------------------------------- set-up

    def bind(self, *, ssd_units: int, state_units: int = 0,
             returns: ReturnGaps | None = None) -> None:
        """Called by the cache core with the SSD tier's capacity in units and
        its record of return gaps."""
        self.rate = ssd_units * self.dwpd * self.fraction / DAY
        self.horizon_s = ssd_units / self.rate if self.rate > 0 else math.inf
        if returns is not None:
            self._returns = returns

    # ----------------------------------------------------------- decisions

    def on_evict(self, keys, reuse, hits, dram_evictions, now, *, last_access=None, depth=None,
                 on_ssd=None):
        value = self.value(dram_evictions, now, last_access)
        return self._spend(value, now, early=False, skip=on_ssd)

    def on_access(self, keys, reuse, hits, now, *, last_access=None, depth=None, on_ssd=None):
        self._age(now)
        if self._level() < self.surplus_level:  # no surplus: nothing is written early
            return np.zeros(keys.shape[0], dtype=bool)
        # a resident written early is read only after it leaves DRAM: a first victim
        value = self.value(np.ones(keys.shape[0], np.int64), now, last_access)
        return self._spend(value, now, early=True, skip=on_ssd)

    def on_context(self, reuse, hits, dram_evictions, now, *, last_access=None, depth=0):
        value = self.value(np.array([dram_evictions]), now,
                           None if last_access is None else np.array([last_access]))
        return bool(self._spend(value, now, early=False)[0])

    def tick(self, now: float) -> None:
        self._age(now)

    def charge(self, units: float, now: float) -> None:
        """Bytes written on another decision's strength (a checkpoint that
        shares its block's admission) still spend the budget."""
        self._age(now)
        self._write(units, now)

    # ------------------------------------------------------------- state

    def state(self, now: float | None = None) -> dict[str, float]:
        """Rate, threshold, bucket level and budget use (spent / accrued so
        far), for metrics."""
        elapsed = 0.0 if self._t0 is None or now is None else max(now - self._t0, 0.0)
        accrued = self.rate * elapsed
        return {"budget_units_per_s": self.rate, "threshold": self.threshold,
                "level": self._level(), "room_units": self._room(), "spent_units": self.spent,
                "budget_used": self.spent / accrued if accrued > 0 else 0.0}

    # ------------------------------------------------------------- value

    def value(self, dram_evictions, now: float, last_access) -> np.ndarray:
        """``class + P(a return within the SSD's horizon | idle so far)``;
        ``class / 1000`` for the dead (see the module docstring)."""
        cls = np.clip(np.asarray(dram_evictions, np.int64), 1, self.CLASSES).astype(float)
        if last_access is None:
            return cls
        idle = np.maximum(now - np.asarray(last_access, float), 0.0)
        r = self._returns
        live = r.survival(idle)
        if math.isfinite(self.horizon_s):
            live = live - r.survival(idle + self.horizon_s)
        live = np.clip(live, 0.0, 0.999)
        dead = idle >= r.quantile(self.alive_quantile)
        return np.where(dead, cls / 1000.0, cls + live)

    # ------------------------------------------------------------- the day

    def _age(self, now: float) -> None:
        """Forgets what was written a day ago or earlier."""
        if self._t0 is None:
            self._t0 = now
        cut = now - self.day_s
        recent = self._recent
        while recent and recent[0][0] <= cut:
            self._in_day -= recent.popleft()[1]
        if not recent:
            self._in_day = 0.0  # no drift from the running sum

    def _write(self, units: float, now: float) -> None:
        if units > 0:
            self._recent.append((now, float(units)))
            self._in_day += units
            self.spent += units

    def _room(self) -> float:
        """Units the day's window still allows."""
        return self.rate * self.day_s - self._in_day

    def _level(self) -> float:
        """The share of the day's room left: 1 with nothing written in the
        last day, 0 at the limit."""
        full = self.rate * self.day_s
        return min(max(self._room() / full, 0.0), 1.0) if full > 0 else 0.0

    def _reserve(self, now: float) -> float:
        """Room kept for victims evicted twice or more: half the day's, or
        ``reserve_x`` times what their recent supply would take over a day
        if more (at most the whole day)."""
        floor = self.reserve_floor * self.rate * self.day_s
        if self._v0 is None:
            return floor
        tau = self.window_s
        seen = 1.0 - math.exp(-max(now - self._v0, 1.0) / tau)
        self._proven.add(np.zeros(0), now)
        rate = self._proven.total / (tau * seen)
        return min(max(self.reserve_x * rate * self.day_s, floor), self.rate * self.day_s)

    def _share(self, level: float, now: float) -> float:
        """The share of the supply to buy: what the rate pays for at the
        supply's recent rate, times ``2 x level``."""
        if self._v0 is None or now - self._v0 < self.young_s:
            return 1.0  # no rate of the supply yet: buy what the room allows
        if level <= 0.0:
            return 0.0
        tau = self.window_s
        seen = 1.0 - math.exp(-max(now - self._v0, 1.0) / tau)  # a young histogram holds less
        supply = self._values.total / (tau * seen)  # candidates per second, lately
        if supply <= 0:
            return 1.0
        return min(self.rate / supply * self.pace * level, 1.0)

    def _spend(self, value: np.ndarray, now: float, early: bool,
               skip: np.ndarray | None = None) -> np.ndarray:
        """Admits the most valuable candidates that reach the threshold while
        the day's window has room, one unit each; `skip` (already persisted)
        costs nothing and is not a candidate."""
        self._age(now)
        out = np.zeros(value.shape[0], dtype=bool)
        if self.rate <= 0 or value.shape[0] == 0:
            return out
        order = np.argsort(-value, kind="stable")  # the most valuable first
        if skip is not None:
            order = order[~np.asarray(skip, bool)[order]]
        if not early:  # the supply the threshold is a quantile of
            self._values.add(value[order], now)
            self._proven.add(np.zeros(int((value[order] >= 2.0).sum())), now)
            if self._v0 is None:
                self._v0 = now
        level = self._level()
        lo, hi, p = self._values.cut(self._share(level, now))
        self.threshold = hi
        if early and level < self.surplus_level:
            return out
        v = value[order]
        take = v >= hi
        if level >= self.proven_level:  # the proven while a quarter of the day is left
            take |= v >= 2.0
        edge = np.flatnonzero((v >= lo) & ~take)
        if edge.size:  # a fraction p of the boundary bin, spread evenly (error diffusion)
            acc = self._carry + p * np.arange(1, edge.size + 1)
            take[edge] = np.diff(np.floor(np.concatenate([[self._carry], acc]))) > 0
            self._carry = float(acc[-1] - math.floor(acc[-1]))
        if level < self.surplus_level:
            take &= v >= _LIVE  # the dead only from a surplus
        room = self._room()
        n = min(int(take.sum()), max(int(room), 0))
        first = np.flatnonzero(take & (v < 2.0))
        if first.size:  # first victims only from the room the proven ones will not need
            paced = self.first_share * self.rate * (now - self._t0 + self.first_lead_s)
            spare = max(int(min(room - self._reserve(now), paced - self._first)), 0)
            if first.size > spare:
                take[first[spare:]] = False
                n = min(int(take.sum()), n)
        chosen = order[take][:n]  # the most valuable first
        out[chosen] = True
        self._write(n, now)
        self._first += int((v[take][:n] < 2.0).sum())
        return out


# Values lie in [0.001, CLASSES + 1): the dead in [0, 0.01), then 32 bins per
# class (the resolution of the live term).
_LIVE = 1.0  # the lowest live value (a first victim with no chance left)
_VALUE_EDGES = np.concatenate([[0.0], np.arange(1, 1 + 32 * (BudgetAdmission.CLASSES + 1))
                               / 32.0])
