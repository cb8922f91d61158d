"""The in-memory form of a request trace, shared by every loader.

Invariants (the loaders establish them, everything downstream may rely on them):

- ``TraceRequest.hash_ids`` is a 1-D, C-contiguous numpy array of unsigned ints:
  ``uint32`` when every id of that request fits (all bundled traces), else ``uint64``.
  Consumers treat it as unsigned and widen as needed (``saria.keys.trace`` does).
  It is never a Python list: WEKA alone holds 94 M ids (377 MB as uint32).
- ids are prefix-chained: equal ids at a position mean equal token prefixes up to the
  end of that block, *within one namespace*. Ids from different namespaces are unrelated.
- ``len(hash_ids)`` is ``ceil(input_tokens / block_size)`` when the trace's ids cover a
  partial last block (Mooncake) and ``floor(input_tokens / block_size)`` when they list
  only full blocks (WEKA: the tail ``input_tokens % block_size`` tokens carry no id and
  are always new). Traces without prefix identity (Azure) have empty arrays and
  ``block_size is None``.
- ``TraceRequest.time`` is seconds from the start of its session, >= 0, and a session's
  requests are sorted by it (stable, so equal times keep file order). Sessions of traces
  with absolute times (Mooncake/Azure pseudo-sessions, Bailian) all "start" at trace time
  0, so there ``time`` is the trace's own arrival time; ``saria.traces.arrivals`` re-bases
  each session on its first request when it assigns session start times.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from saria.errors import TraceFormatError

#: Ids that fit this bound are stored as uint32 (half the memory of uint64).
UINT32_LIMIT = 1 << 32


@dataclass(slots=True, eq=False)
class TraceRequest:
    """One LLM call of a trace.

    ``line`` locates the request in its source for error messages: the 1-based line for
    JSONL/CSV files, the 0-based index in the session's top-level ``requests`` list for
    WEKA (``sub_index`` is then the index inside a subagent's ``requests``, else None).
    """

    namespace: int
    session: str
    time: float
    input_tokens: int
    output_tokens: int
    hash_ids: np.ndarray
    think_time: float | None = None
    api_time: float | None = None
    is_subagent: bool = False
    agent_id: str | None = None
    line: int | None = None
    sub_index: int | None = None

    @property
    def num_blocks(self) -> int:
        return int(self.hash_ids.shape[0])


@dataclass(slots=True, eq=False)
class TraceSession:
    """A sequence of requests sharing one id namespace, sorted by ``time``.

    For traces without session ids (Mooncake, Azure) a loader returns one pseudo-session
    whose times are the trace's own arrival times; its requests are independent (open
    loop) and ``Trace.has_sessions`` is False.
    """

    name: str
    namespace: int
    requests: list[TraceRequest] = field(default_factory=list)

    @property
    def duration(self) -> float:
        """Seconds between the first and the last arrival (0 for < 2 requests)."""
        if len(self.requests) < 2:
            return 0.0
        return self.requests[-1].time - self.requests[0].time


@dataclass(slots=True, eq=False)
class Trace:
    """A loaded trace: its sessions plus what is needed to interpret the ids.

    ``block_size`` is the trace's own block size in tokens (None: no ids).
    ``partial_last_block`` is True when ids cover a partial last block (ceil), False
    when only full blocks are listed (floor).
    """

    name: str
    path: str
    format: str
    block_size: int | None
    partial_last_block: bool
    has_sessions: bool
    sessions: list[TraceSession]

    def requests(self) -> Iterator[TraceRequest]:
        """All requests, session by session, each session in time order."""
        for s in self.sessions:
            yield from s.requests

    @property
    def num_sessions(self) -> int:
        return len(self.sessions)

    @property
    def num_requests(self) -> int:
        return sum(len(s.requests) for s in self.sessions)

    @property
    def num_blocks(self) -> int:
        return sum(r.num_blocks for r in self.requests())

    @property
    def input_tokens(self) -> int:
        return sum(r.input_tokens for r in self.requests())

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests())

    def __repr__(self) -> str:
        return (
            f"Trace({self.name!r}, format={self.format!r}, block_size={self.block_size}, "
            f"sessions={self.num_sessions}, requests={self.num_requests})"
        )


def expected_num_ids(input_tokens: int, block_size: int, partial_last_block: bool) -> int:
    """Number of ids a request of ``input_tokens`` must carry (ceil or floor)."""
    if partial_last_block:
        return -(-input_tokens // block_size)
    return input_tokens // block_size


# --- field validation shared by the loaders -------------------------------------------
# Loaders call these on each parsed record and turn a FieldError into a
# saria.errors.TraceFormatError that names the file and line (or member and request).


def jsonl_records(path: Path, progress: Callable[[int, int], None] | None = None
                  ) -> Iterator[tuple[int, object]]:
    """(1-based line, decoded record) for each non-blank line of a JSONL file.

    A line that is not JSON raises ``TraceFormatError`` naming file and line;
    ``progress(done_bytes, total_bytes)`` is called about every MiB and once at
    the end, so a loader shows progress without its own byte bookkeeping.
    """
    total = path.stat().st_size
    done = next_report = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            done += len(raw)
            if progress and done >= next_report:
                progress(done, total)
                next_report = done + (1 << 20)
            if not raw.strip():
                continue
            try:
                rec = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise TraceFormatError(path, lineno, f"invalid JSON: {exc.msg} (column {exc.colno})") from None
            yield lineno, rec
    if progress:
        progress(total, total)


class FieldError(ValueError):
    """A record field is missing or invalid; the message is one line naming the field."""


def get_field(record: object, key: str) -> object:
    if not isinstance(record, dict):
        raise FieldError(f"expected a JSON object, got {type(record).__name__}")
    try:
        return record[key]
    except KeyError:
        raise FieldError(f"missing field {key!r}") from None


def count_field(record: object, key: str) -> int:
    """A required non-negative integer (token counts)."""
    value = get_field(record, key)
    # bool is an int subclass; a JSON true is not a length.
    if not isinstance(value, int) or isinstance(value, bool):
        raise FieldError(f"field {key!r} must be an integer, got {value!r}")
    if value < 0:
        raise FieldError(f"field {key!r} is negative ({value})")
    return value


def time_field(record: object, key: str, *, scale: float = 1.0) -> float:
    """A required finite, non-negative number, multiplied by ``scale``."""
    value = get_field(record, key)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise FieldError(f"field {key!r} must be a number, got {value!r}")
    if not (0.0 <= value < float("inf")):
        raise FieldError(f"field {key!r} must be finite and non-negative, got {value!r}")
    return float(value) * scale


def optional_time_field(record: dict, key: str) -> float | None:
    if record.get(key) is None:
        return None
    return time_field(record, key)


def hash_ids_field(record: object, key: str, expected_len: int | None) -> np.ndarray:
    """The id list as a compact unsigned array, checked for type, sign and length."""
    value = get_field(record, key)
    if not isinstance(value, list):
        raise FieldError(f"field {key!r} must be a list, got {type(value).__name__}")
    if expected_len is not None and len(value) != expected_len:
        raise FieldError(
            f"field {key!r} has {len(value)} ids, expected {expected_len} for this input length"
        )
    if not value:
        return np.empty(0, dtype=np.uint32)
    arr = _int64_ids(value)
    if arr is None:
        try:
            # No dtype: numpy infers int64 for a list of ints, float/str/object otherwise,
            # which we reject instead of silently truncating 1.5 to 1.
            arr = np.array(value)
        except (OverflowError, ValueError):
            raise FieldError(f"field {key!r} must be a list of integers") from None
    if arr.dtype.kind not in "iu" or arr.ndim != 1:
        if arr.dtype == object and all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 64 for v in value
        ):
            return np.array(value, dtype=np.uint64)  # ids in [2**63, 2**64)
        raise FieldError(f"field {key!r} must be a list of integers in [0, 2**64)")
    if arr.dtype.kind == "i" and int(arr.min()) < 0:
        raise FieldError(f"field {key!r} has a negative id ({int(arr.min())})")
    if int(arr.max()) < UINT32_LIMIT:
        return arr.astype(np.uint32)
    return arr.astype(np.uint64)


def _int64_ids(value: list) -> np.ndarray | None:
    """The fast path of ``hash_ids_field`` (a trace's ids are most of its
    load time): ``array('q')`` takes Python ints only -- a float or a string
    raises, where numpy's typed conversion would truncate 1.5 to 1 or parse
    "3" -- at twice the speed of numpy's type inference. None sends the list
    to the checking path: not all int64, or all 0/1 (which may be JSON
    booleans, never valid ids there)."""
    try:
        arr = np.frombuffer(array("q", value), dtype=np.int64)
    except (TypeError, OverflowError):
        return None
    return arr if int(arr.max()) > 1 else None
