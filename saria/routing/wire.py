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

Media: DRAM is vLLM's ``CPU``; the SSD its ``STORAGE`` with ``locality``
``LOCAL``; a cluster tier (Mooncake Store) ``STORAGE`` with ``locality``
``REMOTE`` -- vLLM's own marking of a storage tier the publisher does not hold
itself, so routers that know only vLLM's media accept it (Dynamo's router
fails closed on a medium it does not know; llm-d scores an unconfigured tier
0). Inside saria the cluster tier keeps its own name, ``CLUSTER``
(``medium_of``); an event written with it goes out as ``STORAGE`` +
``REMOTE``, and an older publisher's ``CLUSTER`` is still read.

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
LOCAL, REMOTE = "LOCAL", "REMOTE"  # vLLM's locality: relative to the publisher
_MASK64 = (1 << 64) - 1


def block_hash(key: bytes, digest: int = 32, as_int: bool = True) -> int | bytes:
    """What vLLM's ``maybe_convert_block_hash`` makes of a block key."""
    d = bytes(key[:digest])
    return int.from_bytes(d, "big") & _MASK64 if as_int else d


def medium_of(ev: "Stored | Removed") -> str:
    """saria's medium of an event as read off the wire: ``STORAGE`` +
    ``REMOTE`` (or an older publisher's ``CLUSTER``) is the cluster tier,
    ``STORAGE`` otherwise the node's own SSD."""
    if ev.medium == MEDIUM_CLUSTER or (ev.medium == MEDIUM_STORAGE and ev.locality == REMOTE):
        return MEDIUM_CLUSTER
    return ev.medium


def _wire_medium(medium: str, locality: str | None) -> tuple[str, str | None]:
    """What goes on the wire for saria's medium: the cluster tier as vLLM marks a
    remote storage tier, the SSD as a local one."""
    if medium == MEDIUM_CLUSTER:
        return MEDIUM_STORAGE, REMOTE
    if medium == MEDIUM_STORAGE and locality is None:
        return MEDIUM_STORAGE, LOCAL
    return medium, locality


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
    if isinstance(ev, Cleared):
        return {"type": "AllBlocksCleared"}
    if not isinstance(ev, (Stored, Removed)):
        raise TypeError(f"not a KV event: {ev!r}")
    medium, locality = _wire_medium(ev.medium, ev.locality)
    if isinstance(ev, Stored):
        m = {"type": "BlockStored", "block_hashes": list(ev.hashes),
             "parent_block_hash": ev.parent, "token_ids": list(ev.token_ids),
             "block_size": ev.block_size, "lora_id": None, "medium": medium,
             "lora_name": None}
    else:
        m = {"type": "BlockRemoved", "block_hashes": list(ev.hashes), "medium": medium}
    if locality is not None:
        m["locality"] = locality
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
