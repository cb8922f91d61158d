"""The scheduler's ledger of copies sent to the workers and not yet done.

An op is one load or one store the workers carry out between their KV pages
and DRAM slots; the cache keeps its blocks locked until the op completes.
Every tensor-parallel rank copies its own share of each page, so an op is
done only when all ``world`` workers acked it; one failed ack fails it.

A lost ack would pin the op's blocks forever, so every op has a deadline:
past it, ``expired`` hands the op back to be completed as failed. The
deadline is long (``op_timeout_s``, minutes): a worker that still copies
into a slot after its op was failed could write into a reused slot, so the
deadline must be far beyond any real copy -- it exists for acks that never
come, not for slow copies.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class PendingOp:
    op_id: int
    kind: str          # "load" or "store"
    req_id: str
    spec: Any          # the cache's LoadSpec or StoreSpec
    deadline: float
    acks: int = 0
    bad: list = field(default_factory=list)  # SSD handles a worker could not read (loads)


class OpTracker:
    """Op ids, acks from every rank, deadlines."""

    def __init__(self, world: int, timeout_s: float = 300.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if world < 1:
            raise ValueError(f"world must be at least 1, got {world}")
        self.world = world
        self.timeout_s = float(timeout_s)
        self._clock = clock
        self._ops: dict[int, PendingOp] = {}
        self._next = 0

    def start(self, kind: str, req_id: str, spec: Any) -> int:
        """Registers a new op; returns its id (unique within the engine)."""
        self._next += 1
        self._ops[self._next] = PendingOp(self._next, kind, req_id, spec,
                                          self._clock() + self.timeout_s)
        return self._next

    def ack(self, op_id: int, *, ok: bool, count: int = 1, bad=()) -> PendingOp | None:
        """Records `count` workers' result for an op (with the SSD handles
        they could not read); returns the op once it is finished (every
        worker ok, or any one failed), else None. Acks for unknown ops
        (already failed, or expired) are ignored."""
        op = self._ops.get(op_id)
        if op is None:
            return None
        if not ok:
            return self._ops.pop(op_id)
        op.bad.extend(h for h in bad if h not in op.bad)
        op.acks += count
        if op.acks >= self.world:
            return self._ops.pop(op_id)
        return None

    def expired(self) -> list[PendingOp]:
        """Ops past their deadline, removed from the ledger (complete them as failed)."""
        now = self._clock()
        late = [op for op in self._ops.values() if op.deadline <= now]
        for op in late:
            del self._ops[op.op_id]
        return late

    def stores_pending(self, req_id: str) -> bool:
        return any(op.kind == "store" and op.req_id == req_id for op in self._ops.values())

    def loads_pending(self, req_id: str) -> bool:
        return any(op.kind == "load" and op.req_id == req_id for op in self._ops.values())

    def pending(self) -> list[PendingOp]:
        return list(self._ops.values())

    def __len__(self) -> int:
        return len(self._ops)
