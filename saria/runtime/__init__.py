"""The runtime: the tiered cache a serving engine's connector drives."""

from saria.runtime.cache import CacheConfig, CacheStats, LoadResult, TieredCache

__all__ = ["CacheConfig", "CacheStats", "LoadResult", "TieredCache"]
