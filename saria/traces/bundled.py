"""The traces shipped in the repository's ``traces/`` folder, and ``load_trace``.

The folder is found next to the package (``Path(saria.__file__).parents[1] / "traces"``,
i.e. a source checkout or an editable install); ``SARIA_TRACES_DIR`` overrides it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import saria
from saria.errors import ConfigError, TraceFormatError
from saria.traces.azure import load_azure
from saria.traces.bailian import load_bailian
from saria.traces.cache import cached
from saria.traces.model import Trace
from saria.traces.mooncake import load_mooncake
from saria.traces.weka import load_weka

ENV_VAR = "SARIA_TRACES_DIR"
FORMATS = ("auto", "weka", "mooncake", "azure", "bailian")

#: Short name -> file name in the traces folder (see traces/README.md).
BUNDLED = {
    "weka": "weka_kv_cache_tester_traces_v8.tar.xz",
    "mooncake": "mooncake_conversation_trace.jsonl",
    "azure": "azure_llm_inference_2023_conv.csv",
    # Written by us (synthetic, in the Alibaba Bailian format); see traces/README.md.
    "bailian": "bailian_sample.jsonl",
}


def traces_dir() -> Path:
    """The bundled traces folder (``$SARIA_TRACES_DIR`` if set); errors if missing."""
    env = os.environ.get(ENV_VAR)
    d = Path(env) if env else Path(saria.__file__).resolve().parents[1] / "traces"
    if not d.is_dir():
        how = f"${ENV_VAR}" if env else "the repository's traces/ folder"
        raise TraceFormatError(d, None, f"bundled traces folder not found ({how}); set {ENV_VAR}")
    return d


def bundled_trace(name: str) -> Path:
    """Path of one bundled trace by short name: ``weka``, ``mooncake``, ``azure`` or ``bailian``."""
    if name not in BUNDLED:
        raise ConfigError("trace", f"unknown bundled trace {name!r}; valid: {', '.join(BUNDLED)}")
    path = traces_dir() / BUNDLED[name]
    if not path.is_file():
        raise TraceFormatError(path, None, "bundled trace file is missing")
    return path


def resolve_trace(arg: str | os.PathLike[str]) -> Path:
    """A trace argument as users give it: an existing path, else the short
    name of a bundled trace (``weka``, ...), else the path as given (so the
    loader reports it missing)."""
    p = Path(arg)
    if not p.exists() and str(arg) in BUNDLED:
        return bundled_trace(str(arg))
    return p


def bundled_traces() -> dict[str, Path]:
    """All bundled traces, short name -> path, each checked to exist."""
    return {name: bundled_trace(name) for name in BUNDLED}


def detect_format(path: str | os.PathLike[str]) -> str:
    """Guess a trace's format from its name, then from its first bytes."""
    p = Path(path)
    name = p.name.lower()
    if p.is_dir() or name.endswith((".tar.xz", ".txz", ".tar.gz", ".tgz", ".tar")):
        return "weka"
    if name.endswith(".csv"):
        return "azure"
    with open(p, "rb") as f:
        head = f.read(4096)
    # Bailian and Mooncake are both JSONL with input_length/hash_ids: the first record's
    # chat_id tells them apart.
    first = head.lstrip().split(b"\n", 1)[0]
    if b'"chat_id"' in first:
        return "bailian"
    if name.endswith(".jsonl"):
        return "mooncake"
    if head.startswith(b"TIMESTAMP,") or b"ContextTokens" in head.split(b"\n", 1)[0]:
        return "azure"
    if b'"input_length"' in head and b'"hash_ids"' in head:
        return "mooncake"
    if b'"hash_id_scope"' in head or (b'"requests"' in head and b'"block_size"' in head):
        return "weka"
    raise TraceFormatError(
        p, None, f"cannot tell the trace format; pass one of: {', '.join(FORMATS[1:])}"
    )


def load_trace(
    path: str | os.PathLike[str],
    format: str = "auto",
    *,
    limit_sessions: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Trace:
    """Load any supported trace. ``progress(done_bytes, total_bytes)`` is optional.

    ``limit_sessions`` applies to formats with sessions (WEKA) and is ignored otherwise.
    A trace file parsed once is read from its cached parse afterwards
    (``saria.traces.cache``; ``SARIA_CACHE_DIR=off`` turns that off).
    """
    if format not in FORMATS:
        raise ConfigError("format", f"unknown trace format {format!r}; valid: {', '.join(FORMATS)}")
    p = Path(path)
    if not p.exists():
        raise TraceFormatError(p, None, "no such file or directory")
    fmt = detect_format(p) if format == "auto" else format
    limit = limit_sessions if fmt == "weka" else None
    trace = cached(p, fmt, limit, lambda: _parse(p, fmt, limit, progress))
    if progress and p.is_file():  # a cached trace is read at once
        size = p.stat().st_size
        progress(size, size)
    return trace


def _parse(p: Path, fmt: str, limit_sessions: int | None,
           progress: Callable[[int, int], None] | None) -> Trace:
    if fmt == "weka":
        return load_weka(p, limit_sessions=limit_sessions, progress=progress)
    if fmt == "mooncake":
        return load_mooncake(p, progress=progress)
    if fmt == "bailian":
        return load_bailian(p, progress=progress)
    return load_azure(p)
