"""Loader for the Alibaba Bailian (Qwen) trace format (alibaba-edu/qwen-bailian-usagetraces-anon).

One request per JSONL line::

    {"chat_id": 159, "parent_chat_id": 55, "timestamp": 61.114, "input_length": 521,
     "output_length": 132, "type": "text", "turn": 2, "hash_ids": [1089, 1090, ...]}

- ``timestamp``: seconds from the start of the trace file (float).
- ``hash_ids``: 16-token blocks, salted SipHash remapped to integers: ids are GLOBAL
  (equal ids in two chats mean the same prefix, e.g. a shared system prompt) and
  prefix-chained. The public qwen_traceA/B files list ``ceil(input_length / 16)`` ids (the
  last covers a partial block); a file listing only full blocks (floor) is accepted too.
  ``partial_last_block=None`` detects which from the data (every record whose input is not
  a multiple of the block size must agree; with no such record, ceil is assumed) and each
  record's length must be the floor or ceil count, as selected.
- ``type`` (text/search/image/file) is checked to be a string if present and not kept.

Mapping to the model:

- sessions: a request whose ``parent_chat_id`` is ``p`` belongs to ``p``'s session; a
  request with ``parent_chat_id == -1`` starts a session named ``chat_<chat_id>``. The
  parent must appear on an EARLIER line (the files are sorted by timestamp, and a parent
  arrives before its child); ``strict_parents=False`` instead makes a request with an
  unknown parent start its own session (for sampled files that lost the parent).
- ``turn`` must be greater than the parent's ``turn`` (``check_turns``).
- one global namespace (0) for every session, because the ids are global; so
  ``trace_stats`` counts cross-session prefix sharing, as an engine's cache would.
- times are the trace's own (absolute) seconds, like Mooncake's pseudo-session: each
  session's requests sorted by time, sessions ordered by their first request.
  ``saria.traces.arrivals`` re-bases sessions onto chosen start times, or keeps these
  times in ``trace`` mode.

Errors are ``TraceFormatError`` naming ``file:line`` (1-based); blank lines are skipped.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from saria.errors import TraceFormatError
from saria.traces.model import (
    FieldError,
    Trace,
    TraceRequest,
    TraceSession,
    count_field,
    expected_num_ids,
    get_field,
    hash_ids_field,
    jsonl_records,
    time_field,
)

FORMAT = "bailian"
#: Per the dataset's README ("16 tokens per block"; files are named *_blksz_16.jsonl).
DEFAULT_BLOCK_SIZE = 16
NAMESPACE = 0
ROOT_PARENT = -1


def _int_field(rec: object, key: str, minimum: int) -> int:
    value = get_field(rec, key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise FieldError(f"field {key!r} must be an integer, got {value!r}")
    if value < minimum:
        raise FieldError(f"field {key!r} must be >= {minimum}, got {value}")
    return value


def load_bailian(
    path: str | os.PathLike[str],
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    partial_last_block: bool | None = None,
    strict_parents: bool = True,
    check_turns: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> Trace:
    """Load a Bailian JSONL trace; see the module docstring for the mapping and checks."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    p = Path(path)
    partial = partial_last_block
    decided_at: int | None = None  # line that fixed ``partial`` when detecting
    # chat_id -> (line, session index, turn)
    chats: dict[int, tuple[int, int, int]] = {}
    sessions: list[TraceSession] = []
    for lineno, rec in jsonl_records(p, progress):
        try:
            chat = _int_field(rec, "chat_id", 0)
            parent = _int_field(rec, "parent_chat_id", ROOT_PARENT)
            turn = _int_field(rec, "turn", 0)
            kind = get_field(rec, "type") if isinstance(rec, dict) and "type" in rec else "text"
            if not isinstance(kind, str):
                raise FieldError(f"field 'type' must be a string, got {kind!r}")
            n_in = count_field(rec, "input_length")
            ids = hash_ids_field(rec, "hash_ids", None)
            floor_n, ceil_n = n_in // block_size, expected_num_ids(n_in, block_size, True)
            if len(ids) not in (floor_n, ceil_n):
                raise FieldError(
                    f"field 'hash_ids' has {len(ids)} ids, expected {ceil_n} (ceil) or {floor_n} "
                    f"(floor) for input_length {n_in} at {block_size} tokens per block"
                )
            if floor_n != ceil_n:  # this record tells floor from ceil
                is_ceil = len(ids) == ceil_n
                if partial is None:
                    partial, decided_at = is_ceil, lineno
                elif is_ceil != partial:
                    why = f"line {decided_at}" if decided_at is not None else "partial_last_block"
                    want = "ceil" if partial else "floor"
                    raise FieldError(
                        f"field 'hash_ids' has {len(ids)} ids ({'ceil' if is_ceil else 'floor'}), "
                        f"but {why} selected {want} ({ceil_n if partial else floor_n} ids)"
                    )
            if chat in chats:
                raise FieldError(f"chat_id {chat} already used on line {chats[chat][0]}")
            if parent == ROOT_PARENT or (parent not in chats and not strict_parents):
                sess = len(sessions)
                sessions.append(TraceSession(name=f"chat_{chat}", namespace=NAMESPACE))
            elif parent not in chats:
                raise FieldError(f"unknown parent_chat_id {parent} (no earlier line has that chat_id)")
            else:
                p_line, sess, p_turn = chats[parent]
                if check_turns and turn <= p_turn:
                    raise FieldError(
                        f"turn {turn} is not after its parent's turn {p_turn} (chat {parent}, line {p_line})"
                    )
            req = TraceRequest(
                namespace=NAMESPACE,
                session=sessions[sess].name,
                time=time_field(rec, "timestamp"),
                input_tokens=n_in,
                output_tokens=count_field(rec, "output_length"),
                hash_ids=ids,
                line=lineno,
            )
        except FieldError as exc:
            raise TraceFormatError(p, lineno, str(exc)) from None
        chats[chat] = (lineno, sess, turn)
        sessions[sess].requests.append(req)
    for s in sessions:
        s.requests.sort(key=lambda r: r.time)  # stable: equal times keep file order
    sessions.sort(key=lambda s: s.requests[0].time)  # stable; every session has >= 1 request
    return Trace(
        name=p.stem,
        path=str(p),
        format=FORMAT,
        block_size=block_size,
        partial_last_block=True if partial is None else partial,
        has_sessions=True,
        sessions=sessions,
    )
