"""Runs a trace under several policies and collects the report.

A *policy* in the replay's sense is a bundle: an admission policy plus the read
path (lookup, promotion, coordinator). The names scripts rely on are the
admission names (``dram-only``, ``full-duplicate``, ``write-back``, ``E2`` ...);
``saria`` is SARIA's full setting: E2 admission, unified lookup, lazy partial
promotion with the bandwidth-derived r, paced coordination. Every other policy
uses the read path given by the flags (default: unified lookup, no promotion,
naive overlap), so admission policies are compared on the same read path.
"""

from __future__ import annotations

import functools
import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from saria.errors import ConfigError
from saria.policy import make_admission, make_promotion
from saria.sim.engine import Arrival, Replay, ReplaySetup
from saria.sim.parallel import parallel_map
from saria.sim.presets import Preset
from saria.sim.report import policy_report
from saria.traces import Trace
from saria.traces.arrivals import ArrivalModel, schedule, session_starts, think_times

DEFAULT_POLICIES = ("dram-only", "full-duplicate", "write-back", "saria", "budget")


@dataclass(frozen=True, slots=True)
class ReadPath:
    lookup: str = "unified"
    promotion: str = "none"
    coordinator: str = "overlap"
    r: float | None = None          # lazy promotion's DRAM share; None: from bandwidths
    min_victim_age_s: float | str = "auto"  # lazy promotion's recency cutoff


SARIA_READ_PATH = ReadPath(lookup="unified", promotion="lazy", coordinator="paced")


def make_setup(policy: str, preset: Preset, *, read_path: ReadPath | None = None,
               dram_bytes: float | None = None, ssd_bytes: float | None = None,
               trace_block_size: int = 64, keep_history: bool = True) -> ReplaySetup:
    """The replay setup of one named policy (see the module docstring)."""
    rp = read_path or ReadPath()
    if policy == "saria":
        rp = ReadPath(SARIA_READ_PATH.lookup, SARIA_READ_PATH.promotion,
                      SARIA_READ_PATH.coordinator, rp.r, rp.min_victim_age_s)
    hw = preset.hardware
    promotion = make_promotion(rp.promotion, r=rp.r, dram_bw=min(hw.dram_copy_Bps, hw.link_Bps),
                               ssd_bw=hw.ssd_total_read_Bps, min_victim_age_s=rp.min_victim_age_s)
    return ReplaySetup(preset=preset, admission=make_admission(policy, dwpd=hw.dwpd), promotion=promotion,
                       coordinator=rp.coordinator, lookup=rp.lookup, dram_bytes=dram_bytes,
                       ssd_bytes=ssd_bytes, trace_block_size=trace_block_size,
                       keep_history=keep_history)


def run_policy(trace: Trace, setup: ReplaySetup, arrivals: ArrivalModel, *,
               max_context: int | None = None,
               progress: Callable[[int], None] | None = None) -> dict:
    """Replays `trace` under one setup; returns its report entry."""
    replay = Replay(setup)
    if arrivals.closed_loop:
        _closed_loop(replay, trace, arrivals, max_context, progress)
    else:
        replay.run(open_loop_arrivals(trace, arrivals, max_context), progress)
    return policy_report(replay)


def run_policies(trace: Trace, setups: Sequence[ReplaySetup], arrivals: ArrivalModel, *,
                 max_context: int | None = None, jobs: int | None = None,
                 progress: Callable[[int], None] | None = None) -> list[dict]:
    """``run_policy`` for each setup, side by side in forked workers (one
    per CPU by default; see ``saria.sim.parallel``): the replays share only
    the loaded trace, so their reports are those of one-by-one runs. Reports
    in setup order, each with its own ``wall_s``; ``progress(requests done,
    summed over the replays)``."""
    run = functools.partial(_timed_policy, trace, arrivals=arrivals, max_context=max_context)
    return parallel_map(run, setups, jobs=jobs, progress=progress, item_progress=True)


def _timed_policy(trace: Trace, setup: ReplaySetup, report: Callable[[int], None], *,
                  arrivals: ArrivalModel, max_context: int | None) -> dict:
    t0 = time.perf_counter()
    rep = run_policy(trace, setup, arrivals, max_context=max_context, progress=report)
    rep["wall_s"] = time.perf_counter() - t0
    return rep


def open_loop_arrivals(trace: Trace, model: ArrivalModel,
                       max_context: int | None = None) -> list[Arrival]:
    out = []
    for sr in schedule(trace, model):
        r = sr.request
        if max_context is not None and r.input_tokens > max_context:
            continue
        out.append(Arrival(sr.time, r.namespace, r.input_tokens, r.hash_ids, sr.session))
    return out


def _closed_loop(replay: Replay, trace: Trace, model: ArrivalModel, max_context: int | None,
                 progress: Callable[[int], None] | None) -> None:
    """Each session issues its next request after the previous one's
    simulated first token plus the trace's think time."""
    if not trace.has_sessions:
        raise ConfigError("arrivals", f"closed loop needs sessions; {trace.name} has none")
    starts = session_starts(trace, model)
    thinks = [think_times(s, model.max_idle_s) for s in trace.sessions]
    heap = [(float(starts[k]), k, 0) for k, s in enumerate(trace.sessions) if s.requests]
    heapq.heapify(heap)
    done = 0
    while heap:
        t, k, i = heapq.heappop(heap)
        sess = trace.sessions[k]
        r = sess.requests[i]
        end = t
        if max_context is None or r.input_tokens <= max_context:
            end = t + replay.serve(Arrival(t, r.namespace, r.input_tokens, r.hash_ids, k))
        if i + 1 < len(sess.requests):
            heapq.heappush(heap, (end + float(thinks[k][i + 1]), k, i + 1))
        done += 1
        if progress is not None and done % 200 == 0:
            progress(done)


def validate_policies(names: Sequence[str]) -> None:
    """Builds each policy once so that a bad name fails before any work."""
    for name in names:
        make_admission(name)
