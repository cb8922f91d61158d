"""Loader for Mooncake (FAST'25) JSONL traces.

One request per line: ``timestamp`` (integer milliseconds from trace start),
``input_length``, ``output_length``, ``hash_ids`` (512-token blocks, prefix-chained,
global ids; the last id covers a partial block: ``len == ceil(input_length / 512)``).

Mapping to the model: the file has no session ids, so every request goes into ONE
pseudo-session (``has_sessions=False``, namespace 0, the ids are global) whose times are
the trace's arrival times in seconds. Replays treat its requests as independent (open
loop). Blank lines are skipped; errors name ``file:line`` (1-based).
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
    hash_ids_field,
    jsonl_records,
    time_field,
)

FORMAT = "mooncake"
#: Per the Mooncake FAST25-release README.
DEFAULT_BLOCK_SIZE = 512
NAMESPACE = 0


def load_mooncake(
    path: str | os.PathLike[str],
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    progress: Callable[[int, int], None] | None = None,
) -> Trace:
    """Load a Mooncake JSONL trace; ``progress(done_bytes, total_bytes)`` per ~1 MB."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    p = Path(path)
    name = p.stem
    requests: list[TraceRequest] = []
    for lineno, rec in jsonl_records(p, progress):
        try:
            n_in = count_field(rec, "input_length")
            req = TraceRequest(
                namespace=NAMESPACE,
                session=name,
                time=time_field(rec, "timestamp", scale=1e-3),  # ms -> s
                input_tokens=n_in,
                output_tokens=count_field(rec, "output_length"),
                hash_ids=hash_ids_field(rec, "hash_ids", expected_num_ids(n_in, block_size, True)),
                line=lineno,
            )
        except FieldError as exc:
            raise TraceFormatError(p, lineno, str(exc)) from None
        requests.append(req)
    requests.sort(key=lambda r: r.time)  # the file is sorted; stable sort keeps ties in order
    return Trace(
        name=name,
        path=str(p),
        format=FORMAT,
        block_size=block_size,
        partial_last_block=True,
        has_sessions=False,
        sessions=[TraceSession(name=name, namespace=NAMESPACE, requests=requests)],
    )
