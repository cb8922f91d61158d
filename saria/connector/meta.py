"""What the scheduler side and the worker side tell each other, once per step.

Scheduler -> worker: ``SariaMetadata`` rides in ``scheduler_output`` (pickled).
Worker -> scheduler: ``SariaWorkerMetadata`` rides in ``KVConnectorOutput``.

A copy is an *op* with an id unique within the engine. Block ``i`` of an op
moves between the engine's KV block ``block_ids[i]`` and the shared DRAM
pool's slot ``slots[i]``; a slot holds every layer's page of the block, one
after the other (and every tensor-parallel rank's, rank-major). Invariants:

* the scheduler locks an op's slots in the index until the worker reports the
  op done, so no eviction reuses a slot mid-copy;
* the worker runs ops in the order it receives them, per layer, on one copy
  thread: a load of a block stored by an earlier op reads the stored bytes;
* a store op is reported done only when all its layers are in the pool; only
  then may the scheduler let admission read the slots (an SSD write).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorMetadata,
                                                                KVConnectorWorkerMetadata)


@dataclass
class CopyOp:
    op_id: int
    req_id: str
    block_ids: list[int]
    slots: list[int]


@dataclass
class SariaMetadata(KVConnectorMetadata):
    loads: list[CopyOp] = field(default_factory=list)
    stores: list[CopyOp] = field(default_factory=list)
    # requests whose block free the scheduler delayed: report each in
    # finished_sending once its store ops are done
    delayed: list[str] = field(default_factory=list)
    # requests vLLM preempted this step: their blocks may be handed out again
    preempted: list[str] = field(default_factory=list)
    # identity of the shared pool the scheduler mapped (device, inode)
    pool_id: tuple[int, int] | None = None


@dataclass
class SariaWorkerMetadata(KVConnectorWorkerMetadata):
    done: Counter = field(default_factory=Counter)     # op id -> workers done
    failed: Counter = field(default_factory=Counter)   # op id -> workers failed

    def aggregate(self, other: "SariaWorkerMetadata") -> "SariaWorkerMetadata":
        return SariaWorkerMetadata(self.done + other.done, self.failed + other.failed)
