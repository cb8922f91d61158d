"""Storage tiers of the cache: pinned DRAM slots and the SSD store.

One import line per tier module.
"""

from saria.tiers.dram import DramPool, DramPoolError, DramPoolFull
from saria.tiers.ssd import RecoveredBlocks, SsdStore, StoreClosedError

__all__ = [
    "DramPool",
    "DramPoolError",
    "DramPoolFull",
    "RecoveredBlocks",
    "SsdStore",
    "StoreClosedError",
]
