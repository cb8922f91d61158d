"""SSD admission: which DRAM blocks are worth an SSD write.

New KV always lands in DRAM; an admission policy decides what also goes to the
SSD, at three moments, each a small vectorised decision over a run of blocks:

* ``on_create``  -- blocks just computed (write-through policies write them);
* ``on_access``  -- blocks a request just referenced while they sit in DRAM
  (reuse-gated early persistence, HiCache's selective write-through, KVBM's
  frequency filter), written asynchronously while still in DRAM;
* ``on_evict``   -- DRAM victims (write-back writes all, SARIA's eviction gate
  writes a block on its E-th DRAM eviction).

Policies are small pluggable objects in the style of CacheLib Navy's admission
policies: they see only block history (from the index) and return boolean
masks; the caller does the writing and skips blocks already on the SSD. The
same objects serve the runtime cache and ``saria replay``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from saria.errors import ConfigError


class AdmissionPolicy:
    """Base: admits nothing (DRAM-only). Subclasses override what they use."""

    name = "dram-only"
    #: the policy never writes: the SSD tier can be skipped entirely
    writes_nothing = True
    #: ``on_create`` may admit: blocks are written as they are created (write-through)
    writes_on_create = False
    #: decisions use the core's record of return gaps (``ReturnGaps``)
    wants_returns = False
    #: the core reports evicted blocks a request comes back to (``on_returns``)
    wants_evicted_returns = False

    def bind(self, *, ssd_units: int, state_units: int = 0, returns=None) -> None:
        """Called once by the cache core: the SSD tier's capacity in units (a
        block is one unit, a hybrid checkpoint ``state_units``) and its
        record of return gaps (``saria.policy.returns.ReturnGaps``)."""

    def on_create(self, keys: np.ndarray, now: float) -> np.ndarray:
        """Mask over freshly computed blocks to write to SSD now."""
        return np.zeros(keys.shape[0], dtype=bool)

    def on_access(self, keys: np.ndarray, reuse: np.ndarray, hits: np.ndarray,
                  now: float, *, last_access=None, depth=None, on_ssd=None) -> np.ndarray:
        """Mask over DRAM-resident blocks a request just referenced (history
        already counts this access) to write to SSD early. `last_access` and
        `depth` (block position in its prefix), when given, are history too;
        `on_ssd` marks blocks already persisted (the caller will not write
        them, whatever the mask says)."""
        return np.zeros(keys.shape[0], dtype=bool)

    def on_evict(self, keys: np.ndarray, reuse: np.ndarray, hits: np.ndarray,
                 dram_evictions: np.ndarray, now: float, *, last_access=None,
                 depth=None, on_ssd=None) -> np.ndarray:
        """Mask over DRAM victims (dram_evictions counts this eviction) to
        write to SSD before their DRAM slot is reused."""
        return np.zeros(keys.shape[0], dtype=bool)

    def charge(self, units: float, now: float) -> None:
        """Units written on the strength of another decision (a checkpoint
        shares its block's): a budgeted policy counts them."""

    def state(self, now: float | None = None) -> dict[str, float]:
        """Figures for the engine's metrics (a budgeted policy: its rate,
        threshold and budget use); none by default."""
        return {}

    def on_returns(self, dram_evictions: np.ndarray, now: float) -> None:
        """A request came back to blocks that had left DRAM (each with its
        DRAM-eviction count), whether the SSD held them or not: the
        unbiased evidence of which victims come back. Only called when
        ``wants_evicted_returns``."""

    def tick(self, now: float) -> None:
        """Called at every request (a budgeted policy accrues from the first)."""

    def on_context(self, reuse: int, hits: int, dram_evictions: int, now: float, *,
                   last_access=None, depth: int = 0) -> bool:
        """Session-level admission (hybrid models): would this policy persist a
        context whose strongest evidence along its path is this history
        (``dram_evictions`` counts the eviction under way)? Then the core
        persists the context's latest state checkpoint with every KV block a
        reuse of that boundary needs. No for policies that are not
        history-gated."""
        return False

    def __repr__(self) -> str:
        return f"<admission {self.name}>"


class DramOnly(AdmissionPolicy):
    """Never writes to the SSD: the baseline without an SSD tier."""


class FullDuplicate(AdmissionPolicy):
    """Write-through: every block is written once, when it is created
    (LMCache's and vLLM native offloading's store-to-every-tier behaviour)."""

    name = "full-duplicate"
    writes_nothing = False
    writes_on_create = True

    def on_create(self, keys, now):
        return np.ones(keys.shape[0], dtype=bool)


class WriteBack(AdmissionPolicy):
    """Every DRAM victim is written (a plain inclusive hierarchy)."""

    name = "write-back"
    writes_nothing = False

    def on_evict(self, keys, reuse, hits, dram_evictions, now, **history):
        return np.ones(keys.shape[0], dtype=bool)


@dataclass(frozen=True)
class _Thresholds:
    evictions: int | None
    reuse: int | None


class Saria(AdmissionPolicy):
    """SARIA's persistence-aware admission (paper §4.2).

    ``E=k``: persist a block on its k-th DRAM eviction -- it proved reuse
    beyond one DRAM residency. ``R=j``: persist a block early, asynchronously,
    once it has been reused j times while in DRAM. Either or both.
    """

    writes_nothing = False

    def __init__(self, evictions: int | None = None, reuse: int | None = None,
                 name: str | None = None) -> None:
        if evictions is None and reuse is None:
            raise ConfigError("admission", "SARIA needs E (evictions) or R (reuse) or both")
        for label, v in (("E", evictions), ("R", reuse)):
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ConfigError("admission", f"{label} must be a positive int, got {v!r}")
        self.t = _Thresholds(evictions, reuse)
        parts = []
        if evictions is not None:
            parts.append(f"E{evictions}")
        if reuse is not None:
            parts.append(f"R{reuse}")
        self.name = name or "+".join(parts)

    def on_access(self, keys, reuse, hits, now, **history):
        if self.t.reuse is None:
            return np.zeros(keys.shape[0], dtype=bool)
        return reuse >= self.t.reuse

    def on_evict(self, keys, reuse, hits, dram_evictions, now, **history):
        if self.t.evictions is None:
            return np.zeros(keys.shape[0], dtype=bool)
        return dram_evictions >= self.t.evictions

    def on_context(self, reuse, hits, dram_evictions, now, **history):
        """E: the context was evicted and came back E-1 times before; R: it
        was reused R times. The same gates as for a block, on the context."""
        return ((self.t.evictions is not None and dram_evictions >= self.t.evictions)
                or (self.t.reuse is not None and reuse >= self.t.reuse))


class HiCacheSelective(AdmissionPolicy):
    """SGLang HiCache's ``write_through_selective``: back a block up once its
    hit count reaches a threshold (2 in HiCache)."""

    name = "hicache-selective"
    writes_nothing = False

    def __init__(self, threshold: int = 2) -> None:
        self.threshold = threshold

    def on_access(self, keys, reuse, hits, now, **history):
        return hits >= self.threshold

    def on_context(self, reuse, hits, dram_evictions, now, **history):
        return hits >= self.threshold


class KvbmFrequencyFilter(AdmissionPolicy):
    """Dynamo KVBM's disk-offload ``FrequencyFilter``: per block, the count
    starts at 1 on the first sighting and doubles on each later one; every
    ``decay_interval_s`` all counts drop by 1 and zeros are forgotten; a block
    is written to disk when its count reaches ``min_frequency`` (2).

    A sighting is a request referencing the block (creation or access). The
    periodic decay is applied lazily per block from the interval boundaries
    crossed since its last sighting, which is exactly the periodic sweep.
    """

    name = "kvbm-filter"
    writes_nothing = False
    writes_on_create = True

    def __init__(self, min_frequency: int = 2, decay_interval_s: float = 600.0) -> None:
        if decay_interval_s <= 0:
            raise ConfigError("admission", "KVBM decay interval must be positive")
        self.min_frequency = min_frequency
        self.interval = float(decay_interval_s)
        self._count: dict[bytes, tuple[int, int]] = {}  # key -> (count, epoch)

    def _sight(self, keys: np.ndarray, now: float) -> np.ndarray:
        epoch = int(now // self.interval)
        out = np.zeros(keys.shape[0], dtype=bool)
        table = self._count
        for i, k in enumerate(map(bytes, keys)):
            c, e = table.get(k, (0, epoch))
            c = max(0, c - (epoch - e))
            c = 1 if c == 0 else min(c * 2, 1 << 30)
            table[k] = (c, epoch)
            out[i] = c >= self.min_frequency
        return out

    def on_create(self, keys, now):
        return self._sight(keys, now)

    # on_context: not applied. The filter counts sightings of one block key at
    # offload time in a table of its own; it has no notion of a context, and
    # asking it about one would count a sighting that did not happen. Its
    # checkpoints follow their block's decision.

    def on_access(self, keys, reuse, hits, now, **history):
        return self._sight(keys, now)
