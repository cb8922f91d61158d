"""How long blocks sit idle before a request comes back to them.

Both the budget admission and lazy promotion ask the same question of a
block: *is it still alive?* -- will a request come back to it, given that it
has been idle this long? ``ReturnGaps`` answers from what the cache has seen:
every request that comes back to known blocks reports how long each had been
idle (the cache core calls ``observe`` before it touches them), into a
histogram over log-spaced bins whose old observations fade over ``memory_s``
(a workload's think times drift over the day).

* ``survival(idle)`` -- the share of returns that came after at least that
  long: ~1 for a block idle a few seconds, 0 past the longest gap seen lately;
* ``quantile(q)`` -- the idle time that a share q of returns fall within.
"""

from __future__ import annotations

import math

import numpy as np

from saria import _native

DAY = 86_400.0


class DecayedHistogram:
    """Counts over fixed bins (``edges`` ascending: bin i holds
    ``[edges[i], edges[i+1])``), an observation of age a weighing
    ``e^(-a / tau)``."""

    def __init__(self, edges: np.ndarray, tau: float) -> None:
        self.edges = np.ascontiguousarray(edges, float)
        self.tau = float(tau)
        self.counts = np.zeros(self.edges.shape[0])
        self._t: float | None = None

    def add(self, x: np.ndarray, now: float) -> None:
        if self._t is not None and now > self._t:
            self.counts *= math.exp(-(now - self._t) / self.tau)
        self._t = now if self._t is None else max(now, self._t)
        if np.shape(x)[0]:  # np.bincount(self.bin(x), minlength=...) in one native call
            self.counts += _native.bin_counts(np.ascontiguousarray(x, float), self.edges)

    def bin(self, x) -> np.ndarray:
        return np.clip(np.searchsorted(self.edges, x, side="right") - 1, 0, self.edges.shape[0] - 1)

    @property
    def total(self) -> float:
        return float(self.counts.sum())

    def upper_share(self, x) -> np.ndarray:
        """Share of the weight in each `x`'s bin and above."""
        tail = np.cumsum(self.counts[::-1])[::-1] / max(self.total, 1e-300)
        return tail[self.bin(x)]

    def cut(self, share: float) -> tuple[float, float, float]:
        """Where the upper `share` of the weight begins, at bin resolution:
        ``(lo, hi, p)`` -- everything from ``hi`` up lies within the share,
        and taking a fraction ``p`` of the bin ``[lo, hi)`` makes it up
        exactly (a bin of equal values is not all-or-nothing)."""
        total = self.total
        if total <= 0 or share >= 1.0:
            return 0.0, 0.0, 1.0
        if share <= 0.0:
            return math.inf, math.inf, 0.0
        tail = np.append(np.cumsum(self.counts[::-1])[::-1], 0.0)
        want = share * total
        b = int(np.searchsorted(-tail, -want, side="right")) - 1  # tail[b] >= want > tail[b+1]
        # a want that underflows to 0 (share ~ 5e-324) would land past the last bin
        b = min(max(b, 0), self.counts.shape[0] - 1)
        hi = float(self.edges[b + 1]) if b + 1 < self.edges.shape[0] else math.inf
        inside = self.counts[b]
        p = (want - tail[b + 1]) / inside if inside > 0 else 0.0
        return float(self.edges[b]), hi, min(max(p, 0.0), 1.0)

    def upper_quantile(self, share: float) -> float:
        """The smallest bin edge whose upper tail holds at most `share` of the
        weight (0: everything passes; inf: nothing does)."""
        total = self.total
        if total <= 0 or share >= 1.0:
            return 0.0
        if share <= 0.0:
            return math.inf
        tail = np.cumsum(self.counts[::-1])[::-1]
        b = int(np.searchsorted(-tail, -share * total, side="left"))
        return float(self.edges[b]) if b < self.edges.shape[0] else math.inf


class ReturnGaps:
    """The cache's record of return gaps; see the module docstring."""

    # Quarter octaves from 1/4 s to ~12 days, and a bin for gaps under 1/4 s.
    EDGES = np.concatenate([[0.0], 2.0 ** (np.arange(88) / 4.0 - 2.0)])

    def __init__(self, memory_s: float = DAY) -> None:
        self.hist = DecayedHistogram(self.EDGES, memory_s)

    def observe(self, idle_s: np.ndarray, now: float) -> None:
        self.hist.add(np.maximum(np.asarray(idle_s, float), 0.0), now)

    @property
    def seen(self) -> bool:
        return self.hist.total > 0

    def survival(self, idle_s) -> np.ndarray:
        """Share of returns that came after at least `idle_s` (bin
        resolution); 1 while none has been seen (no evidence of death)."""
        if not self.seen:
            return np.ones(np.shape(idle_s))
        return self.hist.upper_share(idle_s)

    def quantile(self, q: float) -> float:
        """Idle time within which at least a share `q` of returns came (a bin
        edge); inf while none has been seen."""
        if not self.seen:
            return math.inf
        return self.hist.upper_quantile(1.0 - q)
