"""Public LLM-serving request traces: loaders, a common model and statistics.

Formats: WEKA agentic sessions (``.tar.xz`` bundle, 64-token local ids, floor),
Mooncake JSONL (512-token global ids, ceil), Azure CSV (timing and lengths only).
``load_trace(path)`` detects the format; ``bundled_trace("weka")`` finds the copies
shipped in the repository's ``traces/`` folder. Malformed input raises
``saria.errors.TraceFormatError`` naming the file and line (or tar member and request).
"""

from saria.traces.azure import load_azure
from saria.traces.bundled import (
    BUNDLED,
    FORMATS,
    bundled_trace,
    bundled_traces,
    detect_format,
    load_trace,
    traces_dir,
)
from saria.traces.model import Trace, TraceRequest, TraceSession
from saria.traces.mooncake import load_mooncake
from saria.traces.stats import TraceStats, trace_stats
from saria.traces.weka import load_weka

__all__ = [
    "BUNDLED",
    "FORMATS",
    "Trace",
    "TraceRequest",
    "TraceSession",
    "TraceStats",
    "bundled_trace",
    "bundled_traces",
    "detect_format",
    "load_azure",
    "load_mooncake",
    "load_trace",
    "load_weka",
    "trace_stats",
    "traces_dir",
]
