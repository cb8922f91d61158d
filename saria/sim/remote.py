"""The cluster tier in the replay: what reaching it costs and what it keeps.

``RemoteTierModel`` is the counting side of ``saria.tiers.remote``: one
node's link to the cluster (bandwidth and round-trip latency) and the
cluster memory saria's namespace may use, from the preset
(``HardwareSpec.remote_*``; ``remote_bytes = 0``: no cluster tier, the
default, so every existing replay is unchanged). ``ClusterKeys`` keeps the
keys the cluster holds the way Mooncake's master does: when its memory
passes the high watermark (0.9) it evicts the least recently used objects
down to ``1 - eviction_ratio`` of the watermark, and a put of a held key
keeps the old value (and counts as a use).

Timing: a lookup is one round trip; a transfer of ``n`` objects is one round
trip plus the bytes at the link's rate (objects of one batch move together,
as ``batch_put_from`` / ``batch_get_into`` do). The replay queues a node's
gets and puts on its one link (``Replay.cluster_free``).

This is the only model of the cluster tier: the single-node replay (a preset
with ``remote_bytes``) and the fleet replay (``saria replay --nodes N
--cluster SIZE``: one ``ClusterKeys`` shared by every node's core) both use
it, with one set of defaults -- the preset's ``remote_link_Bps`` (40 GB/s)
and ``remote_latency_s`` (50 us). Why those and not the 25 GB/s and 200 us
the fleet replay used to assume: a node of the replay is one GPU slice, and
a DGX H100 gives each GPU its own ConnectX-7 at 400 Gb/s (50 GB/s line rate;
80% of it for the cluster tier over RDMA), where 25 GB/s was a whole node's
200 Gb/s NIC; 50 us is an RDMA round trip to the master plus a transfer's
first byte, next to the 60-107 us measured for a 64-key ``batch_is_exist``
over loopback TCP (issue 22), where 200 us had no measurement behind it
(``saria.sim.presets``: [nic], [mc]).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from saria.errors import ConfigError

__all__ = ["RemoteTierModel", "ClusterKeys"]


@dataclass(frozen=True, slots=True)
class RemoteTierModel:
    """One node's view of the cluster tier (see the module docstring)."""

    link_Bps: float
    latency_s: float
    capacity_bytes: float
    high_watermark: float = 0.9   # Mooncake master's eviction_high_watermark_ratio default
    eviction_ratio: float = 0.05  # Mooncake master's eviction_ratio default

    def __post_init__(self) -> None:
        if not self.link_Bps > 0:
            raise ConfigError("remote_link_Bps", f"must be > 0, got {self.link_Bps}")
        if self.latency_s < 0:
            raise ConfigError("remote_latency_s", f"must be >= 0, got {self.latency_s}")
        if self.capacity_bytes < 0:
            raise ConfigError("remote_bytes", f"must be >= 0, got {self.capacity_bytes}")
        if not 0 < self.high_watermark <= 1 or not 0 <= self.eviction_ratio < 1:
            raise ConfigError("remote_watermark", "needs 0 < high_watermark <= 1 and 0 <= eviction_ratio < 1")

    @classmethod
    def from_hardware(cls, hw) -> "RemoteTierModel | None":
        """The preset's cluster tier, or None where it has none (``remote_bytes`` 0)."""
        if not hw.remote_bytes:
            return None
        return cls(link_Bps=hw.remote_link_Bps, latency_s=hw.remote_latency_s,
                   capacity_bytes=hw.remote_bytes)

    @classmethod
    def shared(cls, hw, capacity_bytes: float, link_Bps: float | None = None) -> "RemoteTierModel":
        """A fleet's cluster tier of `capacity_bytes`, reached over each node's
        link of the preset (``link_Bps`` overrides its rate)."""
        return cls(link_Bps=hw.remote_link_Bps if link_Bps is None else link_Bps,
                   latency_s=hw.remote_latency_s, capacity_bytes=capacity_bytes)

    @property
    def enabled(self) -> bool:
        return self.capacity_bytes > 0

    def lookup_s(self) -> float:
        """One ``batch_is_exist`` round trip."""
        return self.latency_s

    def transfer_s(self, nbytes: float, objects: int = 1) -> float:
        """Seconds to put or get ``objects`` objects of ``nbytes`` in all, in one batch."""
        if objects <= 0 or nbytes <= 0:
            return 0.0
        return self.latency_s + float(nbytes) / self.link_Bps

    def capacity_blocks(self, block_bytes: int) -> int:
        return int(self.capacity_bytes // max(1, int(block_bytes)))

    def keys(self, block_bytes: int) -> "ClusterKeys":
        """An empty cluster of this capacity for blocks of ``block_bytes``."""
        return ClusterKeys(self.capacity_blocks(block_bytes), self.high_watermark, self.eviction_ratio)


class ClusterKeys:
    """The keys the cluster holds, evicted like Mooncake's master (LRU past
    the high watermark, down by ``eviction_ratio``)."""

    def __init__(self, capacity_blocks: int, high_watermark: float = 0.9,
                 eviction_ratio: float = 0.05) -> None:
        if capacity_blocks < 0:
            raise ConfigError("remote_bytes", f"capacity must be >= 0 blocks, got {capacity_blocks}")
        self.capacity = int(capacity_blocks)
        self.high = int(self.capacity * high_watermark)
        self.low = int(self.high * (1.0 - eviction_ratio))
        self._lru: OrderedDict[bytes, None] = OrderedDict()
        self.evicted = 0
        self.puts = 0
        self.skipped = 0

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, key: bytes) -> bool:
        return key in self._lru

    def exists(self, keys: Iterable[bytes]) -> list[bool]:
        """Which keys are held (no use: a lookup does not refresh an object)."""
        return list(map(self._lru.__contains__, keys))  # the loop in C: ~every request asks

    def get(self, keys: Iterable[bytes]) -> list[bool]:
        """Which keys are held; each held one counts as used."""
        out = []
        for k in keys:
            hit = k in self._lru
            if hit:
                self._lru.move_to_end(k)
            out.append(hit)
        return out

    def put(self, keys: Iterable[bytes]) -> list[bool]:
        """Stores the keys not held (True: stored now; a held key is skipped and used)."""
        out = []
        for k in keys:
            if k in self._lru:
                self._lru.move_to_end(k)
                self.skipped += 1
                out.append(False)
                continue
            if self.high == 0:
                out.append(False)
                continue
            self._lru[k] = None
            self.puts += 1
            out.append(True)
            if len(self._lru) > self.high:
                while len(self._lru) > max(self.low, 1):  # never the one just put
                    self._lru.popitem(last=False)
                    self.evicted += 1
        return out

    def remove(self, keys: Iterable[bytes]) -> None:
        for k in keys:
            self._lru.pop(k, None)

    def clear(self) -> None:
        """A master restarted without HA: every key is gone."""
        self._lru.clear()
