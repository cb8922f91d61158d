"""Parsed traces kept on disk, so a trace is parsed once, not per command.

Parsing is most of a short replay's fixed cost: the whole bundled WEKA trace
takes ~8 s (JSON decoding of 94 M ids, then arrays), its cached form ~0.5 s.
An entry is one ``.npz`` of plain arrays (no pickle: loading it runs no code)
plus one JSON header for the strings, named by the SHA-256 of the trace file's
bytes, the format, the session limit and ``VERSION`` -- so an edited trace is
parsed afresh and a loader change bumps ``VERSION``, never serving a stale
parse.

Where: ``$SARIA_CACHE_DIR/traces`` (else ``$XDG_CACHE_HOME/saria/traces``,
else ``~/.cache/saria/traces``); ``SARIA_CACHE_DIR=off`` turns it off. The cache
keeps the ``MAX_ENTRIES`` most recently used entries. It is an optimisation
only: an unreadable, corrupt or unwritable entry is ignored
(the trace is parsed as without it), and a folder of files (an unpacked WEKA
bundle) is never cached -- only single files are.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson

from saria.traces.model import Trace, TraceRequest, TraceSession

ENV_VAR = "SARIA_CACHE_DIR"
VERSION = 1  # bump when a loader's output for the same bytes changes
MAX_ENTRIES = 16  # least recently used entries beyond this are removed (~20 MB each for WEKA)

_NONE = -1  # integer columns: None


def cache_dir() -> Path | None:
    """The folder of cached traces, None when caching is off."""
    env = os.environ.get(ENV_VAR)
    if env == "off":
        return None
    if env:
        return Path(env) / "traces"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "saria" / "traces"


def cached(p: Path, fmt: str, limit_sessions: int | None, load: Callable[[], Trace]) -> Trace:
    """``load()``'s trace, from the cache when an entry for these bytes
    exists, else parsed and stored. ``load`` raises for bad input as always:
    a trace that fails to parse is never cached."""
    d = cache_dir()
    if d is None or not p.is_file():
        return load()
    entry = d / f"{_key(p, fmt, limit_sessions)}.npz"
    trace = _read(entry, p)
    if trace is not None:
        _touch(entry)
        return trace
    trace = load()
    _write(entry, trace)
    _trim(d)
    return trace


def _touch(entry: Path) -> None:
    try:
        os.utime(entry)  # its modification time orders the entries for _trim
    except OSError:
        pass


def _trim(d: Path) -> None:
    """At most ``MAX_ENTRIES`` entries: the least recently read or written go."""
    try:
        entries = sorted(d.glob("*.npz"), key=lambda e: e.stat().st_mtime, reverse=True)
        for old in entries[MAX_ENTRIES:]:
            old.unlink()
    except OSError:
        pass  # another process trimming too, or a read-only folder


def _key(p: Path, fmt: str, limit_sessions: int | None) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    h.update(f"|{fmt}|{limit_sessions}|{VERSION}".encode())
    return h.hexdigest()[:40]


def _write(entry: Path, trace: Trace) -> None:
    reqs = list(trace.requests())
    if any(r.hash_ids.dtype not in (np.uint32, np.uint64) for r in reqs):
        return  # an id type this format does not know: parse each time
    shared, tails = _prefix_coded(trace)
    ids32 = [t for r, t in zip(reqs, tails) if r.hash_ids.dtype == np.uint32]
    ids64 = [t for r, t in zip(reqs, tails) if r.hash_ids.dtype != np.uint32]
    names = sorted({r.session for r in reqs} | {s.name for s in trace.sessions})
    name_ix = {n: i for i, n in enumerate(names)}
    header = {
        "name": trace.name, "format": trace.format, "block_size": trace.block_size,
        "partial_last_block": trace.partial_last_block, "has_sessions": trace.has_sessions,
        "names": names, "sessions": [[name_ix[s.name], s.namespace, len(s.requests)]
                                     for s in trace.sessions],
        "agents": {str(i): r.agent_id for i, r in enumerate(reqs) if r.agent_id is not None},
    }
    try:
        cols = dict(
            namespace=np.array([r.namespace for r in reqs], dtype=np.uint64),
            session=np.array([name_ix[r.session] for r in reqs], dtype=np.int64),
            time=np.array([r.time for r in reqs], dtype=np.float64),
            input_tokens=np.array([r.input_tokens for r in reqs], dtype=np.int64),
            output_tokens=np.array([r.output_tokens for r in reqs], dtype=np.int64),
            think_time=_floats([r.think_time for r in reqs]),
            api_time=_floats([r.api_time for r in reqs]),
            is_subagent=np.array([r.is_subagent for r in reqs], dtype=bool),
            line=_ints([r.line for r in reqs]),
            sub_index=_ints([r.sub_index for r in reqs]),
            wide=np.array([r.hash_ids.dtype != np.uint32 for r in reqs], dtype=bool),
            shared=shared,
            num_ids=np.array([t.shape[0] for t in tails], dtype=np.int64),
            ids32=np.concatenate(ids32) if ids32 else np.zeros(0, np.uint32),
            ids64=np.concatenate(ids64) if ids64 else np.zeros(0, np.uint64),
            header=np.frombuffer(orjson.dumps(header), dtype=np.uint8),
        )
    except (OverflowError, TypeError):
        return  # a namespace or field outside the columns' types: parse each time
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=entry.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, **cols)
            os.replace(tmp, entry)  # whole or absent: a reader never sees half an entry
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError:
        pass  # a read-only or full disk: the cache only saves time


def _read(entry: Path, p: Path) -> Trace | None:
    try:
        with np.load(entry, allow_pickle=False) as z:
            c = {k: z[k] for k in z.files}
        h = orjson.loads(c["header"].tobytes())
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, orjson.JSONDecodeError):
        return None  # absent, half-written by a crashed writer, or foreign: parse
    n = c["time"].shape[0]
    if any(c[k].shape[0] != n for k in ("namespace", "session", "num_ids", "wide", "line")):
        return None
    names, agents = h["names"], h["agents"]
    starts = np.cumsum([0] + [count for _, _, count in h["sessions"]])[:-1].tolist()
    first_of_session = dict.fromkeys(starts, True)
    counts = c["num_ids"]
    wide = c["wide"]
    ends32 = np.cumsum(np.where(wide, 0, counts))
    ends64 = np.cumsum(np.where(wide, counts, 0))
    if (n and (ends32[-1] != c["ids32"].shape[0] or ends64[-1] != c["ids64"].shape[0])):
        return None
    cols = {k: c[k].tolist() for k in ("namespace", "session", "time", "input_tokens",
                                        "output_tokens", "think_time", "api_time",
                                        "is_subagent", "line", "sub_index")}
    ids32, ids64 = c["ids32"], c["ids64"]
    shared = c["shared"].tolist()
    if len(shared) != n:
        return None
    reqs = []
    prev = np.zeros(0, np.uint32)
    for i in range(n):
        k = int(counts[i])
        if wide[i]:
            tail = ids64[ends64[i] - k:ends64[i]]
        else:
            tail = ids32[ends32[i] - k:ends32[i]]
        if first_of_session.get(i, False):
            prev = prev[:0]
        if shared[i] > prev.shape[0] or (shared[i] and prev.dtype != tail.dtype):
            return None
        ids = np.concatenate((prev[:shared[i]], tail)) if shared[i] else tail.copy()
        prev = ids
        think, api = cols["think_time"][i], cols["api_time"][i]
        line, sub = cols["line"][i], cols["sub_index"][i]
        reqs.append(TraceRequest(
            namespace=cols["namespace"][i], session=names[cols["session"][i]],
            time=cols["time"][i], input_tokens=cols["input_tokens"][i],
            output_tokens=cols["output_tokens"][i], hash_ids=ids,
            think_time=None if think != think else think, api_time=None if api != api else api,
            is_subagent=cols["is_subagent"][i], agent_id=agents.get(str(i)),
            line=None if line == _NONE else line, sub_index=None if sub == _NONE else sub))
    sessions, at = [], 0
    for name, namespace, count in h["sessions"]:
        sessions.append(TraceSession(name=names[name], namespace=namespace,
                                     requests=reqs[at:at + count]))
        at += count
    if at != n:
        return None
    return Trace(name=h["name"], path=str(p), format=h["format"], block_size=h["block_size"],
                 partial_last_block=h["partial_last_block"], has_sessions=h["has_sessions"],
                 sessions=sessions)


def _prefix_coded(trace: Trace) -> tuple[np.ndarray, list[np.ndarray]]:
    """Each request's ids as (how many lead ids it shares with the session's
    request before it, the rest): a session's turns extend one another, so
    the tails hold a few percent of the ids (the whole WEKA trace: 94 M ids,
    a few M in tails)."""
    shared, tails = [], []
    for sess in trace.sessions:
        prev = np.zeros(0, np.uint32)
        for r in sess.requests:
            ids = r.hash_ids
            m = min(prev.shape[0], ids.shape[0]) if prev.dtype == ids.dtype else 0
            differ = np.flatnonzero(prev[:m] != ids[:m])
            k = int(differ[0]) if differ.size else m
            shared.append(k)
            tails.append(ids[k:])
            prev = ids
    return np.array(shared, dtype=np.int64), tails


def _floats(values: list) -> np.ndarray:
    return np.array([float("nan") if v is None else v for v in values], dtype=np.float64)


def _ints(values: list) -> np.ndarray:
    return np.array([_NONE if v is None else v for v in values], dtype=np.int64)
