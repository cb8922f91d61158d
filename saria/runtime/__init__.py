"""The runtime: the tiered cache a serving engine's connector drives."""

from saria.core import CacheEvent, CacheStats
from saria.runtime.backend import TierBackend
from saria.runtime.cache import CacheConfig, LoadResult, TieredCache

__all__ = ["CacheConfig", "CacheEvent", "CacheStats", "LoadResult", "TierBackend", "TieredCache"]
