"""The scheduler's ledger of copies sent to the workers and not yet done.

An op is one load or one store the workers carry out between their KV pages
and DRAM slots; the cache keeps its blocks locked until the op completes.
Every tensor-parallel rank copies its own share of each page, so an op
ends only when all ``world`` workers reported it; one failed report fails
it, but the op still waits for the others. NOTE: ending a store op at its
first failed rank would let the cache free its DRAM slots while the other
ranks' asynchronous copies still write into them (a slot then reused by
another store or a cluster fetch would hold a mix of two blocks).

A lost ack would pin the op's blocks forever, so every op has a deadline.
Past it, ``expired`` hands a *load* back to be completed as failed (its
copies read the slots into KV pages the request no longer trusts). A *store*
(and a recurrent-state checkpoint's copy, each rank writing its part of the
checkpoint's slots) past its deadline has ranks that may still be writing into
its slots and that nothing here can fence, so it is quarantined instead: it
stays in the ledger (its slots held, never reused), ``expired`` hands it back
once so the caller can say so, and it ends when its last report arrives,
however late.
The deadline is long (``op_timeout_s``, minutes): it exists for acks that
never come, not for slow copies.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


# Ops whose ranks write into DRAM slots: past the deadline they are quarantined
# (a state op is one recurrent-state checkpoint's copy, one part per rank).
WRITES = ("store", "state")


@dataclass
class PendingOp:
    op_id: int
    kind: str          # "load", "store" or "state"
    req_id: str
    spec: Any          # the cache's LoadSpec or StoreSpec
    deadline: float
    acks: int = 0
    failed: int = 0    # ranks that reported a failure
    quarantined: bool = False  # a store past its deadline: waits for its last report
    bad: list = field(default_factory=list)  # SSD handles a worker could not read (loads)

    @property
    def ok(self) -> bool:
        """Every rank that reported succeeded (and the op was not quarantined)."""
        return self.failed == 0 and not self.quarantined


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

    def now(self) -> float:
        """The clock the deadlines run on."""
        return self._clock()

    def start(self, kind: str, req_id: str, spec: Any) -> int:
        """Registers a new op; returns its id (unique within the engine)."""
        self._next += 1
        self._ops[self._next] = PendingOp(self._next, kind, req_id, spec,
                                          self._clock() + self.timeout_s)
        return self._next

    def ack(self, op_id: int, *, ok: bool, count: int = 1, bad=()) -> PendingOp | None:
        """Records `count` workers' result for an op (with the SSD handles
        they could not read); returns the op once every worker reported it
        (``op.ok``: none failed), else None. Acks for unknown ops (expired
        loads) are ignored."""
        op = self._ops.get(op_id)
        if op is None:
            return None
        if ok:
            op.bad.extend(h for h in bad if h not in op.bad)
            op.acks += count
        else:
            op.failed += count
        if op.acks + op.failed >= self.world:
            return self._ops.pop(op_id)
        return None

    def get(self, op_id: int) -> PendingOp | None:
        """The pending op `op_id` (None once ended or expired)."""
        return self._ops.get(op_id)

    def expired(self) -> list[PendingOp]:
        """Ops past their deadline, each handed back once: loads leave the
        ledger (complete them as failed); stores and state copies (``WRITES``)
        stay in it, quarantined (``op.quarantined``: keep their slots until
        ``ack`` ends them)."""
        now = self._clock()
        late = [op for op in self._ops.values() if op.deadline <= now and not op.quarantined]
        for op in late:
            if op.kind in WRITES:
                op.quarantined = True
            else:
                del self._ops[op.op_id]
        return late

    def quarantined(self) -> int:
        """Store ops past their deadline still waiting for a rank's report."""
        return sum(op.quarantined for op in self._ops.values())

    def stores_pending(self, req_id: str) -> bool:
        return any(op.kind == "store" and op.req_id == req_id for op in self._ops.values())

    def loads_pending(self, req_id: str) -> bool:
        return any(op.kind == "load" and op.req_id == req_id for op in self._ops.values())

    def pending(self) -> list[PendingOp]:
        return list(self._ops.values())

    def __len__(self) -> int:
        return len(self._ops)
