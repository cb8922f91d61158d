"""A replay of a fleet: N nodes, a router, and optionally a shared cluster tier.

Each node is one ``Replay`` (a GPU slice with its HBM prefix cache, DRAM and
SSD under its own cache core and admission policy, its own prefill queue and
ingress link). A router sends each arriving request to a node:

* ``round-robin``: the next node that is up;
* ``session``: a session stays on its node (the first: least loaded) and
  moves, to the least-loaded node, when its node is down or its queue is
  over ``overload_s``;
* ``prefix``: static tier weights over the prefix each node holds (Dynamo's
  device 1.0 / host 0.75 / disk 0.25, the cluster tier 0.25), plus the queue
  in blocks of prefill (``saria.routing.StaticWeights``);
* ``tier-aware``: the TTFT the coordinator's model predicts on each node at
  its current backlog (``saria.routing.TierAware``).

The prefix routers read each node's residency from the node's own index
(what a ``FleetIndex`` fed by that node's events holds: tests prove the two
equal on a live server), through the same scorer objects a live router uses.

With ``cluster`` set (a ``saria.sim.remote.RemoteTierModel``), the fleet has
one cluster tier: one ``ClusterKeys`` in every node's ``CountingBackend``, so
each node's cache core looks up past its local prefix, fetches, publishes
(through ``PublishPolicy``: the fleet uses ``write-through``, every computed
block put as the deployments it models do -- LMCache's ``mooncakestore``,
HiCache's L3) and skips SSD copies of victims the cluster holds, as the
engine's core does. Each node's link to the cluster is a FIFO resource its
gets and puts share (``Replay.cluster_free``); the routers read that backlog
and which blocks the cluster holds from the same model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from saria.errors import ConfigError
from saria.routing import BIT, DYNAMO_WEIGHTS, NodeCosts, NodeLoad, StaticWeights, TierAware
from saria.routing import wire
from saria.policy.publish import PUBLISH_POLICIES
from saria.sim.engine import Arrival, Replay, ReplaySetup
from saria.sim.remote import RemoteTierModel
from saria.sim.report import policy_report
from saria.transfer import LinkModel

ROUTINGS = ("round-robin", "session", "prefix", "tier-aware")
CLUSTER_BIT = BIT[wire.MEDIUM_CLUSTER]
LOCAL_BITS = BIT[wire.MEDIUM_GPU] | BIT[wire.MEDIUM_CPU] | BIT[wire.MEDIUM_STORAGE]


@dataclass(frozen=True, slots=True)
class FleetSpec:
    nodes: int = 2
    routing: str = "tier-aware"
    cluster: RemoteTierModel | None = None  # one cluster tier for the fleet; None: islands
    publish: str = "write-through"          # the nodes' PublishPolicy (PUBLISH_POLICIES)
    overload_s: float = 30.0                # session routing moves past this queue
    down: tuple[tuple[int, float, float], ...] = ()  # (node, from, until): node failures

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise ConfigError("nodes", f"must be at least 1, got {self.nodes}")
        if self.routing not in ROUTINGS:
            raise ConfigError("routing", f"unknown routing {self.routing!r}; valid: "
                              f"{', '.join(ROUTINGS)}")
        if self.publish not in PUBLISH_POLICIES:
            raise ConfigError("publish", f"unknown publishing {self.publish!r}; valid: "
                              f"{', '.join(PUBLISH_POLICIES)}")


class Fleet:
    def __init__(self, setup: ReplaySetup, spec: FleetSpec) -> None:
        self.spec = spec
        self.setup = setup
        tier = spec.cluster
        if tier is not None and setup.preset.model.hybrid:
            raise ConfigError("cluster", "a cluster tier under a hybrid model is not supported "
                              "(state checkpoints are not published)")
        # islands: no cluster tier at all (not even the preset's)
        self.cluster = tier.keys(setup.block_bytes) if tier is not None else None
        pair = (tier, self.cluster)
        self.nodes = [Replay(setup, cluster=pair, publish=PUBLISH_POLICIES[spec.publish])
                      for _ in range(spec.nodes)]
        self.names = [f"node{i}" for i in range(spec.nodes)]
        self.routed = np.zeros(spec.nodes, np.int64)
        self.moves = 0
        self._rr = 0
        self._home: dict[int, int] = {}
        preset = setup.preset
        hw, model = preset.hardware, preset.model
        link = self.nodes[0].link
        self.block_s = model.prefill_flops(preset.block_size, preset.block_size) / \
            hw.prefill_flops_per_s
        if spec.routing == "prefix":
            self.scorer = StaticWeights(DYNAMO_WEIGHTS, block_s=self.block_s)
        elif spec.routing == "tier-aware":
            net = tier.link_Bps if tier else 1.0
            lat = tier.latency_s if tier else 0.0
            self.scorer = TierAware(NodeCosts(
                LinkModel(link.ingress_Bps, link.dram_Bps, link.ssd_Bps, link.pacing_efficiency,
                          link.contention_ssd_share),
                setup.block_bytes, preset.block_size,
                lambda new, cached: model.prefill_flops(new, new + cached) / hw.prefill_flops_per_s,
                cluster_Bps=net, cluster_latency_s=lat, mode=setup.coordinator))

    # ------------------------------------------------------------ driving

    def run(self, arrivals: Sequence[Arrival],
            progress: Callable[[int], None] | None = None) -> dict:
        tick = max(1, len(arrivals) // 200)
        for i, a in enumerate(arrivals):
            self.serve(a)
            if progress is not None and (i % tick == 0 or i == len(arrivals) - 1):
                progress(i + 1)
        return self.report()

    def serve(self, a: Arrival) -> float:
        keys = self.nodes[0].keys_of(a)
        k = self.route(a, keys)
        self.routed[k] += 1
        return self.nodes[k].serve(a, keys)

    def up(self, k: int, t: float) -> bool:
        return not any(n == k and lo <= t < hi for n, lo, hi in self.spec.down)

    def load(self, k: int, t: float) -> NodeLoad:
        node = self.nodes[k]
        return NodeLoad(queue_s=max(node.gpu_free_at - t, 0.0),
                        link_backlog_s=max(node.reloads.dram_free - t, 0.0),
                        ssd_backlog_s=max(node.reloads.ssd_free - t, 0.0),
                        cluster_backlog_s=node.cluster_backlog(t),
                        up=self.up(k, t))

    def route(self, a: Arrival, keys: np.ndarray) -> int:
        n, t = self.spec.nodes, a.time
        alive = [k for k in range(n) if self.up(k, t)]
        if not alive:
            raise ConfigError("down", f"every node is down at t={t:.0f} s")
        r = self.spec.routing
        if r == "round-robin":
            while True:
                k = self._rr % n
                self._rr += 1
                if k in alive:
                    return k
        if r == "session":
            k = self._home.get(a.session)
            if k is None or k not in alive or self.nodes[k].gpu_free_at - t > self.spec.overload_s:
                if k is not None:
                    self.moves += 1
                k = min(alive, key=lambda j: (self.nodes[j].gpu_free_at, j))
                self._home[a.session] = k
            return k
        loads = {self.names[k]: self.load(k, t) for k in range(n)}
        media = self._media(keys)
        choice = self.scorer.choose_media(media, keys.shape[0], loads)
        return self.names.index(choice.node)

    def _media(self, keys: np.ndarray) -> dict[str, np.ndarray]:
        """Each node's reloadable prefix as routing bits: its own tiers (a
        tier's bit is its ``BIT``: GPU 1, DRAM 2, SSD 4), continued by the
        run the cluster holds after it (one pass over the cluster per
        request, for every node): the whole run, as the node's core's lookup
        goes on while the cluster holds what it asks (the router predicts the
        reload the core will make). A node's REMOTE copies in its index
        are not its own: what the cluster holds is read from the cluster."""
        local = {}
        for k in range(self.spec.nodes):
            plan = self.nodes[k].cache.index.match(keys)
            bits = np.asarray(plan.masks[:plan.num_available], dtype=np.uint8) & LOCAL_BITS
            gone = np.flatnonzero(bits == 0)
            local[k] = bits[:gone[0]] if gone.size else bits
        if self.cluster is None:
            return {self.names[k]: b for k, b in local.items()}
        ends = [b.shape[0] for b in local.values()]
        lo = min(ends)
        held = _held(self.cluster, keys, lo, max(ends))
        out = {}
        for k, bits in local.items():
            h = held[bits.shape[0] - lo:]
            more = int(np.argmin(h)) if h.size and not h.all() else int(h.size)
            out[self.names[k]] = np.concatenate([bits, np.full(more, CLUSTER_BIT, np.uint8)])
        return out

    # ------------------------------------------------------------ reporting

    def report(self) -> dict:
        per = [policy_report(node) for node in self.nodes]
        ttft = np.concatenate([np.asarray(node.stats.ttft, float) for node in self.nodes])
        tokens = max(sum(node.stats.input_tokens for node in self.nodes), 1)
        hits = {m: sum(node.stats.hit_tokens.get(m, 0) for node in self.nodes)
                for m in ("GPU", "DRAM", "SSD", "CLUSTER")}
        routed = self.routed.astype(float)
        got = sum(node.cluster_bytes_got for node in self.nodes)
        put = sum(node.cluster_bytes_put for node in self.nodes)
        return {
            "nodes": self.spec.nodes, "routing": self.spec.routing,
            "cluster": self.cluster is not None,
            "requests": int(routed.sum()),
            "ttft_mean_s": float(ttft.mean()) if ttft.size else 0.0,
            "ttft_p90_s": float(np.percentile(ttft, 90)) if ttft.size else 0.0,
            "ttft_p99_s": float(np.percentile(ttft, 99)) if ttft.size else 0.0,
            "ssd_bytes_written": sum(p["ssd_bytes_written"] for p in per),
            "ssd_lifetime_days_min": min((p["ssd_lifetime_days"] for p in per
                                          if p["ssd_lifetime_days"] is not None), default=None),
            "network_bytes": got + put,
            "cluster_bytes_read": got,
            "hit_ratio_tokens": sum(hits.values()) / tokens,
            **{f"{m.lower()}_hit_ratio_tokens": v / tokens for m, v in hits.items()},
            "load_imbalance": float(routed.max() / routed.mean()) if routed.sum() else 0.0,
            "session_moves": self.moves,
            "per_node": [{"node": self.names[i], "requests": int(self.routed[i]),
                          **{k: p[k] for k in ("ssd_bytes_written", "ssd_lifetime_days",
                                               "ttft_mean_s", "ttft_p90_s", "hit_ratio_tokens")}}
                         for i, p in enumerate(per)],
        }


def _held(cluster, keys: np.ndarray, start: int, stop_after: int) -> np.ndarray:
    """Which of ``keys[start:]`` the cluster holds, up to the first block
    past `stop_after` it does not (every node's run is read from this)."""
    raw, w = keys.tobytes(), keys.shape[1]
    held = np.array(cluster.exists([raw[i * w:(i + 1) * w] for i in range(start, keys.shape[0])]),
                    dtype=bool)
    past = np.flatnonzero(~held[max(stop_after - start, 0):])
    return held[:max(stop_after - start, 0) + int(past[0])] if past.size else held
