"""Routers' scorers over a ``FleetIndex``: static tier weights, and saria's
tier-aware price.

Both answer ``choose(index, hashes, nodes)``: the node a request should go to,
given its block hashes and each node's ``NodeLoad`` (what its metrics say
now). A node that is not ``up`` is never chosen.

* ``StaticWeights`` is the field's rule (Dynamo's KV router, llm-d's prefix
  scorer): a prefix block held in a medium counts as ``weight[medium]`` of a
  block the node need not prefill; the cost is the blocks left to prefill
  plus the node's queue in blocks, lowest wins. The weights do not move with
  load: a node whose SSD is saturated scores as well as an idle one.
* ``TierAware`` prices each node by the TTFT the coordinator's model predicts:
  its queue, plus the reload of the prefix from the media that hold it at
  their current backlog (``saria.transfer.reload_time`` for the DRAM+SSD part
  on the node's GPU link, the cluster tier on the network), plus the prefill
  of the rest; and it stops the reload where recomputing the rest is faster
  (a slow tier's blocks are recomputed, not read).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from saria.routing import wire
from saria.routing.index import BIT, FleetIndex
from saria.transfer import LinkModel, reload_time

#: Published static weights: Dynamo's KVBM router (device 1.0, host 0.75, disk
#: 0.25) and llm-d's (GPU 1.0, CPU 0.8; a medium it does not know counts 1.0).
DYNAMO_WEIGHTS = {wire.MEDIUM_GPU: 1.0, wire.MEDIUM_CPU: 0.75, wire.MEDIUM_STORAGE: 0.25,
                  wire.MEDIUM_CLUSTER: 0.25}
LLMD_WEIGHTS = {wire.MEDIUM_GPU: 1.0, wire.MEDIUM_CPU: 0.8, wire.MEDIUM_STORAGE: 1.0,
                wire.MEDIUM_CLUSTER: 1.0}


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """A node's load now, in seconds of work already queued (from its metrics:
    the scheduler's waiting prefill, the reloads on its GPU link, its SSD
    reads, its share of the cluster link)."""

    queue_s: float = 0.0
    link_backlog_s: float = 0.0
    ssd_backlog_s: float = 0.0
    cluster_backlog_s: float = 0.0
    up: bool = True


@dataclass(frozen=True, slots=True)
class NodeCosts:
    """What moving and computing KV costs on a node. ``prefill_s(new, cached)``:
    seconds to prefill `new` tokens after `cached` ones (the replay's model)."""

    link: LinkModel
    block_bytes: float
    block_tokens: int
    prefill_s: Callable[[int, int], float]
    cluster_Bps: float = 12.5e9
    cluster_latency_s: float = 100e-6
    mode: str = "paced"


@dataclass(frozen=True, slots=True)
class Choice:
    node: str
    cost: float                         # seconds (TierAware) or blocks (StaticWeights)
    reload_blocks: int                  # prefix blocks the node reloads instead of computing
    media: Mapping[str, int] = field(default_factory=dict)   # blocks per medium


def _table(weights: Mapping[str, float]) -> np.ndarray:
    """The best weight of every media bit combination (16 entries)."""
    t = np.zeros(16)
    for bits in range(1, 16):
        t[bits] = max(weights.get(m, 0.0) for m, b in BIT.items() if bits & b)
    return t


def _media(index: FleetIndex, hashes: Sequence, nodes) -> dict[str, np.ndarray]:
    return {n: np.asarray(index.media(n, hashes), dtype=np.uint8) for n in nodes}


class StaticWeights:
    def __init__(self, weights: Mapping[str, float] = DYNAMO_WEIGHTS, *,
                 block_s: float = 0.0) -> None:
        self.weights = dict(weights)
        self.block_s = block_s  # seconds of prefill per block: queue_s in blocks
        self._table = _table(self.weights)

    def choose(self, index: FleetIndex, hashes: Sequence, loads: Mapping[str, NodeLoad]) -> Choice:
        return self.choose_media(_media(index, hashes, loads), len(hashes), loads)

    def choose_media(self, media: Mapping[str, np.ndarray], n_blocks: int,
                     loads: Mapping[str, NodeLoad]) -> Choice:
        """`media[node]`: the ``BIT`` bits of each block of the node's
        reloadable prefix (``FleetIndex.media``, or the replay's own index)."""
        best = None
        for node in sorted(loads):
            load = loads[node]
            if not load.up:
                continue
            bits = media[node]
            credit = float(self._table[bits].sum())
            queue = load.queue_s / self.block_s if self.block_s > 0 else 0.0
            c = Choice(node, n_blocks - credit + queue, int(bits.shape[0]))
            if best is None or c.cost < best.cost:
                best = c
        if best is None:
            raise RuntimeError("no node is up")
        return best


class TierAware:
    def __init__(self, costs: Mapping[str, NodeCosts] | NodeCosts) -> None:
        self._costs = costs

    def costs(self, node: str) -> NodeCosts:
        return self._costs if isinstance(self._costs, NodeCosts) else self._costs[node]

    def ttft(self, node: str, media_bits, n_blocks: int, tail_tokens: int,
             load: NodeLoad) -> tuple[float, int, dict[str, int]]:
        """Predicted TTFT on `node` and how many prefix blocks to reload: the
        reload stops at the boundary where recomputing the rest is cheaper
        (evaluated where the source of the next block changes, and at the
        end). A block both on the SSD and in the cluster goes to whichever
        path finishes sooner."""
        c = self.costs(node)
        bits = np.asarray(media_bits, dtype=np.uint8)
        tokens = n_blocks * c.block_tokens + tail_tokens
        best = (load.queue_s + c.prefill_s(tokens, 0), 0, {})
        if bits.shape[0] == 0:
            return best
        gpu = (bits & BIT[wire.MEDIUM_GPU]) != 0
        dram = ~gpu & ((bits & BIT[wire.MEDIUM_CPU]) != 0)
        rest = ~gpu & ~dram
        on_ssd, on_net = (bits & BIT[wire.MEDIUM_STORAGE]) != 0, (bits & BIT[wire.MEDIUM_CLUSTER]) != 0
        both, ssd_only, net_only = rest & on_ssd & on_net, rest & on_ssd & ~on_net, rest & ~on_ssd
        cum = np.cumsum(np.stack([gpu, dram, ssd_only, net_only, both]), axis=1)
        ends = np.flatnonzero(bits[1:] != bits[:-1]).tolist() + [bits.shape[0] - 1]
        ssd_s, net_s = c.block_bytes / c.link.ssd_alone, c.block_bytes / c.cluster_Bps
        for i in ends:
            g, d, s, n, b = (int(x) for x in cum[:, i])
            if b:  # split `b` so both paths finish together, within [0, b]
                x = (load.cluster_backlog_s + (n + b) * net_s - load.ssd_backlog_s - s * ssd_s) \
                    / (ssd_s + net_s)
                x = min(max(round(x), 0), b)
                s, n = s + x, n + b - x
            local = reload_time(d * c.block_bytes, s * c.block_bytes, c.link, c.mode)
            if s:
                local = max(local, load.ssd_backlog_s + s * ssd_s)
            if d or s:
                local += load.link_backlog_s
            net = load.cluster_backlog_s + c.cluster_latency_s + n * net_s if n else 0.0
            cached = (i + 1) * c.block_tokens
            t = load.queue_s + max(local, net) + c.prefill_s(tokens - cached, cached)
            if t < best[0]:
                media = {k: v for k, v in ((wire.MEDIUM_GPU, g), (wire.MEDIUM_CPU, d),
                                           (wire.MEDIUM_STORAGE, s),
                                           (wire.MEDIUM_CLUSTER, n)) if v}
                best = (t, i + 1, media)
        return best

    def choose(self, index: FleetIndex, hashes: Sequence, loads: Mapping[str, NodeLoad], *,
               tail_tokens: int = 0) -> Choice:
        return self.choose_media(_media(index, hashes, loads), len(hashes), loads,
                                 tail_tokens=tail_tokens)

    def choose_media(self, media: Mapping[str, np.ndarray], n_blocks: int,
                     loads: Mapping[str, NodeLoad], *, tail_tokens: int = 0) -> Choice:
        best = None
        for node in sorted(loads):
            load = loads[node]
            if not load.up:
                continue
            t, k, used = self.ttft(node, media[node], n_blocks, tail_tokens, load)
            if best is None or t < best.cost:
                best = Choice(node, t, k, used)
        if best is None:
            raise RuntimeError("no node is up")
        return best
