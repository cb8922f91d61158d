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


def _best(media_bits: int, weights: Mapping[str, float]) -> tuple[str, float]:
    return max(((m, weights.get(m, 0.0)) for m, b in BIT.items() if media_bits & b),
               key=lambda mw: mw[1])


class StaticWeights:
    def __init__(self, weights: Mapping[str, float] = DYNAMO_WEIGHTS, *,
                 block_s: float = 0.0) -> None:
        self.weights = dict(weights)
        self.block_s = block_s  # seconds of prefill per block: queue_s in blocks

    def choose(self, index: FleetIndex, hashes: Sequence, loads: Mapping[str, NodeLoad]) -> Choice:
        best = None
        for node in sorted(loads):
            load = loads[node]
            if not load.up:
                continue
            media: dict[str, int] = {}
            credit = 0.0
            for bits in index.media(node, hashes):
                m, w = _best(bits, self.weights)
                media[m] = media.get(m, 0) + 1
                credit += w
            queue = load.queue_s / self.block_s if self.block_s > 0 else 0.0
            cost = len(hashes) - credit + queue
            c = Choice(node, cost, sum(media.values()), media)
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

    def ttft(self, node: str, media_bits: Sequence[int], n_blocks: int, tail_tokens: int,
             load: NodeLoad) -> tuple[float, int, dict[str, int]]:
        """Predicted TTFT on `node` and how many prefix blocks to reload: the
        reload stops at the boundary where recomputing the rest is cheaper."""
        c = self.costs(node)
        tokens = n_blocks * c.block_tokens + tail_tokens
        best = (load.queue_s + c.prefill_s(tokens, 0), 0, {})
        gpu = dram = ssd = cluster = 0
        for i, bits in enumerate(media_bits):
            if bits & BIT[wire.MEDIUM_GPU]:
                gpu += 1
            elif bits & BIT[wire.MEDIUM_CPU]:
                dram += 1
            elif bits & BIT[wire.MEDIUM_STORAGE] and bits & BIT[wire.MEDIUM_CLUSTER]:
                # both hold it: the path that finishes sooner takes it
                t_ssd = load.ssd_backlog_s + (ssd + 1) * c.block_bytes / c.link.ssd_alone
                t_net = load.cluster_backlog_s + (cluster + 1) * c.block_bytes / c.cluster_Bps
                if t_ssd <= t_net:
                    ssd += 1
                else:
                    cluster += 1
            elif bits & BIT[wire.MEDIUM_STORAGE]:
                ssd += 1
            else:
                cluster += 1
            last = i + 1 == len(media_bits)
            if not last and media_bits[i + 1] == bits:
                continue  # evaluate only where the source changes, and at the end
            local = reload_time(dram * c.block_bytes, ssd * c.block_bytes, c.link, c.mode)
            if ssd:
                local = max(local, load.ssd_backlog_s + ssd * c.block_bytes / c.link.ssd_alone)
            if dram or ssd:
                local += load.link_backlog_s
            net = (load.cluster_backlog_s + c.cluster_latency_s
                   + cluster * c.block_bytes / c.cluster_Bps) if cluster else 0.0
            cached = (i + 1) * c.block_tokens
            t = load.queue_s + max(local, net) + c.prefill_s(tokens - cached, cached)
            if t < best[0]:
                media = {k: v for k, v in ((wire.MEDIUM_GPU, gpu), (wire.MEDIUM_CPU, dram),
                                           (wire.MEDIUM_STORAGE, ssd),
                                           (wire.MEDIUM_CLUSTER, cluster)) if v}
                best = (t, i + 1, media)
        return best

    def choose(self, index: FleetIndex, hashes: Sequence, loads: Mapping[str, NodeLoad], *,
               tail_tokens: int = 0) -> Choice:
        best = None
        for node in sorted(loads):
            load = loads[node]
            if not load.up:
                continue
            t, k, media = self.ttft(node, index.media(node, hashes), len(hashes), tail_tokens,
                                    load)
            if best is None or t < best.cost:
                best = Choice(node, t, k, media)
        if best is None:
            raise RuntimeError("no node is up")
        return best
