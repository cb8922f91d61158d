"""Loader for WEKA kv-cache-tester agentic traces (real Claude Code sessions).

Accepted inputs: the ``.tar.xz`` bundle (read as a stream with ``tarfile`` mode
``r|xz``, never unpacked to disk), a directory of ``trace_NNNN.json`` files, or one such
file. Format (see traces/README.md): one JSON object per session with ``id``,
``block_size`` (64) and ``requests``; a request has ``t`` (seconds from session start),
``type`` (``n``/``s``: ordinary requests; ``subagent``: a marker with its own nested
``requests`` whose ``t`` is relative to the marker's ``t``), ``in``, ``out``,
``hash_ids`` (only full blocks: ``len == floor(in / block_size)``), and optional
``think_time`` / ``api_time``.

Mapping to the model:

- namespace = the number in the session id (``trace_0002`` -> 2): ids are local to a
  session; subagents share the parent's namespace (they do in the data: same ids for the
  shared prefix) and are merged into the parent session with ``is_subagent=True`` and
  absolute session time ``marker.t + t``.
- errors name the file (or the tar path plus member) and the request as a JSON path,
  e.g. ``member weka_traces/trace_0002.json: requests[5].requests[2]: missing field 'in'``.
"""

from __future__ import annotations

import lzma
import os
import re
import tarfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path

import orjson

from saria.errors import ConfigError, TraceFormatError
from saria.traces.model import (
    FieldError,
    Trace,
    TraceRequest,
    TraceSession,
    count_field,
    get_field,
    hash_ids_field,
    optional_time_field,
    time_field,
)

FORMAT = "weka"
_ID_NUMBER = re.compile(r"(\d+)$")
_ORDINARY_TYPES = ("n", "s")

#: progress(done, total) in bytes of the input file(s) read so far.
Progress = Callable[[int, int], None]


def load_weka(
    path: str | os.PathLike[str],
    *,
    limit_sessions: int | None = None,
    progress: Progress | None = None,
) -> Trace:
    """Load a WEKA trace bundle, directory or single session file.

    ``limit_sessions`` keeps the first N sessions in file order (tar order; sorted file
    names for a directory). Sessions are returned sorted by namespace.
    """
    p = Path(path)
    if limit_sessions is not None and limit_sessions < 0:
        raise ConfigError("limit_sessions", f"must be >= 0, got {limit_sessions}")
    sessions: list[TraceSession] = []
    block_size: int | None = None
    seen: dict[int, str] = {}
    if limit_sessions != 0:
        # closing: an early break stops the tar stream now, not at garbage collection
        with closing(_documents(p, progress)) as docs:
            for origin, data in docs:
                session, bs = _parse_session(p, origin, data)
                if block_size is None:
                    block_size = bs
                elif bs != block_size:
                    msg = f"block_size {bs} differs from earlier sessions' {block_size}"
                    raise TraceFormatError(p, None, origin + msg)
                if session.namespace in seen:
                    msg = f"session id {session.name!r} has the same number as {seen[session.namespace]!r}"
                    raise TraceFormatError(p, None, origin + msg)
                seen[session.namespace] = session.name
                sessions.append(session)
                if limit_sessions is not None and len(sessions) >= limit_sessions:
                    break
        if not sessions:
            raise TraceFormatError(p, None, "no session (.json) files found")
    sessions.sort(key=lambda s: s.namespace)
    return Trace(
        name=_trace_name(p),
        path=str(p),
        format=FORMAT,
        block_size=block_size if block_size is not None else 64,
        partial_last_block=False,
        has_sessions=True,
        sessions=sessions,
    )


