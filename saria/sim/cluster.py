"""The fleet replay's cluster tier: one store shared by every node.

A model of a Mooncake Store deployment as the anchors use it (LMCache's
``mooncakestore`` backend, HiCache's L3): every node puts the KV it computed
(write-through, asynchronous to the request), and a node whose local prefix
ends reads the run of blocks the store holds right after it.

* Capacity in blocks, least-recently-used eviction (Mooncake's master evicts
  at its high watermark; reads refresh an object, as its lease does).
* Each node reaches the store through its own NIC, a FIFO resource of
  ``net_Bps`` shared by its gets and puts; a get also pays ``latency_s``
  (an RPC round trip). The store itself is never the bottleneck.
* A put of a block the store holds keeps the old copy (Mooncake's rule) and
  costs nothing; a get serves only blocks a node put whole.

This is a timing and residency model beside the local tiers' cache core, as
the fleet replay's routing needs it; the engine-side tier is
``saria.tiers.remote`` (the cluster tier issue).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

GB = 1e9


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    capacity_bytes: float = 4e12    # the store's memory across the fleet (4 TB)
    net_Bps: float = 25 * GB        # one node's NIC (200 Gb/s RDMA)
    latency_s: float = 200e-6       # a batch get's round trip


class ClusterTier:
    def __init__(self, spec: ClusterSpec, block_bytes: int) -> None:
        self.spec = spec
        self.block_bytes = block_bytes
        self.capacity = max(int(spec.capacity_bytes // block_bytes), 0)
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self._nic_free: dict[int, float] = {}
        self.bytes_put: dict[int, int] = {}
        self.bytes_got: dict[int, int] = {}
        self.evictions = 0

    def __contains__(self, key: bytes) -> bool:
        return key in self._blocks

    def backlog(self, node: int, now: float) -> float:
        return max(self._nic_free.get(node, 0.0) - now, 0.0)

    def run(self, keys: np.ndarray, start: int, limit: int) -> int:
        """Blocks of `keys` held from `start` on, up to `limit` (a run)."""
        n = 0
        for i in range(start, limit):
            if bytes(keys[i]) not in self._blocks:
                break
            n += 1
        return n

    def fetch(self, replay, keys: np.ndarray, start: int, limit: int, t: float) -> tuple[int, float]:
        """The node of `replay` reads the run after its local prefix; returns
        (blocks, when the last byte lands)."""
        n = self.run(keys, start, limit)
        if n == 0:
            return 0, t
        for i in range(start, start + n):
            self._blocks.move_to_end(bytes(keys[i]))
        node = replay.node_id
        size = n * self.block_bytes
        done = max(t, self._nic_free.get(node, 0.0)) + self.spec.latency_s + size / self.spec.net_Bps
        self._nic_free[node] = done
        self.bytes_got[node] = self.bytes_got.get(node, 0) + size
        return n, done

    def publish(self, replay, keys: np.ndarray, start: int, t: float) -> None:
        """The node of `replay` puts the blocks it computed (`keys[start:]`)
        once its prefill is done at `t`."""
        if self.capacity == 0:
            return
        node = replay.node_id
        new = 0
        for k in map(bytes, keys[start:]):
            if k in self._blocks:
                continue
            self._blocks[k] = None
            new += 1
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)
            self.evictions += 1
        if new:
            size = new * self.block_bytes
            self._nic_free[node] = max(t, self._nic_free.get(node, 0.0)) + size / self.spec.net_Bps
            self.bytes_put[node] = self.bytes_put.get(node, 0) + size
