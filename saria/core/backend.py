"""The data side under the cache core: slots per tier and SSD writes.

A ``Backend`` allocates and frees slots and carries out the SSD writes the
``CacheManager`` asks for; it never decides what lives where (vLLM's
``kv_offload`` split: the manager does the bookkeeping, a backend allocates).
Capacities are in *units*: a KV block is one unit, a hybrid model's state
checkpoint ``state_units``.

Two implementations: ``CountingBackend`` below (the replay: only counts) and
``saria.runtime.backend.TierBackend`` (a DRAM pool and the O_DIRECT SSD
store). Because both sit under the same manager, the replay's decisions are
the engine's decisions by construction.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from saria.core.specs import SsdWrite
from saria.index import Tier

#: How the core learns that an SSD write finished: (the job, one handle per key, -1 = failed).
WriteDone = Callable[[SsdWrite, np.ndarray], None]

UNLIMITED = 1 << 40  # a capacity that never fills (an "unlimited" tier in the replay)


class Backend:
    """Slots and SSD writes for a ``CacheManager``.

    Invariants the manager relies on: ``free_units(t)`` never goes below zero
    through the manager's calls (it makes room first); ``write_ssd`` is only
    called after ``free_units(SSD)`` showed room for the job, and the units
    count as used from that call on; a job's DRAM sources are read before
    ``write_ssd`` returns, so the manager may free them right after -- except
    a ``held`` job's, which the manager keeps allocated and unchanged until
    the job completes (an asynchronous backend reads them when it writes).

    Write-behind (asynchronous backends): up to ``write_behind`` DRAM victims
    whose SSD write is queued keep their slots, and stay readable, until the
    write lands. Those slots are outside ``capacity(DRAM)``: ``retain`` moves
    a victim's slot there (its unit counts as free at once, as if the victim
    had left) and ``unretain`` gives the reserve back when it is freed.
    """

    #: writes complete later, on another thread (the manager then tracks them)
    asynchronous: bool = False
    #: capacity units one state checkpoint occupies
    state_units: int = 0
    #: DRAM victims that may stay readable while their SSD write is queued
    write_behind: int = 0
    #: every slot handle is 0 and a freed unit is free again at once (only
    #: counts): the core may evict and place a tier's blocks in one index
    #: call and report the counts (``recount``) instead of slots
    slotless: bool = False

    def bind(self, on_written: WriteDone) -> None:
        """Called once by the manager: where SSD completions go."""
        self._on_written = on_written

    def capacity(self, tier: Tier) -> int:
        raise NotImplementedError

    def free_units(self, tier: Tier) -> int:
        raise NotImplementedError

    def alloc(self, tier: Tier, count: int) -> np.ndarray:
        """`count` slots of `tier` (the caller checked ``free_units``)."""
        raise NotImplementedError

    def free(self, tier: Tier, slots: np.ndarray) -> None:
        raise NotImplementedError

    def recount(self, tier: Tier, allocated: int, freed: int) -> None:
        """A slotless backend's ``alloc(tier, allocated)`` and ``free`` of
        `freed` slots, as counts."""
        raise NotImplementedError

    def alloc_state(self, tier: Tier) -> int:
        """A handle for one state checkpoint (``state_units`` units)."""
        raise NotImplementedError

    def free_state(self, tier: Tier, handle: int) -> None:
        raise NotImplementedError

    def write_ssd(self, job: SsdWrite) -> bool:
        """Starts the job; False if it was refused (a full queue): nothing was written."""
        raise NotImplementedError

    _retained: int = 0

    def write_behind_room(self) -> int:
        """Victims that can still be retained (see the class docstring)."""
        return self.write_behind - self._retained

    def retain(self, count: int) -> None:
        if count > self.write_behind_room():
            raise RuntimeError(f"retain: {count} victims, {self.write_behind_room()} "
                               "write-behind slots free")
        self._retained += count

    def unretain(self, count: int) -> None:
        if count > self._retained:
            raise RuntimeError(f"unretain: {count} victims, {self._retained} retained")
        self._retained -= count

    def reclaim_ssd(self, units: int) -> int:
        """Frees up to `units` of SSD space the index does not know about (blocks
        found after a restart that nobody asked for); returns units freed."""
        return 0

    # The cluster tier (``saria.core.remote``): a backend with ``remote`` set
    # answers lookups by key, copies DRAM rows for a put and publishes off the
    # caller's path, reporting each put to the core's ``complete_publish``
    # (under the cache's lock). Slots are never allocated in it.

    #: a cluster tier lies below this node
    remote: bool = False

    def bind_remote(self, on_published: Callable) -> None:
        """Called once by the core when ``remote``: where finished puts go."""
        self._on_published = on_published

    def remote_exists(self, keys: np.ndarray) -> np.ndarray:
        """(n,) bool: the cluster holds the block (bounded; a failure is all misses)."""
        return np.zeros(keys.shape[0], bool)

    def remote_down(self) -> bool:
        """The cluster is marked down (its breaker is open)."""
        return False

    def remote_forget(self, keys: np.ndarray) -> None:
        """Cached lookup answers for `keys` are stale (a fetch found them gone)."""

    def copy_rows(self, slots: np.ndarray) -> np.ndarray | None:
        """The bytes of DRAM `slots`, copied (None: the backend needs no bytes)."""
        return None

    def publish(self, job) -> bool:
        """Queues a put (``saria.core.remote.RemotePut``); False: refused, nothing sent."""
        return False


class CountingBackend(Backend):
    """The replay's backend: capacities and use counts, no bytes. Writes
    complete at once. With `cluster` (``saria.sim.remote.ClusterKeys``) the
    node has a cluster tier: lookups ask it, puts land in it at once (its
    watermark eviction included), fetches hit what it holds."""

    slotless = True

    def __init__(self, capacity: dict[Tier, int], *, state_units: int = 0,
                 write_behind: int = 0, cluster=None) -> None:
        self._capacity = {t: int(capacity.get(t, 0)) for t in Tier}
        self.used = {t: 0 for t in Tier}
        self.state_units = int(state_units)
        self.write_behind = int(write_behind)  # only an asynchronous subclass retains
        self.cluster = cluster
        self.remote = cluster is not None
        self.put_blocks = 0      # blocks this node's puts stored (a held key costs no transfer)
        self.fetched_blocks = 0  # blocks this node's fetches read

    def capacity(self, tier: Tier) -> int:
        return self._capacity[tier]

    def free_units(self, tier: Tier) -> int:
        # a retained victim's unit is used but no longer the cache's
        held = self._retained if tier == Tier.DRAM else 0
        return self._capacity[tier] - self.used[tier] + held

    def alloc(self, tier: Tier, count: int) -> np.ndarray:
        self.used[tier] += count
        return np.zeros(count, np.int64)

    def free(self, tier: Tier, slots: np.ndarray) -> None:
        self.used[tier] -= int(len(slots))

    def recount(self, tier: Tier, allocated: int, freed: int) -> None:
        self.used[tier] += allocated - freed

    def alloc_state(self, tier: Tier) -> int:
        self.used[tier] += self.state_units
        return 0

    def free_state(self, tier: Tier, handle: int) -> None:
        self.used[tier] -= self.state_units

    def write_ssd(self, job: SsdWrite) -> bool:
        k = job.keys.shape[0]
        self.used[Tier.SSD] += k * (self.state_units if job.state else 1)
        self._on_written(job, np.zeros(k, np.int64))
        return True

    def remote_exists(self, keys: np.ndarray) -> np.ndarray:
        return np.array(self.cluster.exists(map(bytes, keys)), bool)

    def publish(self, job) -> bool:
        keys = [bytes(k) for k in job.keys]
        self.put_blocks += sum(self.cluster.put(keys))
        self._on_published(job, np.array([k in self.cluster for k in keys], bool))
        return True

    def fetch_remote(self, keys: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """The replay's fetch: a hit where the cluster still holds the block."""
        ok = np.array(self.cluster.get(map(bytes, keys)), bool)
        self.fetched_blocks += int(ok.sum())
        return ok
