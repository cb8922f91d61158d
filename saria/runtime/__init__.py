"""The runtime: the tiered cache a serving engine's connector drives."""

from saria.runtime.cache import (CacheConfig, CacheStats, LoadResult, Reservation, Staged,
                                 TieredCache)
from saria.runtime.events import CacheEvent

__all__ = ["CacheConfig", "CacheEvent", "CacheStats", "LoadResult", "Reservation", "Staged",
           "TieredCache"]
