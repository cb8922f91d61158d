"""Post-prefill promotion: which SSD hits are copied into DRAM after a prefill.

After a request's prefill has read blocks from the SSD, those blocks sit in
GPU memory; copying some of them into DRAM (GPU -> DRAM, off the request's
critical path) lets the session's next turn reload them from DRAM instead of
the SSD. Promotion competes with DRAM residents, so SARIA bounds it twice
(paper §4.4):

* a **DRAM share** r: promote until DRAM serves a fraction r of the reload's
  blocks. The default r is the split at which the DRAM and SSD paths finish
  together, ``r = B_dram / (B_dram + B_ssd)``: moving d of the reload's bytes
  over a path of bandwidth B_dram and the other (1 - r) over B_ssd gives
  equal times exactly when ``r / B_dram == (1 - r) / B_ssd``;
* a **recency cutoff**: a promoted block may only take the slot of a DRAM
  block not touched in the last ``min_victim_age_s`` seconds (the caller
  evicts with ``older_than``), so promotion never pushes out hot data; when
  few victims are old enough, promotion shrinks.

The cutoff is learned by default (``"auto"``): the idle time within which 99%
of the returns the cache has seen came back (``ReturnGaps.quantile``), i.e. a
promoted block may only displace a block that is, by the evidence, dead. Why
99%: what promotion gains is an SSD read turned into a DRAM copy; what it
risks is a victim that comes back and must be recomputed -- about a hundred
times the cost -- so a victim is fair game once its chance of coming back is
under a percent. The paper's fixed cutoff (60 s here before) did not pay on
the bundled WEKA slice: 78.5k promoted blocks caused 98k more DRAM evictions,
E2 wrote 15% more (1.389 vs 1.206 TB) and the mean TTFT rose 0.38 s, because
a DRAM block idle one minute is, in a coding session, usually one whose
session is still thinking (`experiments/08_budget_headline.py` has the
sweep of the cutoff).

Policies pick *which* SSD-served positions to promote, in prefix order (the
earliest blocks are shared by every later turn of the session).
"""

from __future__ import annotations

import math

import numpy as np

from saria.errors import ConfigError


def balanced_dram_share(dram_bw: float, ssd_bw: float) -> float:
    """r at which a reload split DRAM:SSD = r:(1-r) finishes on both paths at
    once (bandwidths in bytes/s; any consistent unit)."""
    if dram_bw <= 0 or ssd_bw <= 0:
        raise ConfigError("promotion", "bandwidths must be positive")
    return dram_bw / (dram_bw + ssd_bw)


class PromotionPolicy:
    """Base: promotes nothing."""

    name = "none"
    #: the family, as ``make_promotion`` names it (``name`` adds parameters)
    kind = "none"
    #: seconds a DRAM victim must be idle to make room for a promoted block
    min_victim_age_s: float | None = None
    #: the cutoff is learned from the core's return gaps (``victim_age``)
    wants_returns = False

    def select(self, ssd_positions: np.ndarray, dram_blocks: int) -> np.ndarray:
        """Positions (subset of `ssd_positions`, in order) to promote, given
        that the reload already took `dram_blocks` blocks from DRAM."""
        return ssd_positions[:0]

    def victim_age(self, returns) -> float | None:
        """The recency cutoff now, given the core's ``ReturnGaps``."""
        return self.min_victim_age_s

    def __repr__(self) -> str:
        return f"<promotion {self.name}>"


class NoPromotion(PromotionPolicy):
    pass


class FullPromotion(PromotionPolicy):
    """Every SSD hit goes to DRAM (evicting whatever LRU says)."""

    name = kind = "full"

    def select(self, ssd_positions, dram_blocks):
        return ssd_positions


class LazyPartialPromotion(PromotionPolicy):
    """SARIA's lazy partial promotion: up to a DRAM share ``r`` of the reload,
    only into slots of DRAM blocks idle for ``min_victim_age_s`` seconds
    (``"auto"``: longer than ``AUTO_QUANTILE`` of the return gaps seen)."""

    name = kind = "lazy"
    AUTO_QUANTILE = 0.99

    def __init__(self, r: float, min_victim_age_s: float | str = "auto") -> None:
        if not 0.0 <= r <= 1.0:
            raise ConfigError("promotion", f"r must be in [0, 1], got {r}")
        self.r = float(r)
        if min_victim_age_s == "auto":
            self.min_victim_age_s = None
            self.wants_returns = True
            age = "auto"
        else:
            if isinstance(min_victim_age_s, str) or not min_victim_age_s >= 0:
                raise ConfigError("promotion", "the recency cutoff must be 'auto' or seconds "
                                  f">= 0, got {min_victim_age_s!r}")
            self.min_victim_age_s = float(min_victim_age_s)
            age = f"{self.min_victim_age_s:g}s"
        self.name = f"lazy(r={self.r:.2f},age={age})"

    def victim_age(self, returns) -> float | None:
        if self.wants_returns:
            return returns.quantile(self.AUTO_QUANTILE)
        return self.min_victim_age_s

    def select(self, ssd_positions, dram_blocks):
        total = dram_blocks + ssd_positions.shape[0]
        want = math.ceil(self.r * total) - dram_blocks
        if want <= 0:
            return ssd_positions[:0]
        return ssd_positions[:want]


PROMOTIONS = ("none", "full", "lazy")


def make_promotion(name: str, *, r: float | None = None, dram_bw: float | None = None,
                   ssd_bw: float | None = None, min_victim_age_s: float | str = "auto"
                   ) -> PromotionPolicy:
    """``none``, ``full`` or ``lazy`` (r given, or derived from bandwidths)."""
    if name == "none":
        return NoPromotion()
    if name == "full":
        return FullPromotion()
    if name == "lazy":
        if r is None:
            if dram_bw is None or ssd_bw is None:
                raise ConfigError("promotion", "lazy promotion needs r or both bandwidths")
            r = balanced_dram_share(dram_bw, ssd_bw)
        return LazyPartialPromotion(r, min_victim_age_s)
    raise ConfigError("promotion", f"unknown promotion {name!r}; valid: {', '.join(PROMOTIONS)}")
