"""Budget admission: spend the SSD's endurance budget on the blocks worth it most.

An operator buys a drive rated for so many drive writes per day (DWPD) over
its warranty; that rating, not a reuse threshold, is the real constraint.
``BudgetAdmission`` turns it into a write rate -- capacity x DWPD / 86,400 s,
times a fraction (``budget:0.5`` spends half) -- and spends it.

**Value.** Every candidate -- a DRAM victim (``on_evict``), a hybrid context
(``on_context``), a DRAM resident a request touched (``on_access``, an early
write) -- gets a predicted value from its history, both factors learned
online from what the cache sees::

    value = returns per victim of its eviction class (1st, 2nd, 3rd+ eviction)
            x P(a block idle this long still comes back)

The first factor counts, per class, the requests that came back to blocks
that had left DRAM (``on_returns``, from the core, whether the SSD held them
or not: evidence not biased by what this policy chose to write) against the
victims of that class, fading over a day. The second is the survival function
of the *return gaps* the cache has seen (``saria.policy.returns``, kept by the
core and handed over in ``bind``): a victim idle longer than 99% of the gaps
seen lately is worth nothing and never written. On the bundled WEKA slice the
idle time is the signal that matters: victims idle past ~45 min are never
read again (every write-back write in the trace's last 11 hours is wasted).
Left out, on evidence from the same slice: reuse and hits (not monotone in
the chance of a read: blocks reused 1-5 times are read 3x more often than
those reused 25+ times) and context depth (a ``(1 + depth/1024)`` factor
raised the mean TTFT from 10.5 s to 12.5 s).

**Spending.** A token bucket accrues the budget (in capacity units: a block is
one, a hybrid model's checkpoint ``state_units``) and may hold up to
``burst_s`` of it in savings or in debt: the daily rating is an average, so
busy hours may spend what quiet ones save. The share of the candidates bought
is what the budget pays for at the supply's recent rate (candidates per
second in a histogram of values decaying over ``window_s``), scaled by the
bucket's odds ``level / (1 - level)`` against those at ``poise`` (a quarter of
the way up from the debt limit): more with savings, all of it with full
savings, less in debt, none at the limit. The threshold is the lowest value
whose upper tail in the histogram holds that share (a bin of equal values is
bought in proportion, by error diffusion). Two controllers were measured and
dropped: a feedback loop on the threshold oscillated (the supply swings 10x
between hours), and buying everything until most of the debt room was used
left the policy buying first come, first served at the debt limit -- at 180
WEKA sessions it wrote as much as ``E2`` at 5.8x its TTFT. Early writes meet
the same threshold but only while the bucket is in its upper quarter (a
surplus a DRAM that is not yet full would leave idle).

Decisions are made by the one cache core, so the replay and the engine spend
the budget alike; ``state()`` is the engine's metric (rate, threshold, level,
budget used). Nothing is written at creation: a block proves its value first.
"""

from __future__ import annotations

import math

import numpy as np

from saria.errors import ConfigError
from saria.policy.admission import AdmissionPolicy
from saria.policy.returns import DecayedHistogram, ReturnGaps

DAY = 86_400.0


