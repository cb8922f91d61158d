"""``saria bench index``: stream a trace through the radix index and time it.

Every request of the trace (WEKA by default: 94 M block visits at its 64-token
blocks) goes through what a cache does per request, on the real index:

1. ``match`` its block keys (the reload plan over all tiers),
2. ``touch`` the known prefix (reuse/hit history, recency),
3. ``evict`` DRAM victims (leaf-first LRU) when the new blocks do not fit,
4. ``add`` the blocks that were not in DRAM.

DRAM holds ``dram_fraction`` (10%) of the trace's unique blocks; slots come
from a preallocated free stack, as in the real DRAM pool. Sessions start at
seeded uniform-random times inside a ``window_hours`` window and requests
arrive at session start + their own offset, so sessions interleave and compete
for DRAM as they would on one server.

What is timed (``seconds``): the stream alone -- key construction, the four
index calls and the slot bookkeeping -- not loading the trace, which is
reported apart (``load_seconds``). ``cpu_seconds`` is the process CPU time of
the same stream: on a shared machine the wall time also counts other jobs.
"""

from __future__ import annotations

import heapq
import resource
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from saria.errors import SariaError
from saria.index import RadixIndex, Tier, VirtualClock
from saria.keys.trace import trace_block_keys
from saria.traces import Trace

DRAM_BIT = 1 << Tier.DRAM


@dataclass(frozen=True, slots=True)
class IndexBenchResult:
    trace: str
    requests: int
    block_visits: int
    unique_blocks: int
    dram_blocks: int
    seconds: float
    block_visits_per_s: float
    cpu_seconds: float          # process CPU time of the stream: robust on a shared machine
    block_visits_per_cpu_s: float
    load_seconds: float
    peak_rss_bytes: int
    index_memory_bytes: int
    tracked_blocks: int
    bytes_per_tracked_block: float
    node_bytes: int
    hit_blocks: int
    hit_ratio_blocks: float
    dram_evictions: int
    window_hours: float
    seed: int

    def to_dict(self) -> dict:
        return asdict(self)


def arrival_order(trace: Trace, window_hours: float, seed: int) -> list[tuple[float, int, int]]:
    """(arrival time, session index, request index) for every request, in
    arrival order. Session starts are uniform in [0, window); a session keeps
    its own request offsets."""
    rng = np.random.default_rng(seed)
    starts = rng.uniform(0.0, window_hours * 3600.0, size=len(trace.sessions))
    per_session = [
        [(starts[s] + r.time, s, i) for i, r in enumerate(sess.requests)]
        for s, sess in enumerate(trace.sessions)
    ]
    return list(heapq.merge(*per_session))


def unique_blocks(trace: Trace) -> int:
    """Distinct (namespace, id) pairs: the blocks an infinite cache would hold."""
    total = 0
    by_ns: dict[int, list[np.ndarray]] = {}
    for sess in trace.sessions:
        by_ns.setdefault(sess.namespace, []).extend(r.hash_ids for r in sess.requests)
    for arrays in by_ns.values():
        if arrays:
            total += int(np.unique(np.concatenate(arrays)).shape[0])
    return total


def run_index_bench(trace: Trace, *, load_seconds: float = 0.0, dram_fraction: float = 0.10,
                    window_hours: float = 12.0, seed: int = 0, max_blocks: int | None = None,
                    progress: Callable[[int], None] | None = None) -> IndexBenchResult:
    if trace.block_size is None:
        raise SariaError(f"{trace.path}: trace has no prefix identity (no hash ids); "
                         "the index benchmark needs a trace with block hash ids")
    bs = int(trace.block_size)
    uniq = unique_blocks(trace)
    dram_blocks = max(1, int(uniq * dram_fraction))
    order = arrival_order(trace, window_hours, seed)
    clock = VirtualClock()
    ix = RadixIndex(max_blocks or max(4_000_000, uniq + dram_blocks), clock=clock)
    free = np.arange(dram_blocks, dtype=np.int64)  # free-slot stack, top = free_top
    free_top = dram_blocks
    visits = hits = evictions = 0
    tick = max(1, len(order) // 200)

    t0, c0 = time.perf_counter(), time.process_time()
    for done, (t, s, i) in enumerate(order):
        sess = trace.sessions[s]
        req = sess.requests[i]
        keys = trace_block_keys(req.hash_ids, namespace=sess.namespace, trace_block_size=bs,
                                engine_block_size=bs, num_tokens=req.input_tokens)
        n = keys.shape[0]
        clock.advance_to(max(clock.now, t))
        plan = ix.match(keys)
        ix.touch(keys, hits=plan.num_blocks)
        need = np.flatnonzero((plan.masks & DRAM_BIT) == 0)
        if plan.num_known < n:
            need = np.concatenate((need, np.arange(plan.num_known, n)))
        if need.shape[0] > dram_blocks:  # a request larger than DRAM keeps its head
            need = need[: dram_blocks]
        short = need.shape[0] - free_top
        if short > 0:
            ev = ix.evict(Tier.DRAM, short)
            k = len(ev)
            free[free_top: free_top + k] = ev.slots
            free_top += k
            evictions += k
            if need.shape[0] > free_top:
                need = need[:free_top]
        k = need.shape[0]
        if k:
            ix.add(keys, Tier.DRAM, free[free_top - k: free_top], where=need,
                   session=sess.namespace)
            free_top -= k
        visits += n
        hits += plan.num_blocks
        if progress is not None and (done % tick == 0 or done == len(order) - 1):
            progress(done + 1)
    seconds = time.perf_counter() - t0
    cpu_seconds = time.process_time() - c0

    st = ix.stats()
    return IndexBenchResult(
        trace=trace.name,
        requests=len(order),
        block_visits=visits,
        unique_blocks=uniq,
        dram_blocks=dram_blocks,
        seconds=seconds,
        block_visits_per_s=visits / seconds if seconds > 0 else float("inf"),
        cpu_seconds=cpu_seconds,
        block_visits_per_cpu_s=visits / cpu_seconds if cpu_seconds > 0 else float("inf"),
        load_seconds=load_seconds,
        peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        index_memory_bytes=st.memory_bytes,
        tracked_blocks=st.nodes,
        bytes_per_tracked_block=st.memory_bytes / st.nodes if st.nodes else 0.0,
        node_bytes=st.node_bytes,
        hit_blocks=hits,
        hit_ratio_blocks=hits / visits if visits else 0.0,
        dram_evictions=evictions,
        window_hours=window_hours,
        seed=seed,
    )
