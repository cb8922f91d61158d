"""The cache core: one manager that makes every residency decision (placement,
eviction, SSD admission, promotion, locking) for the replay and the engine,
over a backend that only allocates slots and writes the SSD."""

from saria.core.backend import Backend, CountingBackend
from saria.core.events import CacheEvent, EventLog
from saria.core.manager import CacheManager
from saria.core.specs import CacheStats, LoadSpec, SsdWrite, StateSpec, StoreSpec

__all__ = ["Backend", "CacheEvent", "CacheManager", "CacheStats", "CountingBackend", "EventLog",
           "LoadSpec", "SsdWrite", "StateSpec", "StoreSpec"]
