"""Budget admission: spend the SSD's endurance budget on the blocks worth it most.

An operator buys a drive rated for so many drive writes per day (DWPD) over
its warranty; that rating, not a reuse threshold, is the real constraint.
``BudgetAdmission`` turns it into a write rate -- capacity x DWPD / 86,400 s,
times a fraction (``budget:0.5`` spends half) -- and spends it:

* a **token bucket** accrues the budget (in capacity units: a block is one, a
  hybrid model's checkpoint ``state_units``); it holds at most a day's budget
  and may go into debt by at most ``burst_s`` of it, repaid by later
  accrual, so the write rate converges to the budget over the day while bursts
  go through;
* every candidate -- a DRAM victim (``on_evict``), a DRAM resident a request
  touched (``on_access``, an early write) -- gets a **predicted value** from
  its history: ``(1 + reuse) * (1 + dram_evictions) * (1 + depth / 1024)``
  over ``1 + idle / half_life_s``: reused blocks, blocks that came back after
  an eviction and deep blocks (long contexts, the costliest to recompute) are
  worth more; a block idle for long (a session that ended) is worth less;
* a candidate is written when its value reaches a **threshold** and the
  bucket can pay; the threshold adapts online: it falls while the bucket
  fills (budget left unspent) and rises while it drains, so the spend tracks
  the budget and goes to the best candidates of the moment. Early writes
  (``on_access``) only spend a surplus (the bucket more than half full).

Decisions are made by the one cache core, so the replay and the engine spend
the budget alike; ``state()`` is the engine's metric (rate, threshold, budget
used). Nothing is written at creation: a block proves its value first.
"""

from __future__ import annotations

import math

import numpy as np

from saria.errors import ConfigError
from saria.policy.admission import AdmissionPolicy

DAY = 86_400.0


class BudgetAdmission(AdmissionPolicy):
    """Spends ``fraction`` of the drives' DWPD rating; see the module docstring."""

    writes_nothing = False

    def __init__(self, fraction: float = 1.0, *, dwpd: float = 1.0, half_life_s: float = 600.0,
                 burst_s: float = 3600.0, gain: float = 1.0, adapt_s: float = 600.0) -> None:
        if not 0 < fraction <= 10:
            raise ConfigError("admission", f"budget fraction must be in (0, 10], got {fraction}")
        if not dwpd > 0:
            raise ConfigError("dwpd", f"must be positive, got {dwpd}")
        self.fraction = float(fraction)
        self.dwpd = float(dwpd)
        self.half_life_s = float(half_life_s)
        self.burst_s = float(burst_s)
        self.gain = float(gain)
        self.adapt_s = float(adapt_s)
        self.name = "budget" if fraction == 1.0 else f"budget:{fraction:g}"
        self.rate = 0.0           # units per second (set by bind)
        self.state_units = 0
        self.threshold = 1.0
        self.tokens = 0.0
        self.spent = 0.0          # units admitted since the start
        self._t0: float | None = None
        self._t: float | None = None
        self._adapted: float | None = None  # the threshold's last update

    # ---------------------------------------------------------------- set-up

    def bind(self, *, ssd_units: int, state_units: int = 0) -> None:
        """Called by the cache core with the SSD tier's capacity in units."""
        self.rate = ssd_units * self.dwpd * self.fraction / DAY
        self.state_units = state_units

    # ----------------------------------------------------------- decisions

    def on_evict(self, keys, reuse, hits, dram_evictions, now, *, last_access=None, depth=None,
                 on_ssd=None):
        value = self._value(reuse, dram_evictions, now, last_access, depth)
        return self._spend(value, now, surplus_only=False, skip=on_ssd)

    def on_access(self, keys, reuse, hits, now, *, last_access=None, depth=None, on_ssd=None):
        value = self._value(reuse, np.zeros_like(reuse), now, last_access, depth)
        return self._spend(value, now, surplus_only=True, skip=on_ssd)

    def on_context(self, reuse, hits, dram_evictions, now, *, last_access=None, depth=0):
        value = self._value(np.array([reuse]), np.array([dram_evictions]), now,
                            None if last_access is None else np.array([last_access]),
                            np.array([depth]))
        return bool(self._spend(value, now, surplus_only=False)[0])

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
        """Rate, threshold and budget use (spent / accrued so far), for metrics."""
        elapsed = 0.0 if self._t0 is None or now is None else max(now - self._t0, 0.0)
        accrued = self.rate * elapsed
        return {"budget_units_per_s": self.rate, "threshold": self.threshold,
                "tokens": self.tokens, "spent_units": self.spent,
                "budget_used": self.spent / accrued if accrued > 0 else 0.0}

    # ------------------------------------------------------------- helpers

    def _value(self, reuse, dram_evictions, now, last_access, depth) -> np.ndarray:
        v = (1.0 + np.asarray(reuse, float)) * (1.0 + np.asarray(dram_evictions, float))
        if depth is not None:
            v = v * (1.0 + np.asarray(depth, float) / 1024.0)
        if last_access is not None:
            idle = np.maximum(now - np.asarray(last_access, float), 0.0)
            v = v / (1.0 + idle / self.half_life_s)
        return v

    def _accrue(self, now: float) -> float:
        """Adds the budget earned since the last call; returns the seconds."""
        if self._t is None:
            self._t0 = self._t = now
            return 0.0
        dt = max(now - self._t, 0.0)
        self._t = max(now, self._t)
        self.tokens = min(self.tokens + dt * self.rate, self.rate * DAY)
        return dt

    def _spend(self, value: np.ndarray, now: float, surplus_only: bool,
               skip: np.ndarray | None = None) -> np.ndarray:
        """Admits the most valuable candidates the threshold and the bucket
        allow, one unit each; `skip` (already persisted) costs nothing."""
        self._accrue(now)
        dt = 0.0 if self._adapted is None else max(now - self._adapted, 0.0)
        self._adapted = now if self._adapted is None else max(now, self._adapted)
        out = np.zeros(value.shape[0], dtype=bool)
        if self.rate <= 0 or value.shape[0] == 0:
            return out
        hour = self.rate * self.burst_s
        # A burst may run up a debt of `burst_s` of budget; early writes spend
        # only what is above half of that in hand.
        floor = 0.5 * hour if surplus_only else -hour
        order = np.argsort(-value, kind="stable")  # the most valuable first
        if skip is not None:
            order = order[~np.asarray(skip, bool)[order]]
        for i in order:
            if value[i] < self.threshold or self.tokens - 1 < floor:
                break
            out[i] = True
            self.tokens -= 1
            self.spent += 1
        # Adapt, at a pace set by time (not by how often we are asked): a
        # bucket above its target (half of `burst_s` of budget) lowers the
        # bar, one below it raises it.
        error = (self.tokens - 0.5 * hour) / max(hour, 1e-9)
        step = self.gain * max(min(error, 4.0), -4.0) * dt / self.adapt_s
        self.threshold = min(max(self.threshold * math.exp(-step), 1e-3), 1e6)
        return out
