"""Public LLM-serving request traces: loaders, a common model and statistics.

Formats: WEKA agentic sessions (``.tar.xz`` bundle, 64-token local ids, floor),
Mooncake JSONL (512-token global ids, ceil), Azure CSV (timing and lengths only),
Alibaba Bailian JSONL (16-token global ids, sessions via parent_chat_id), plus a seeded
synthetic agent-session generator (``generate_agent_sessions``). ``arrivals`` places
sessions on a replay clock (``ArrivalModel``, ``schedule``).
``load_trace(path)`` detects the format; ``bundled_trace("weka")`` finds the copies
shipped in the repository's ``traces/`` folder. Malformed input raises
``saria.errors.TraceFormatError`` naming the file and line (or tar member and request).
"""

from saria.traces.arrivals import (
    ArrivalModel,
    ScheduledRequest,
    schedule,
    session_starts,
    think_times,
)
from saria.traces.azure import load_azure
from saria.traces.bailian import load_bailian
from saria.traces.bundled import (
    BUNDLED,
    FORMATS,
    bundled_trace,
    bundled_traces,
    detect_format,
    load_trace,
    resolve_trace,
    traces_dir,
)
from saria.traces.model import Trace, TraceRequest, TraceSession
from saria.traces.mooncake import load_mooncake
from saria.traces.stats import TraceStats, trace_stats
from saria.traces.synthetic import AgentShape, generate_agent_sessions
from saria.traces.weka import load_weka

__all__ = [
    "AgentShape",
    "ArrivalModel",
    "BUNDLED",
    "FORMATS",
    "ScheduledRequest",
    "Trace",
    "TraceRequest",
    "TraceSession",
    "TraceStats",
    "bundled_trace",
    "bundled_traces",
    "resolve_trace",
    "detect_format",
    "generate_agent_sessions",
    "load_azure",
    "load_bailian",
    "load_mooncake",
    "load_trace",
    "load_weka",
    "schedule",
    "session_starts",
    "think_times",
    "trace_stats",
    "traces_dir",
]
