"""Residency events of the cache core: what entered or left a tier.

The ``CacheManager`` appends one ``CacheEvent`` per change when it keeps an
event log, and ``take_events()`` drains them (vLLM's pattern: the scheduler
drains events after every step). The vLLM connector translates them into
vLLM's own ``BlockStored`` / ``BlockRemoved``; checkpoints of hybrid models
are not KV blocks and produce no events.

``keys`` of a ``stored`` event with a ``parent`` form a chain: ``keys[0]``'s
parent is ``parent``, each later key's parent is the key before it. Without
a parent (``None``) the keys are independent blocks whose parents the event
does not say (SSD writes of DRAM victims, blocks recovered after a restart).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from saria.index import Tier


@dataclass(frozen=True, slots=True)
class CacheEvent:
    kind: str                 # "stored" or "removed"
    tier: Tier
    keys: tuple[bytes, ...]
    parent: bytes | None = None
    chained: bool = False     # keys form a chain below `parent` (or below the root)


class EventLog:
    """An append-only list drained by ``take``; the caller holds the cache lock."""

    def __init__(self) -> None:
        self._events: list[CacheEvent] = []

    def stored(self, tier: Tier, path: np.ndarray, positions: np.ndarray) -> None:
        """Blocks at `positions` of the key chain `path` entered `tier`: one
        chained event per run of consecutive positions."""
        if positions.size == 0:
            return
        pos = positions.tolist()
        start = 0
        for i in range(1, len(pos) + 1):
            if i == len(pos) or pos[i] != pos[i - 1] + 1:
                first = pos[start]
                parent = bytes(path[first - 1]) if first > 0 else None
                keys = tuple(bytes(path[p]) for p in pos[start:i])
                self._events.append(CacheEvent("stored", tier, keys, parent, True))
                start = i

    def stored_loose(self, tier: Tier, keys: np.ndarray) -> None:
        if keys.shape[0]:
            self._events.append(CacheEvent("stored", tier, tuple(bytes(k) for k in keys)))

    def removed(self, tier: Tier, keys: np.ndarray) -> None:
        if keys.shape[0]:
            self._events.append(CacheEvent("removed", tier, tuple(bytes(k) for k in keys)))

    def take(self) -> list[CacheEvent]:
        out, self._events = self._events, []
        return out