def _trace_name(p: Path) -> str:
    name = p.name
    for suffix in (".tar.xz", ".txz", ".tar", ".json"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _documents(p: Path, progress: Progress | None) -> Iterator[tuple[str, object]]:
    """Yield (origin prefix for messages, parsed JSON) for each session document."""
    if p.is_dir():
        # rglob: accept the unpacked bundle's root (weka_traces/...) as well as the folder.
        files = sorted(f for f in p.rglob("*.json") if f.is_file())
        total = sum(f.stat().st_size for f in files)
        done = 0
        for f in files:
            raw = f.read_bytes()
            done += len(raw)
            yield f"file {f.relative_to(p)}: ", _loads(f, None, raw)
            if progress:
                progress(done, total)
        return
    if p.name.endswith(".json"):
        raw = p.read_bytes()
        yield "", _loads(p, None, raw)
        if progress:
            progress(len(raw), len(raw))
        return
    yield from _tar_documents(p, progress)


def _tar_documents(p: Path, progress: Progress | None) -> Iterator[tuple[str, object]]:
    total = p.stat().st_size
    with open(p, "rb") as raw:
        try:
            # "r|*": a pure stream (xz, gz, bz2 or plain), members read in order, no seeks.
            with tarfile.open(fileobj=raw, mode="r|*") as tar:
                for member in tar:
                    if not (member.isfile() and member.name.endswith(".json")):
                        continue
                    fobj = tar.extractfile(member)
                    assert fobj is not None  # regular file
                    data = _loads(p, member.name, fobj.read())
                    if progress:
                        progress(raw.tell(), total)
                    yield f"member {member.name}: ", data
        except (tarfile.TarError, EOFError, lzma.LZMAError, zlib.error, OSError) as exc:
            # A truncated or corrupt stream: one line, not a decompressor traceback.
            raise TraceFormatError(p, None, f"cannot read tar bundle: {exc}") from None


def _loads(p: Path, member: str | None, raw: bytes) -> object:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        where = f"member {member}: " if member else ""
        line = None if member else exc.lineno
        msg = f"{where}invalid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        raise TraceFormatError(p, line, msg) from None


def _parse_session(p: Path, origin: str, doc: object) -> tuple[TraceSession, int]:
    """One session document -> (session, block_size); errors carry ``origin``."""
    loc = ""
    try:
        sid = get_field(doc, "id")
        m = _ID_NUMBER.search(sid) if isinstance(sid, str) else None
        if m is None:
            raise FieldError(f"field 'id' must be a string ending in a number, got {sid!r}")
        bs = count_field(doc, "block_size")
        if bs == 0:
            raise FieldError("field 'block_size' must be positive")
        top = get_field(doc, "requests")
        if not isinstance(top, list):
            raise FieldError("field 'requests' must be a list")
        namespace = int(m.group(1))
        out: list[TraceRequest] = []
        for i, rec in enumerate(top):
            loc = f"requests[{i}]: "
            kind = get_field(rec, "type")
            if kind in _ORDINARY_TYPES:
                out.append(_request(rec, namespace, sid, bs, 0.0, i, None, None))
            elif kind == "subagent":
                base = time_field(rec, "t")
                agent = rec.get("agent_id")
                agent = agent if isinstance(agent, str) else f"subagent@{i}"
                inner = get_field(rec, "requests")
                if not isinstance(inner, list):
                    raise FieldError("field 'requests' of a subagent must be a list")
                for j, sub in enumerate(inner):
                    loc = f"requests[{i}].requests[{j}]: "
                    kind = get_field(sub, "type")
                    if kind not in _ORDINARY_TYPES:
                        raise FieldError(f"field 'type' must be 'n' or 's' inside a subagent, got {kind!r}")
                    out.append(_request(sub, namespace, sid, bs, base, i, j, agent))
            else:
                raise FieldError(f"field 'type' must be 'n', 's' or 'subagent', got {kind!r}")
    except FieldError as exc:
        raise TraceFormatError(p, None, f"{origin}{loc}{exc}") from None
    out.sort(key=lambda r: r.time)  # stable: equal times keep file order
    return TraceSession(name=sid, namespace=namespace, requests=out), bs


def _request(
    rec: dict, namespace: int, sid: str, bs: int, base: float, i: int, j: int | None, agent: str | None
) -> TraceRequest:
    n_in = count_field(rec, "in")
    return TraceRequest(
        namespace=namespace,
        session=sid,
        time=base + time_field(rec, "t"),
        input_tokens=n_in,
        output_tokens=count_field(rec, "out"),
        hash_ids=hash_ids_field(rec, "hash_ids", n_in // bs),  # WEKA: full blocks only
        think_time=optional_time_field(rec, "think_time"),
        api_time=optional_time_field(rec, "api_time"),
        is_subagent=j is not None,
        agent_id=agent,
        line=i,
        sub_index=j,
    )