class BudgetAdmission(AdmissionPolicy):
    """Spends ``fraction`` of the drives' DWPD rating; see the module docstring."""

    writes_nothing = False
    wants_returns = True
    wants_evicted_returns = True
    #: victims are told apart by their DRAM evictions: 1, 2, 3+ (class 0, an early
    #: write, is rated as a first victim)
    CLASSES = 4
    #: the bucket level at which the share bought is what the budget pays for
    poise = 0.25
    #: a block idle longer than this share of the returns seen is dead
    alive_quantile = 0.99

    def __init__(self, fraction: float = 1.0, *, dwpd: float = 1.0, burst_s: float = 12 * 3600.0,
                 window_s: float = 6 * 3600.0) -> None:
        if not 0 < fraction <= 10:
            raise ConfigError("admission", f"budget fraction must be in (0, 10], got {fraction}")
        if not dwpd > 0:
            raise ConfigError("dwpd", f"must be positive, got {dwpd}")
        for name, v in (("burst_s", burst_s), ("window_s", window_s)):
            if not v > 0:
                raise ConfigError("admission", f"budget {name} must be positive, got {v}")
        self.fraction = float(fraction)
        self.dwpd = float(dwpd)
        self.burst_s = float(burst_s)
        self.window_s = float(window_s)
        self.name = "budget" if fraction == 1.0 else f"budget:{fraction:g}"
        self.rate = 0.0           # units per second (set by bind)
        self.threshold = 0.0
        self.tokens = 0.0
        self.spent = 0.0          # units admitted since the start
        self._t0: float | None = None
        self._t: float | None = None
        self._values = DecayedHistogram(_VALUE_EDGES, self.window_s)
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

    def on_evict(self, keys, reuse, hits, dram_evictions, now, *, last_access=None, depth=None,
                 on_ssd=None):
        cls = self._classes(dram_evictions)
        self._evicted.add(cls.astype(float), now)
        return self._spend(self._value(cls, now, last_access), now, early=False, skip=on_ssd)

    def on_access(self, keys, reuse, hits, now, *, last_access=None, depth=None, on_ssd=None):
        # a resident written early is read only after it leaves DRAM: rated as a first victim
        cls = np.ones(keys.shape[0], np.int64)
        return self._spend(self._value(cls, now, last_access), now, early=True, skip=on_ssd)

    def on_context(self, reuse, hits, dram_evictions, now, *, last_access=None, depth=0):
        cls = self._classes(np.array([dram_evictions]))
        value = self._value(cls, now, None if last_access is None else np.array([last_access]))
        return bool(self._spend(value, now, early=False)[0])

    def on_returns(self, dram_evictions, now):
        self._returned.add(self._classes(dram_evictions).astype(float), now)

    def tick(self, now: float) -> None:
        self._accrue(now)

    def charge(self, units: float, now: float) -> None:
        """Bytes written on another decision's strength (a checkpoint that
        shares its block's admission) still spend the budget."""
        self._accrue(now)
        self.tokens -= units
        self.spent += units

    # ------------------------------------------------------------- state

    def state(self, now: float | None = None) -> dict[str, float]:
        """Rate, threshold, bucket level and budget use (spent / accrued so
        far), for metrics."""
        elapsed = 0.0 if self._t0 is None or now is None else max(now - self._t0, 0.0)
        accrued = self.rate * elapsed
        return {"budget_units_per_s": self.rate, "threshold": self.threshold,
                "level": self._level(), "tokens": self.tokens, "spent_units": self.spent,
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
        v = self.return_rates()[cls]
        if last_access is not None:
            idle = np.maximum(now - np.asarray(last_access, float), 0.0)
            v = v * self._returns.survival(idle)
            v[idle >= self._returns.quantile(self.alive_quantile)] = 0.0  # dead, by the evidence
        return v

    def _accrue(self, now: float) -> None:
        if self._t is None:
            self._t0 = self._t = now
            return
        dt = max(now - self._t, 0.0)
        self._t = max(now, self._t)
        self.tokens = min(self.tokens + dt * self.rate, self.rate * self.burst_s)

    def _level(self) -> float:
        """0 with all the debt used, 1 with the savings full."""
        span = self.rate * self.burst_s
        return min(max((self.tokens + span) / (2 * span), 0.0), 1.0) if span > 0 else 0.0

    def _share(self, level: float, now: float) -> float:
        """The share of the supply to buy: what the budget pays for at the
        supply's recent rate, times ``2 level / (1 - level)`` -- 1 with the
        bucket at zero, more with savings (all of it when they are full),
        less in debt (none at the limit)."""
        if self._v0 is None or level >= 1.0:
            return 1.0
        tau = self.window_s
        seen = 1.0 - math.exp(-max(now - self._v0, 1.0) / tau)  # a young histogram holds less
        supply = self._values.total / (tau * seen)  # candidates per second, lately
        if supply <= 0:
            return 1.0
        odds = level / (1.0 - level)
        poise = self.poise / (1.0 - self.poise)
        return min(self.rate / supply * odds / poise, 1.0)

    def _spend(self, value: np.ndarray, now: float, early: bool,
               skip: np.ndarray | None = None) -> np.ndarray:
        """Admits the most valuable candidates that reach the threshold while
        the bucket can pay, one unit each; `skip` (already persisted) costs
        nothing and is not a candidate."""
        self._accrue(now)
        out = np.zeros(value.shape[0], dtype=bool)
        if self.rate <= 0 or value.shape[0] == 0:
            return out
        order = np.argsort(-value, kind="stable")  # the most valuable first
        if skip is not None:
            order = order[~np.asarray(skip, bool)[order]]
        order = order[value[order] > 0]  # nothing comes back after this long
        if not early:  # the supply the threshold is a quantile of
            self._values.add(value[order], now)
            if self._v0 is None:
                self._v0 = now
        level = self._level()
        lo, hi, p = self._values.cut(self._share(level, now))
        self.threshold = hi
        if early and level < 0.75:
            return out
        v = value[order]
        take = v >= hi
        edge = np.flatnonzero((v >= lo) & ~take)
        if edge.size:  # a fraction p of the boundary bin, spread evenly (error diffusion)
            acc = self._carry + p * np.arange(1, edge.size + 1)
            take[edge] = np.diff(np.floor(np.concatenate([[self._carry], acc]))) > 0
            self._carry = float(acc[-1] - math.floor(acc[-1]))
        n = min(int(take.sum()), max(int(self.tokens + self.rate * self.burst_s), 0))
        chosen = order[take][:n]  # the most valuable first
        out[chosen] = True
        self.tokens -= n
        self.spent += n
        return out


# Values are products of a probability and small factors: quarter octaves
# from 2^-24 to 2^16.
_VALUE_EDGES = 2.0 ** (np.arange(160) / 4.0 - 24.0)
