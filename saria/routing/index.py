"""Which node holds which block in which medium, built only from KV events.

``FleetIndex`` is what a router keeps: fed by every node's events (saria's
``saria serve --events`` for DRAM and SSD, vLLM's own publisher for GPU
residency), it answers, for a request's block hashes, how long a prefix each
node can reload and from which medium each block would come.

The cluster tier is one store shared by every node: a block any node
announced in ``CLUSTER`` can be loaded by all of them, so it extends every
node's prefix, not only the announcer's.

Invariants: the index holds exactly what the events it applied say (a
``Stored`` adds the medium, a ``Removed`` takes it away, ``Cleared`` forgets
the node); a topic whose ``seq`` skipped numbers is counted in ``gaps`` (its
node's view may be stale until it restarts, as with vLLM's publisher without
replay); a ``seq`` of 0 is a restarted publisher, not a gap.
"""

from __future__ import annotations

from collections import defaultdict

from saria.routing import wire

#: A medium's bit in ``FleetIndex.media``.
BIT = {wire.MEDIUM_GPU: 1, wire.MEDIUM_CPU: 2, wire.MEDIUM_STORAGE: 4, wire.MEDIUM_CLUSTER: 8}


class FleetIndex:
    def __init__(self) -> None:
        self._held: dict[str, dict] = {}           # node -> {hash: media bits}
        self._cluster: dict = {}                    # hash -> announcers
        self._seq: dict[str, int] = {}
        self.gaps = 0
        self.batches = 0

    # ------------------------------------------------------------ feeding

    def ingest(self, topic: bytes | str, seq: bytes | int, payload: bytes) -> None:
        """One ZMQ message of a publisher (``topic, seq, payload``)."""
        t = topic.decode() if isinstance(topic, bytes) else topic
        n = int.from_bytes(seq, "big") if isinstance(seq, bytes) else int(seq)
        last = self._seq.get(t)
        if last is not None and n != last + 1 and n != 0:  # 0: the publisher restarted
            self.gaps += 1
        self._seq[t] = n
        node, _ = wire.parse_topic(t)
        self.apply(node, wire.unpack_batch(payload, where=f"topic {t!r} seq {n}"))

    def apply(self, node: str, batch: wire.Batch) -> None:
        held = self._held.setdefault(node, {})
        for ev in batch.events:
            if isinstance(ev, wire.Cleared):
                held.clear()
                for h in [h for h, who in self._cluster.items() if node in who]:
                    self._drop_cluster(h, node)
                continue
            medium = wire.medium_of(ev)  # STORAGE + REMOTE: the cluster tier
            bit = BIT.get(medium)
            if bit is None:
                continue  # a medium this router does not know
            if medium == wire.MEDIUM_CLUSTER:
                for h in ev.hashes:
                    if isinstance(ev, wire.Stored):
                        self._cluster.setdefault(h, set()).add(node)
                    else:  # one store: a removal is the store's, whoever announces it
                        self._cluster.pop(h, None)
                continue
            if isinstance(ev, wire.Stored):
                for h in ev.hashes:
                    held[h] = held.get(h, 0) | bit
            else:
                for h in ev.hashes:
                    m = held.get(h, 0) & ~bit
                    if m:
                        held[h] = m
                    else:
                        held.pop(h, None)
        self.batches += 1

    def _drop_cluster(self, h, node: str) -> None:
        """A restarted node's announcements no longer vouch for the store; the
        objects themselves may still be there, but nobody says so now."""
        who = self._cluster.get(h)
        if who is not None:
            who.discard(node)
            if not who:
                del self._cluster[h]

    # ------------------------------------------------------------ reading

    @property
    def nodes(self) -> list[str]:
        return sorted(self._held)

    def holds(self, node: str) -> dict[str, set]:
        """A node's blocks per medium (the cluster tier's are the fleet's)."""
        out: dict[str, set] = defaultdict(set)
        for h, bits in self._held.get(node, {}).items():
            for medium, bit in BIT.items():
                if bits & bit:
                    out[medium].add(h)
        out[wire.MEDIUM_CLUSTER] = set(self._cluster)
        return {m: out[m] for m in BIT}

    def media(self, node: str, hashes: list) -> list[int]:
        """For each block of the longest prefix of `hashes` that `node` can
        reload, the media holding it (``BIT`` bits; the cluster tier's count
        for every node); the prefix ends at the first block it cannot."""
        held = self._held.get(node, {})
        cluster = BIT[wire.MEDIUM_CLUSTER]
        out = []
        for h in hashes:
            bits = held.get(h, 0) | (cluster if h in self._cluster else 0)
            if not bits:
                break
            out.append(bits)
        return out
