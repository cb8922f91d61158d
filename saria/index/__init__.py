"""Unified radix-tree metadata: where every prefix block lives, and its history."""

from saria.index.clock import Clock, VirtualClock, wall_clock
from saria.index.radix import KEY_BYTES, NO_SLOT, KeySet, RadixIndex, as_keys
from saria.index.types import (
    CheckpointRef,
    Evicted,
    IndexStats,
    ReloadPlan,
    Segment,
    Tier,
    mask_tiers,
)

__all__ = [
    "KEY_BYTES", "NO_SLOT", "CheckpointRef", "Clock", "Evicted", "IndexStats", "KeySet", "RadixIndex",
    "ReloadPlan", "Segment", "Tier", "VirtualClock", "as_keys", "mask_tiers", "wall_clock",
]
