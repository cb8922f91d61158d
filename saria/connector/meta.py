"""What the scheduler side and the worker side tell each other, once per step.

Scheduler -> worker: ``SariaMetadata`` rides in ``scheduler_output`` (pickled).
Worker -> scheduler: ``SariaWorkerMetadata`` rides in ``KVConnectorOutput``.

A copy is a ``Transfer`` of whole blocks from one medium to another, named
by both ends (vLLM ``kv_offload``'s typed specs): the engine's KV pages
(``KV``: GPU or CPU, by KV block id), saria's DRAM pool (``DRAM``: by slot; a
slot holds every layer's page of the block, one after the other, and every
tensor-parallel rank's, rank-major) and saria's SSD store (``SSD``: by
handle, with the block's key, which the store verifies). The worker picks a
handler by the (source, destination) pair. One op (an id unique within the
engine) may carry several transfers: a load from DRAM and SSD at once.
Invariants:

* the scheduler locks an op's blocks in the index until every worker reported
  the op, so no eviction reuses a slot or SSD handle mid-copy;
* a worker runs a step's transfers to the pool in order, per layer: a load of a
  block stored by an earlier op reads the stored bytes;
* a store op is reported done only when all its layers are in the pool; only
  then may admission read the slots (an SSD write);
* an SSD block that fails its read (I/O, checksum, wrong key) is reported by
  handle: its KV block goes to vLLM as invalid (recomputed) and the scheduler
  drops the copy from the SSD tier;
* with a cache server, a transfer names the server boot and session its
  slots belong to (``epoch``); a worker whose mapped pool is another boot's
  (the server restarted between the prepare and the copy), whose session is
  another, that cannot map the pool, or whose session the server fenced
  (``saria.serve.fence``), fails the op: loads are recomputed, stores
  dropped. Workers hold the session's fence while copies are in flight.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorMetadata,
                                                                KVConnectorWorkerMetadata)


class Medium(str, enum.Enum):
    KV = "kv"        # the engine's KV pages, by KV block id
    DRAM = "dram"    # saria's shared DRAM pool, by slot
    SSD = "ssd"      # saria's SSD store, by handle


@dataclass
class Transfer:
    """Block ``i`` moves from ``src_ids[i]`` in ``src`` to ``dst_ids[i]`` in
    ``dst``. ``keys`` (32 bytes per block, concatenated) name SSD sources."""

    op_id: int
    req_id: str
    src: Medium
    dst: Medium
    src_ids: list[int]
    dst_ids: list[int]
    keys: bytes = b""
    # the server boot and session whose slots these are ("" in-process): a
    # worker runs a transfer only in that session, never a restarted server's
    # or an ended session's
    epoch: str = ""
    # several attention groups (hybrid / sliding-window models): the KV end's
    # block ids per group (``groups.py``); 0 (the null block) is skipped
    groups: list[list[int]] | None = None

    @property
    def kind(self) -> tuple[Medium, Medium]:
        return (self.src, self.dst)

    def kv_ids(self, group: int = 0) -> list[int]:
        """The KV blocks of attention group `group`, one per block of the transfer."""
        if self.groups is not None:
            return self.groups[group]
        return self.dst_ids if self.dst == Medium.KV else self.src_ids

    def other_ids(self) -> list[int]:
        """The slots / handles at the end that is not the KV cache."""
        return self.src_ids if self.dst == Medium.KV else self.dst_ids

    def __len__(self) -> int:
        return len(self.src_ids)


@dataclass
class StateCopy:
    """A recurrent-state checkpoint between the KV cache's state blocks (one
    per recurrent group: ``kv_ids``) and a checkpoint's DRAM slots or SSD
    handles (``ids``, ``state_units`` of them, with their keys on the SSD).
    Stores run after the forward pass, loads before it."""

    op_id: int
    req_id: str
    src: Medium
    dst: Medium
    kv_ids: list[int]
    ids: list[int]
    keys: bytes = b""


@dataclass
class SariaMetadata(KVConnectorMetadata):
    loads: list[Transfer] = field(default_factory=list)    # into KV pages, before the forward
    stores: list[Transfer] = field(default_factory=list)   # out of KV pages, as layers finish
    # requests whose block free the scheduler delayed: report each in
    # finished_sending once its store ops are done
    delayed: list[str] = field(default_factory=list)
    # requests vLLM preempted this step: their blocks may be handed out again
    preempted: list[str] = field(default_factory=list)
    # identity of the shared pool the scheduler mapped (device, inode)
    pool_id: tuple[int, int] | None = None
    # with a cache server: the pool file and SSD store directories to map
    server_pool: tuple[str, tuple[str, ...]] | None = None
    # with a cache server: its boot and this engine's session ("boot/session"),
    # whose slots the step may use, and the session's fence file
    server_epoch: str = ""
    server_fence: str = ""
    # KV blocks a request attends this step whose load failed and that no
    # forward has written since: the workers report them as load errors, so
    # vLLM recomputes them instead of attending to what the pages hold
    unfilled: list[int] = field(default_factory=list)
    # hybrid models: recurrent-state checkpoints to load / store (``states.py``)
    states: list[StateCopy] = field(default_factory=list)
    # blocks the scheduler asked the cache to store this step (copied or held
    # already): only for telling a step with a store due from an idle one
    stores_due: int = 0


@dataclass
class SariaWorkerMetadata(KVConnectorWorkerMetadata):
    done: Counter = field(default_factory=Counter)     # op id -> workers done
    failed: Counter = field(default_factory=Counter)   # op id -> workers failed
    bad_ssd: dict = field(default_factory=dict)        # op id -> SSD handles that failed their read

    def aggregate(self, other: "SariaWorkerMetadata") -> "SariaWorkerMetadata":
        bad = {k: sorted(set(v)) for k, v in self.bad_ssd.items()}
        for k, v in other.bad_ssd.items():
            bad[k] = sorted(set(bad.get(k, [])) | set(v))
        return SariaWorkerMetadata(self.done + other.done, self.failed + other.failed, bad)
