"""Loader for the Azure LLM inference traces (2023, Splitwise, ISCA'24).

CSV with header ``TIMESTAMP,ContextTokens,GeneratedTokens`` (columns found by name);
timestamps are absolute ``YYYY-MM-DD HH:MM:SS.fffffff`` (7 fractional digits, truncated
to microseconds). Times become seconds from the earliest request.

There is no prefix identity and no session id: ``block_size is None``, every request has
an empty ``hash_ids`` (one shared read-only array), and all requests form one
pseudo-session (namespace 0, ``has_sessions=False``). Use it for arrival processes and
length distributions only. Errors name ``file:line`` (1-based, the header is line 1).
"""

from __future__ import annotations

import csv
import os
from datetime import datetime
from pathlib import Path

import numpy as np

from saria.errors import TraceFormatError
from saria.traces.model import Trace, TraceRequest, TraceSession

FORMAT = "azure"
COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_NO_IDS = np.empty(0, dtype=np.uint32)
_NO_IDS.flags.writeable = False


def parse_timestamp(text: str) -> datetime:
    """``2023-11-16 18:15:46.6805900`` -> datetime (fraction truncated to 6 digits).

    Truncation, not rounding: the 7th digit is 100 ns, below what we model, and
    ``fromisoformat`` before Python 3.11 accepts only 3 or 6 digits.
    """
    head, dot, frac = text.strip().partition(".")
    if dot:
        if not frac.isdigit():
            raise ValueError(text)
        head = f"{head}.{frac[:6].ljust(6, '0')}"
    stamp = datetime.fromisoformat(head)
    if stamp.tzinfo is not None:  # the data is naive; mixing would break subtraction
        raise ValueError(text)
    return stamp


def load_azure(path: str | os.PathLike[str]) -> Trace:
    p = Path(path)
    stamps: list[datetime] = []
    rows: list[tuple[int, int, int]] = []  # (line, input, output)
    with open(p, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise TraceFormatError(p, 1, "empty file: expected header " + ",".join(COLUMNS))
        header = [h.strip() for h in header]
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise TraceFormatError(p, 1, f"header lacks column {missing[0]!r} (expected {','.join(COLUMNS)})")
        i_ts, i_in, i_out = (header.index(c) for c in COLUMNS)
        for row in reader:
            line = reader.line_num
            if not row or not any(c.strip() for c in row):
                continue
            if len(row) != len(header):
                raise TraceFormatError(p, line, f"expected {len(header)} fields, got {len(row)}")
            try:
                stamps.append(parse_timestamp(row[i_ts]))
            except ValueError:
                raise TraceFormatError(p, line, f"bad timestamp {row[i_ts]!r}") from None
            n_in = _count(p, line, row[i_in], COLUMNS[1])
            rows.append((line, n_in, _count(p, line, row[i_out], COLUMNS[2])))
    t0 = min(stamps) if stamps else None
    requests = [
        TraceRequest(
            namespace=0,
            session=p.stem,
            time=(ts - t0).total_seconds(),
            input_tokens=n_in,
            output_tokens=n_out,
            hash_ids=_NO_IDS,
            line=line,
        )
        for ts, (line, n_in, n_out) in zip(stamps, rows)
    ]
    requests.sort(key=lambda r: r.time)
    return Trace(
        name=p.stem,
        path=str(p),
        format=FORMAT,
        block_size=None,
        partial_last_block=False,
        has_sessions=False,
        sessions=[TraceSession(name=p.stem, namespace=0, requests=requests)],
    )


def _count(p: Path, line: int, text: str, column: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise TraceFormatError(p, line, f"column {column!r} must be an integer, got {text!r}") from None
    if value < 0:
        raise TraceFormatError(p, line, f"column {column!r} is negative ({value})")
    return value
