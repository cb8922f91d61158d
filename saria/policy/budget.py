"""Budget admission: spend the SSD's endurance budget on the blocks worth it most.

An operator buys a drive rated for so many drive writes per day (DWPD) over
its warranty; that rating, not a reuse threshold, is the real constraint.
``BudgetAdmission`` turns it into a write rate -- capacity x DWPD / 86,400 s,
times a fraction (``budget:0.5`` spends half) -- and spends it.

Three ways of spending it, chosen by what the supply of candidates says
about the rate (each measured over ``window_s``, 6 h, as units per second):

* **Cross-class** (the default). Every candidate -- a DRAM victim
  (``on_evict``), a hybrid context (``on_context``), a DRAM resident a request
  touched (``on_access``, an early write) -- gets a predicted value from its
  history, both factors learned online from what the cache sees::

      value = returns per victim of its eviction class (1st, 2nd, 3rd+ eviction)
              x P(a block idle this long still comes back)

  The first factor counts, per class, the requests that came back to blocks
  that had left DRAM (``on_returns``, from the core, whether the SSD held
  them or not) against the victims of that class, fading over a day. The
  second is the survival function of the *return gaps* the cache has seen
  (``saria.policy.returns``, kept by the core and handed over in ``bind``): a
  victim idle longer than 99% of the gaps seen lately is dead and not
  written. A token bucket accrues the budget and may hold up to ``burst_s``
  of it in savings or in debt; the share of the candidates bought is what
  the budget pays for at the supply's recent rate, scaled by the bucket's
  odds ``level / (1 - level)`` against those at ``poise`` (a quarter of the
  way up from the debt limit); the threshold is the lowest value whose upper
  tail in the histogram of recent values holds that share (a bin of equal
  values is bought in proportion, by error diffusion). Early writes meet the
  same threshold but only while the bucket is in its upper quarter. Where
  the budget has room beyond what ``E2`` writes this wins: on the WEKA
  default slice 84% of the budget for a mean TTFT within 15% of full
  duplicate's, at a 6 h window 0.44x ``E2``'s TTFT.
* **Class first**, while the *proven* supply -- victims evicted for the
  second time, on the SSD or not -- is at least ``proven_high`` (60%) of the
  rate (back to cross-class below ``proven_low``, 50%). Then the budget
  binds on what ``E2`` writes and ``E2``'s rule picks better victims than
  the learned value: the policy writes the victims evicted twice or more,
  most evictions first, and nothing else (no first victim, no early write).
  The bar is below 100% because cross-class buying hides the proven supply:
  a victim written at its first eviction is read back from the SSD instead
  of being recomputed into DRAM, so it is not evicted from DRAM a second
  time (at 180 WEKA sessions the count reads about 0.7 of the rate in hours
  2-6, where ``E2`` writes 1.0-2.0 times the rate; on the default slice it
  never passes 0.2).
* **At creation**, while writing every block as it is created costs at most
  ``create_share`` (100%) of the rate, measured for ``create_young_s`` (2 h:
  an engine's first hours ramp up: on the default slice the first two
  hours cost less than the rate, and writing at creation there, from the
  tenth minute, spent 1.1% more of the budget for 0.16 s more mean TTFT),
  the bucket is not in debt and the policy is not class first. A block written at creation is on the SSD at eviction, so
  its eviction costs nothing more: where the budget pays for full
  duplicate's writes, the policy writes what full duplicate writes (two
  SSDs; Qwen3.5-9B, whose state checkpoints are worth most when written as
  they are computed: with 16 GB of DRAM, 1.23 s against write-back's 21.7 s).
  In the engine a budget takes no staging slots (``writes_on_create`` is
  off: they would cost an eighth of DRAM for a mode that may never start),
  so there the blocks written at creation are those DRAM keeps.

**The guarantee.** Whatever the mode, the hard limit is a sliding window of
``day_s`` (24 h): a candidate is bought only while the units written in the
last ``day_s`` leave room for it (a hybrid checkpoint charged after its
context or its creation was admitted may overdraw by that one checkpoint
and its context's blocks). Hence

    for every t:  written in (t - day_s, t] <= rate x day_s

-- never above the rating over any window of a day, and over any window of
length T at most ``rate x (T + day_s)``: the room over the rating is one day
of it (the replay reports the largest excess as ``write_excess_h`` and the
largest day as ``write_day_peak_fraction``). A replay shorter than a day can
therefore use more than 100% of the rating *over its own length* (the
one-hour Mooncake share: 4.8x, 20% of a day's rating).

Decisions are made by the one cache core, so the replay and the engine spend
the budget alike; ``state()`` is the engine's metric (rate, threshold, level,
the day's room, the mode, budget used). Each decision is a few numpy calls
over its batch (one sort, one histogram add) and a few scalar updates.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from saria.errors import ConfigError
from saria.policy.admission import AdmissionPolicy
from saria.policy.returns import DecayedHistogram, ReturnGaps

DAY = 86_400.0


class _Rate:
    """Units per second lately: a count whose observations fade over `tau`,
    over the time it has been watched (a young count holds less)."""

    __slots__ = ("tau", "total", "t", "t0")

    def __init__(self, tau: float) -> None:
        self.tau = tau
        self.total = 0.0
        self.t: float | None = None
        self.t0: float | None = None

    def add(self, units: float, now: float) -> None:
        if self.t is None:
            self.t0 = self.t = now
        elif now > self.t:
            self.total *= math.exp(-(now - self.t) / self.tau)
            self.t = now
        self.total += units

    def watched(self, now: float) -> float:
        return 0.0 if self.t0 is None else now - self.t0

    def per_s(self, now: float) -> float:
        if self.t0 is None:
            return 0.0
        self.add(0.0, now)
        seen = 1.0 - math.exp(-max(now - self.t0, 1.0) / self.tau)
        return self.total / (self.tau * seen)


class BudgetAdmission(AdmissionPolicy):
    """Spends ``fraction`` of the drives' DWPD rating; see the module docstring."""

    writes_nothing = False
    #: no staging slots in the engine (an eighth of DRAM, for a mode that may
    #: never start): there a block DRAM does not keep is not written at creation
    writes_on_create = False
    wants_returns = True
    wants_evicted_returns = True
    #: victims are told apart by their DRAM evictions: 1, 2, 3+ (class 0, an early
    #: write, is rated as a first victim)
    CLASSES = 4
    #: the bucket level at which the share bought is what the budget pays for
    poise = 0.25
    #: a block idle longer than this share of the returns seen is dead
    alive_quantile = 0.99
    #: the bucket level above which early writes and the dead may be bought
    surplus = 0.75
    #: class first once the proven supply (victims evicted twice or more) is
    #: this share of the rate, cross-class again below proven_low
    proven_high = 0.6
    proven_low = 0.5
    #: written at creation while creating costs at most this share of the rate
    create_share = 1.0
    #: a supply's rate is trusted once it has been watched this long
    young_s = 600.0
    #: ... the cost of writing at creation, this long
    create_young_s = 7200.0

    def __init__(self, fraction: float = 1.0, *, dwpd: float = 1.0, burst_s: float = 12 * 3600.0,
                 window_s: float = 6 * 3600.0, day_s: float = DAY) -> None:
        if not 0 < fraction <= 10:
            raise ConfigError("admission", f"budget fraction must be in (0, 10], got {fraction}")
        if not dwpd > 0:
            raise ConfigError("dwpd", f"must be positive, got {dwpd}")
        for name, v in (("burst_s", burst_s), ("window_s", window_s), ("day_s", day_s)):
            if not v > 0:
                raise ConfigError("admission", f"budget {name} must be positive, got {v}")
        self.fraction = float(fraction)
        self.dwpd = float(dwpd)
        self.burst_s = float(burst_s)
        self.window_s = float(window_s)
        self.day_s = float(day_s)
        self.name = "budget" if fraction == 1.0 else f"budget:{fraction:g}"
        self.rate = 0.0           # units per second (set by bind)
        self.threshold = 0.0
        self.tokens = 0.0
        self.spent = 0.0          # units admitted since the start
        self.class_first = False  # the proven supply fills the rate
        self.created = 0.0        # units admitted at creation (in spent)
        self.proven_first = 0.0   # units admitted class first (in spent)
        self._t0: float | None = None
        self._t: float | None = None
        self._recent: deque[tuple[float, float]] = deque()  # (time, units) in the last day
        self._in_day = 0.0        # units in _recent
        self._values = DecayedHistogram(_VALUE_EDGES, self.window_s)
        self._proven = _Rate(self.window_s)   # victims evicted twice or more, not on the SSD
        self._created = _Rate(self.window_s)  # units writing at creation would cost
        self._created_at: float | None = None  # the last admission at creation
        self._returns = ReturnGaps()  # replaced by the core's in bind
        self._v0: float | None = None  # the supply's first candidate
        self._carry = 0.0  # error diffusion over the threshold's bin
        # victims and returns after eviction, per eviction class, fading over a day
        self._evicted = DecayedHistogram(np.arange(float(self.CLASSES)), DAY)
        self._returned = DecayedHistogram(np.arange(float(self.CLASSES)), DAY)

    # ---------------------------------------------------------------- set-up

    def bind(self, *, ssd_units: int, state_units: int = 0,
             returns: ReturnGaps | None = None) -> None:
        """Called by the cache core with the SSD tier's capacity in units and
        its record of return gaps."""
        self.rate = ssd_units * self.dwpd * self.fraction / DAY
        if returns is not None:
            self._returns = returns

    # ----------------------------------------------------------- decisions

    def on_create(self, keys, now):
        self._accrue(now)
        n = keys.shape[0]
        self._created.add(n, now)
        out = np.zeros(n, dtype=bool)
        if n == 0 or not self._create_room(now):
            return out
        k = min(n, max(int(self._room()), 0))
        out[:k] = True
        self._pay(k, now)
        self.created += k
        self._created_at = now
        return out

    def on_evict(self, keys, reuse, hits, dram_evictions, now, *, last_access=None, depth=None,
                 on_ssd=None):
        cls = self._classes(dram_evictions)
        self._evicted.add(cls.astype(float), now)
        return self._spend(cls, self._value(cls, now, last_access), now, early=False, skip=on_ssd)

    def on_access(self, keys, reuse, hits, now, *, last_access=None, depth=None, on_ssd=None):
        # a resident written early is read only after it leaves DRAM: rated as a first victim
        cls = np.ones(keys.shape[0], np.int64)
        return self._spend(cls, self._value(cls, now, last_access), now, early=True, skip=on_ssd)

    def on_context(self, reuse, hits, dram_evictions, now, *, last_access=None, depth=0):
        cls = self._classes(np.array([dram_evictions]))
        value = self._value(cls, now, None if last_access is None else np.array([last_access]))
        return bool(self._spend(cls, value, now, early=False)[0])

    def on_returns(self, dram_evictions, now):
        self._returned.add(self._classes(dram_evictions).astype(float), now)

    def tick(self, now: float) -> None:
        self._accrue(now)

    def charge(self, units: float, now: float) -> None:
        """Bytes written on another decision's strength (a checkpoint that
        shares its block's admission) still spend the budget."""
        self._accrue(now)
        if now == self._created_at:  # a checkpoint written at creation
            self._created.add(units, now)
        self._pay(units, now)

    # ------------------------------------------------------------- state

    def state(self, now: float | None = None) -> dict[str, float]:
        """Rate, threshold, bucket level, the day's room and budget use
        (spent / accrued so far), for metrics."""
        elapsed = 0.0 if self._t0 is None or now is None else max(now - self._t0, 0.0)
        accrued = self.rate * elapsed
        return {"budget_units_per_s": self.rate, "threshold": self.threshold,
                "level": self._level(), "tokens": self.tokens, "spent_units": self.spent,
                "day_room_units": self._room(), "class_first": float(self.class_first),
                "created_units": self.created, "class_first_units": self.proven_first,
                "budget_used": self.spent / accrued if accrued > 0 else 0.0}

    # ------------------------------------------------------------- helpers

    def return_rates(self) -> np.ndarray:
        """Returns after eviction per victim, per eviction class (1, 2, 3+;
        the unused class 0 mirrors class 1), smoothed toward the pooled
        figure: a class with few victims has little evidence."""
        ev, back = self._evicted.counts, self._returned.counts
        pooled = (back.sum() + 1.0) / (ev.sum() + 1.0)
        rate = (back + self.PRIOR * pooled) / (ev + self.PRIOR)
        rate[0] = rate[1]
        return rate

    PRIOR = 100.0  # pseudo-victims at the pooled rate, per class

    def _classes(self, dram_evictions) -> np.ndarray:
        return np.minimum(np.asarray(dram_evictions, np.int64), self.CLASSES - 1)

    def _value(self, cls: np.ndarray, now: float, last_access) -> np.ndarray:
        """Returns per victim of the class x survival; -1 for the dead."""
        v = self.return_rates()[cls]
        if last_access is not None:
            idle = np.maximum(now - np.asarray(last_access, float), 0.0)
            v = v * self._returns.survival(idle)
            v[idle >= self._returns.quantile(self.alive_quantile)] = -1.0  # dead, by the evidence
        return v

    def _accrue(self, now: float) -> None:
        if self._t is None:
            self._t0 = self._t = now
            return
        dt = max(now - self._t, 0.0)
        self._t = max(now, self._t)
        self.tokens = min(self.tokens + dt * self.rate, self.rate * self.burst_s)
        cut = now - self.day_s  # forget what was written a day ago or earlier
        recent = self._recent
        while recent and recent[0][0] <= cut:
            self._in_day -= recent.popleft()[1]
        if not recent:
            self._in_day = 0.0  # no drift from the running sum

    def _pay(self, units: float, now: float) -> None:
        if units > 0:
            self.tokens = max(self.tokens - units, -self.rate * self.burst_s)
            self.spent += units
            self._recent.append((now, float(units)))
            self._in_day += units

    def _room(self) -> float:
        """Units the day's window still allows."""
        return self.rate * self.day_s - self._in_day

    def _level(self) -> float:
        """0 with all the debt used, 1 with the savings full."""
        span = self.rate * self.burst_s
        return min(max((self.tokens + span) / (2 * span), 0.0), 1.0) if span > 0 else 0.0

    def _create_room(self, now: float) -> bool:
        """Writing at creation fits: what it costs lately is within
        ``create_share`` of the rate, the bucket is not in debt and the
        proven supply does not fill the rate."""
        return (not self.class_first and self._created.watched(now) >= self.create_young_s
                and self.tokens >= 0.0
                and self._created.per_s(now) <= self.create_share * self.rate)

    def _supply(self, now: float) -> float:
        """Candidates per second lately (the histogram's)."""
        tau = self.window_s
        seen = 1.0 - math.exp(-max(now - self._v0, 1.0) / tau)  # a young histogram holds less
        return self._values.total / (tau * seen)

    def _share(self, level: float, now: float) -> float:
        """The share of the supply to buy: what the budget pays for at the
        supply's recent rate, times ``2 level / (1 - level)`` -- 1 with the
        bucket at zero, more with savings (all of it when they are full),
        less in debt (none at the limit)."""
        if self._v0 is None or level >= 1.0:
            return 1.0
        supply = self._supply(now)
        if supply <= 0:
            return 1.0
        odds = level / (1.0 - level)
        poise = self.poise / (1.0 - self.poise)
        return min(self.rate / supply * odds / poise, 1.0)

    def _mode(self, now: float) -> None:
        """Class first while the proven supply fills the rate."""
        if self._proven.watched(now) < self.young_s or self.rate <= 0:
            return
        p = self._proven.per_s(now) / self.rate
        if self.class_first:
            self.class_first = p >= self.proven_low
        else:
            self.class_first = p >= self.proven_high

    def _spend(self, cls: np.ndarray, value: np.ndarray, now: float, early: bool,
               skip: np.ndarray | None = None) -> np.ndarray:
        """Admits candidates while the bucket and the day's window can pay,
        one unit each; `skip` (already persisted) costs nothing and is not a
        candidate."""
        self._accrue(now)
        out = np.zeros(value.shape[0], dtype=bool)
        if self.rate <= 0 or value.shape[0] == 0:
            return out
        order = np.argsort(-value, kind="stable")  # the most valuable first
        if skip is not None:
            order = order[~np.asarray(skip, bool)[order]]
        v = value[order]
        live = v > 0
        if not early:  # the supply the threshold is a quantile of
            self._values.add(v[live], now)
            self._proven.add(float(np.count_nonzero(cls == 2)), now)
            if self._v0 is None:
                self._v0 = now
            self._mode(now)
        room = max(int(self._room()), 0)
        if self.class_first:  # the proven, most evictions first; nothing else
            if early:
                return out
            c = cls[order]
            proven = order[np.argsort(-c, kind="stable")]
            proven = proven[cls[proven] >= 2][:room]
            out[proven] = True
            self._pay(proven.size, now)
            self.proven_first += proven.size
            return out
        level = self._level()
        share = self._share(level, now)
        lo, hi, p = self._values.cut(share)
        self.threshold = hi
        if early and level < self.surplus:
            return out
        take = live & (v >= hi)
        edge = np.flatnonzero(live & (v >= lo) & ~take)
        if edge.size:  # a fraction p of the boundary bin, spread evenly (error diffusion)
            acc = self._carry + p * np.arange(1, edge.size + 1)
            take[edge] = np.diff(np.floor(np.concatenate([[self._carry], acc]))) > 0
            self._carry = float(acc[-1] - math.floor(acc[-1]))
        n = min(int(take.sum()), max(int(self.tokens + self.rate * self.burst_s), 0), room)
        chosen = order[take][:n]  # the most valuable first
        out[chosen] = True
        self._pay(n, now)
        return out


# Values are products of a probability and small factors: quarter octaves
# from 2^-24 to 2^16.
_VALUE_EDGES = 2.0 ** (np.arange(160) / 4.0 - 24.0)
