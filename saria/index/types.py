"""Typed values passed between the index and its callers.

The index speaks in blocks (positions in a request's chain of block keys); a
plan converts to tokens only when asked, with the caller's block size.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np


class Tier(enum.IntEnum):
    """Where a block can live. Lower value = faster = preferred in a plan."""

    GPU = 0
    DRAM = 1
    SSD = 2
    REMOTE = 3  # the cluster's store (saria.tiers.remote): addressed by key, not slot

    #: This tier's bit in a residency mask (``ReloadPlan.masks``,
    #: ``Evicted.tiers_after``, checkpoint masks): the one definition, ``1 <<
    #: value``, set on each member below (a plain attribute: the replay reads
    #: it several times per request, and a property costs a call each time).
    bit: int

    @classmethod
    def parse(cls, value: "Tier | int | str") -> "Tier":
        """Accepts a Tier, its int value or its name (any case); else ValueError."""
        if isinstance(value, Tier):
            return value
        if isinstance(value, bool):
            raise TypeError(f"tier must be a Tier, int or str, not {type(value).__name__}")
        if isinstance(value, (int, np.integer)):
            try:
                return cls(int(value))
            except ValueError:
                pass
        elif isinstance(value, str):
            try:
                return cls[value.strip().upper()]
            except KeyError:
                pass
        else:
            raise TypeError(f"tier must be a Tier, int or str, not {type(value).__name__}")
        valid = ", ".join(f"{t.name} ({t.value})" for t in cls)
        raise ValueError(f"unknown tier {value!r}; valid tiers: {valid}")


for _tier in Tier:
    _tier.bit = 1 << _tier.value
del _tier


def mask_tiers(mask: int) -> tuple[Tier, ...]:
    """The tiers set in a residency bit mask."""
    return tuple(t for t in Tier if mask & t.bit)


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of consecutive blocks [start, end) to be reloaded from one tier."""

    tier: Tier
    start: int
    end: int

    @property
    def num_blocks(self) -> int:
        return self.end - self.start

    def __str__(self) -> str:
        return f"{self.tier.name}[{self.start}:{self.end}]"


@dataclass(frozen=True, slots=True)
class CheckpointRef:
    """A hybrid model's state checkpoint at the boundary after `boundary` blocks."""

    boundary: int
    tier: Tier
    slot: int


@dataclass(frozen=True, slots=True)
class ReloadPlan:
    """Answer of ``RadixIndex.match``: what of a prefix can be reloaded, from where.

    Invariants: ``segments`` tile ``[0, num_blocks)`` in order, adjacent segments
    differ in tier; ``tiers[i]``/``slots[i]`` give block i's source (the fastest
    tier holding it); ``num_blocks <= num_available <= num_known``;
    ``tier_by_tier_blocks <= num_available`` is what a lookup that stops at the
    first block missing from the tier holding block 0 would have returned (the
    LMCache-style baseline). For hybrid models ``num_blocks`` ends at the deepest
    checkpointed boundary and ``checkpoint`` names that checkpoint. ``masks`` and
    ``checkpoint_masks`` give, for each known block, the tiers holding its KV and
    the checkpoint at the boundary after it.
    """

    num_blocks: int
    tiers: np.ndarray
    slots: np.ndarray
    num_known: int
    num_available: int
    tier_by_tier_blocks: int
    checkpoint: CheckpointRef | None
    masks: np.ndarray
    checkpoint_masks: np.ndarray

    @property
    def segments(self) -> tuple[Segment, ...]:
        """The plan as runs of consecutive blocks from one tier, in order."""
        n = self.tiers.shape[0]
        if n == 0:
            return ()
        cuts = np.flatnonzero(self.tiers[1:] != self.tiers[:-1]) + 1
        starts = np.concatenate(([0], cuts))
        ends = np.concatenate((cuts, [n]))
        return tuple(Segment(Tier(int(self.tiers[s])), int(s), int(e))
                     for s, e in zip(starts, ends))

    def blocks_from(self, tier: Tier) -> int:
        """Blocks of the plan served from `tier`."""
        return sum(s.num_blocks for s in self.segments if s.tier == tier)

    def __str__(self) -> str:
        body = " ".join(str(s) for s in self.segments) or "miss"
        if self.checkpoint is not None:
            body += f" +state@{self.checkpoint.boundary}:{self.checkpoint.tier.name}"
        return body


@dataclass(frozen=True, slots=True)
class Evicted:
    """Blocks popped from a tier by ``RadixIndex.evict``, as parallel arrays.

    ``dram_evictions`` already counts this eviction when the tier is DRAM;
    ``tiers_after`` is each block's residency mask after it left the tier
    (0 = the block is now a metadata-only node); ``child_tiers`` has bit t set
    when some child of the block is resident in tier t (a victim that is the
    only copy above an SSD-resident suffix: admission may want to keep it);
    ``checkpoints`` is each block's checkpoint residency mask after the call.
    """

    tier: Tier
    keys: np.ndarray
    slots: np.ndarray
    reuse: np.ndarray
    hits: np.ndarray
    dram_evictions: np.ndarray
    session: np.ndarray
    depth: np.ndarray
    tiers_after: np.ndarray
    child_tiers: np.ndarray
    checkpoints: np.ndarray
    last_access: np.ndarray

    def __len__(self) -> int:
        return int(self.slots.shape[0])


@dataclass(frozen=True, slots=True)
class IndexStats:
    """Size of the index. ``memory_bytes`` is the native core's own footprint."""

    nodes: int
    ghosts: int
    resident: dict[str, int]
    checkpoints: int
    ghosts_dropped: int
    max_blocks: int
    memory_bytes: int
    node_bytes: int
