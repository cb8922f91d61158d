"""The node's residency events on a ZMQ PUB socket, once per node.

Engines on a node share one ``saria serve``, so the server, not each
engine, announces what enters and leaves DRAM and the SSD: a router sees each
block once per node, not once per engine. (The engines still publish their
own GPU events through vLLM.) The payloads are vLLM's ``KVEventBatch``
(``saria.routing.wire``); each namespace publishes on its own topic
``kv@<node>@<model>`` with its own sequence numbers.

A namespace's first batch is ``AllBlocksCleared``, so an indexer that saw
this node before a restart drops what it knew. Blocks the SSD kept across the
restart are announced as a lookup adopts them (the cache adopts recovered
blocks lazily, when a request asks for their prefix), not at start.

Publishing never blocks the server: PUB drops what a slow subscriber cannot
take (at the high-water mark), and the subscriber sees the gap in ``seq``.
"""

from __future__ import annotations

import zmq

from saria.core.events import CacheEvent
from saria.index import Tier
from saria.routing import wire

MEDIUM = {Tier.DRAM: wire.MEDIUM_CPU, Tier.SSD: wire.MEDIUM_STORAGE}


def to_wire(events: list[CacheEvent], *, block_size: int, digest: int,
            int_hashes: bool = True) -> list[wire.Event]:
    """The core's events as wire events; chains keep their parent."""
    h = lambda k: wire.block_hash(k, digest, int_hashes)  # noqa: E731
    out: list[wire.Event] = []
    for ev in events:
        medium = MEDIUM.get(ev.tier)
        if medium is None:
            continue  # GPU residency is the engine's to announce
        hashes = tuple(h(k) for k in ev.keys)
        if ev.kind == "removed":
            out.append(wire.Removed(hashes, medium))
        elif ev.chained:
            out.append(wire.Stored(hashes, medium, h(ev.parent) if ev.parent else None,
                                   block_size=block_size))
        else:
            out.append(wire.Stored(hashes, medium))
    return out


class EventPublisher:
    """A PUB socket bound at `endpoint`; ``publish`` sends one batch."""

    def __init__(self, endpoint: str, ctx: zmq.Context, *, hwm: int = 100_000) -> None:
        self.sock = ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.set_hwm(hwm)
        self.sock.bind(endpoint)
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._seq: dict[str, int] = {}
        self.batches = 0
        self.events = 0

    def publish(self, topic: str, events: list[wire.Event]) -> None:
        if not events:
            return
        seq = self._seq.get(topic, 0)
        self._seq[topic] = seq + 1
        try:
            self.sock.send_multipart((topic.encode(), seq.to_bytes(8, "big"),
                                      wire.pack_batch(events)), zmq.NOBLOCK)
        except zmq.Again:
            pass  # PUB does not block; a dropped batch shows as a seq gap
        self.batches += 1
        self.events += len(events)

    def close(self) -> None:
        self.sock.close(0)


def residency(cache, *, digest: int, int_hashes: bool = True) -> dict[str, set]:
    """What a ``TieredCache`` holds ready, per medium, as block hashes: what
    an indexer fed by this node's events should hold."""
    d = cache.index.dump()
    ready = d["tiers"] & ~d["filling"]
    return {medium: {wire.block_hash(bytes(k), digest, int_hashes)
                     for k in d["keys"][(ready & tier.bit) != 0]}
            for tier, medium in MEDIUM.items()}
