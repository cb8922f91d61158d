"""vLLM's KV-event wire format, written and read without vLLM.

A publisher sends ZMQ multipart messages ``(topic, seq, payload)`` on a PUB
socket: ``seq`` an 8-byte big-endian counter per topic (a gap means lost
messages: PUB drops at its high-water mark), ``payload`` a msgpack
``KVEventBatch``, which vLLM encodes with msgspec as an array ``[ts, events]``
(``array_like``, defaults omitted), each event a map tagged by its class name
(``{"type": "BlockStored", ...}``). This module writes exactly what
``vllm.distributed.kv_events.ZmqEventPublisher`` writes, so llm-d's and
Dynamo's indexers read saria's events as they read vLLM's; the tests decode
them with vLLM's own msgspec types.

Media: DRAM is vLLM's ``CPU``, the SSD its ``STORAGE``, and a cluster tier
(Mooncake Store) ``CLUSTER`` with ``locality`` ``REMOTE``: a medium no
engine announces, which indexers that weigh unknown media keep apart.

Block hashes are ints by default (vLLM's ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``,
on by default: the low 64 bits of the key's digest read big-endian), or the
digest's bytes.

The topic names the publisher as llm-d's indexer expects it:
``kv@<node>@<model>``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import msgpack

MEDIUM_GPU, MEDIUM_CPU, MEDIUM_STORAGE, MEDIUM_CLUSTER = "GPU", "CPU", "STORAGE", "CLUSTER"
MEDIA = (MEDIUM_GPU, MEDIUM_CPU, MEDIUM_STORAGE, MEDIUM_CLUSTER)
_MASK64 = (1 << 64) - 1


def block_hash(key: bytes, digest: int = 32, as_int: bool = True) -> int | bytes:
    """What vLLM's ``maybe_convert_block_hash`` makes of a block key."""
    d = bytes(key[:digest])
    return int.from_bytes(d, "big") & _MASK64 if as_int else d


def topic(node: str, model: str) -> str:
    return f"kv@{node}@{model}"


def parse_topic(t: str) -> tuple[str, str]:
    """``kv@node@model`` -> (node, model); a bare topic names the node only."""
    parts = t.split("@", 2)
    if len(parts) == 3 and parts[0] == "kv":
        return parts[1], parts[2]
    return t, ""


@dataclass(frozen=True, slots=True)
class Stored:
    """Blocks that entered `medium`; a chain below `parent` when it is set
    (or when ``token_ids`` are given), else independent blocks."""

    hashes: tuple
    medium: str
    parent: int | bytes | None = None
    token_ids: tuple[int, ...] = ()
    block_size: int = 0
    locality: str | None = None


@dataclass(frozen=True, slots=True)
class Removed:
    hashes: tuple
    medium: str
    locality: str | None = None


@dataclass(frozen=True, slots=True)
class Cleared:
    """Every block of the publisher is gone (a restart): drop its state."""


Event = Stored | Removed | Cleared


@dataclass(slots=True)
class Batch:
    ts: float
    events: list = field(default_factory=list)
    data_parallel_rank: int | None = None


def _event_map(ev: Event) -> dict:
    if isinstance(ev, Stored):
        m = {"type": "BlockStored", "block_hashes": list(ev.hashes),
             "parent_block_hash": ev.parent, "token_ids": list(ev.token_ids),
             "block_size": ev.block_size, "lora_id": None, "medium": ev.medium,
             "lora_name": None}
    elif isinstance(ev, Removed):
        m = {"type": "BlockRemoved", "block_hashes": list(ev.hashes), "medium": ev.medium}
    elif isinstance(ev, Cleared):
        return {"type": "AllBlocksCleared"}
    else:
        raise TypeError(f"not a KV event: {ev!r}")
    if ev.locality is not None:
        m["locality"] = ev.locality
    return m


def pack_batch(events: list[Event], ts: float | None = None,
               data_parallel_rank: int | None = None) -> bytes:
    """A ``KVEventBatch`` payload, byte for byte what vLLM's encoder writes."""
    body = [time.time() if ts is None else ts, [_event_map(e) for e in events]]
    if data_parallel_rank is not None:
        body.append(data_parallel_rank)
    return msgpack.packb(body, use_bin_type=True)


def unpack_batch(payload: bytes, where: str = "payload") -> Batch:
    """Decode a ``KVEventBatch`` from saria or from vLLM; unknown event types
    (vLLM may add some) are skipped, a malformed payload is a ``ValueError``
    naming `where`."""
    try:
        body = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        ts, raw = float(body[0]), body[1]
        dp = body[2] if len(body) > 2 else None
        out = []
        for m in raw:
            kind = m.get("type")
            if kind == "BlockStored":
                out.append(Stored(tuple(m["block_hashes"]), m.get("medium") or MEDIUM_GPU,
                                  m.get("parent_block_hash"), tuple(m.get("token_ids") or ()),
                                  int(m.get("block_size") or 0), m.get("locality")))
            elif kind == "BlockRemoved":
                out.append(Removed(tuple(m["block_hashes"]), m.get("medium") or MEDIUM_GPU,
                                   m.get("locality")))
            elif kind == "AllBlocksCleared":
                out.append(Cleared())
    except (ValueError, TypeError, KeyError, IndexError, AttributeError,
            msgpack.UnpackException) as e:
        raise ValueError(f"{where}: not a KVEventBatch ({type(e).__name__}: {e})") from None
    return Batch(ts, out, dp)
