"""Descriptive statistics of a loaded trace, including its ideal infinite-cache hit ratio.

Computed from the ids alone with plain numpy, per namespace, independently of any cache
index, so it can check the index and the replay.

Definitions (the same as traces/README.md):

- Requests of one namespace are processed in arrival order (stable sort on time; in the
  bundled traces each namespace is one session). Namespaces never share ids.
- A block *hits* when its id appeared in an EARLIER request of the same namespace
  ("seen anywhere before"; an id repeated inside one request does not hit itself).
- The *prefix-contiguous* variant counts a request's blocks only up to its first miss,
  as a prefix cache would. On prefix-chained ids both agree (they do on both files).
- *By blocks*: hit blocks / all listed blocks.
- *Token-weighted*: tokens of hit blocks / all input tokens. A block weighs its real size:
  Mooncake's partial last block weighs ``input - (n - 1) * block_size``; WEKA's unlisted
  tail (``input % 64`` tokens, no id) counts in the denominator and always misses.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from saria.traces.model import Trace, TraceRequest

# Dense first-seen tables are used when ids are small (local, remapped ids); beyond this
# slack a sort (np.unique) bounds memory instead.
_DENSE_SLACK = 1 << 22


@dataclass(slots=True)
class TraceStats:
    """Counts and ratios of one trace; ratios are None when the trace has no ids."""

    name: str
    format: str
    block_size: int | None
    has_sessions: bool
    sessions: int
    requests: int
    subagent_requests: int
    input_tokens: int
    output_tokens: int
    blocks: int
    unique_blocks: int
    tokens_without_ids: int
    hit_ratio_blocks: float | None
    hit_ratio_tokens: float | None
    prefix_hit_ratio_blocks: float | None
    prefix_hit_ratio_tokens: float | None
    time_span_s: float
    median_session_span_s: float

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(slots=True)
class _Hits:
    blocks: int = 0
    unique: int = 0
    hit_blocks: int = 0
    prefix_blocks: int = 0
    hit_tokens: int = 0
    prefix_tokens: int = 0


def trace_stats(trace: Trace) -> TraceStats:
    reqs = list(trace.requests())
    has_ids = trace.block_size is not None
    hits = _Hits()
    if has_ids:
        by_ns: dict[int, list[TraceRequest]] = {}
        for r in reqs:
            by_ns.setdefault(r.namespace, []).append(r)
        for group in by_ns.values():
            group.sort(key=lambda r: r.time)  # across sessions sharing a namespace
            _namespace_hits(group, trace.block_size, trace.partial_last_block, hits)
    n_in = sum(r.input_tokens for r in reqs)
    listed_tokens = _listed_tokens(reqs, trace.block_size, trace.partial_last_block) if has_ids else 0
    spans = np.array([s.duration for s in trace.sessions]) if trace.sessions else np.zeros(1)

    def ratio(num: int, den: int) -> float | None:
        return (num / den if den else 0.0) if has_ids else None

    return TraceStats(
        name=trace.name,
        format=trace.format,
        block_size=trace.block_size,
        has_sessions=trace.has_sessions,
        sessions=trace.num_sessions,
        requests=len(reqs),
        subagent_requests=sum(r.is_subagent for r in reqs),
        input_tokens=n_in,
        output_tokens=sum(r.output_tokens for r in reqs),
        blocks=hits.blocks,
        unique_blocks=hits.unique,
        tokens_without_ids=n_in - listed_tokens if has_ids else n_in,
        hit_ratio_blocks=ratio(hits.hit_blocks, hits.blocks),
        hit_ratio_tokens=ratio(hits.hit_tokens, n_in),
        prefix_hit_ratio_blocks=ratio(hits.prefix_blocks, hits.blocks),
        prefix_hit_ratio_tokens=ratio(hits.prefix_tokens, n_in),
        time_span_s=float(spans.max()),
        median_session_span_s=float(np.median(spans)),
    )


def _listed_tokens(reqs: list[TraceRequest], bs: int, partial: bool) -> int:
    """Input tokens covered by ids (all of them for ceil traces)."""
    if partial:
        return sum(min(r.input_tokens, r.num_blocks * bs) for r in reqs)
    return sum(r.num_blocks * bs for r in reqs)


def _namespace_hits(group: list[TraceRequest], bs: int, partial: bool, acc: _Hits) -> None:
    lengths = np.fromiter((r.num_blocks for r in group), dtype=np.int64, count=len(group))
    n = int(lengths.sum())
    if n == 0:
        return
    ids = np.concatenate([r.hash_ids for r in group if r.num_blocks])
    req_of = np.repeat(np.arange(len(group), dtype=np.int64), lengths)
    # first[i]: index of the first request holding ids[i]'s id.
    top = int(ids.max())
    if top < 4 * n + _DENSE_SLACK:
        table = np.full(top + 1, len(group), dtype=np.int64)
        np.minimum.at(table, ids, req_of)
        first = table[ids]
        acc.unique += int(np.count_nonzero(table < len(group)))
    else:
        uniq, inv = np.unique(ids, return_inverse=True)
        table = np.full(len(uniq), len(group), dtype=np.int64)
        np.minimum.at(table, inv, req_of)
        first = table[inv]
        acc.unique += len(uniq)
    hit = first < req_of

    # Prefix-contiguous: a block counts if no miss precedes it (inclusive) in its request.
    misses = np.cumsum(~hit)
    starts = np.cumsum(lengths) - lengths
    before = np.where(starts > 0, misses[np.maximum(starts - 1, 0)], 0)
    prefix = (misses - np.repeat(before, lengths)) == 0

    sizes = np.full(n, bs, dtype=np.int64)
    if partial:  # the last id of a request covers what is left of its input
        nz = lengths > 0
        last = (starts + lengths - 1)[nz]
        inputs = np.fromiter((r.input_tokens for r in group), dtype=np.int64, count=len(group))
        sizes[last] = inputs[nz] - (lengths[nz] - 1) * bs
    acc.blocks += n
    acc.hit_blocks += int(np.count_nonzero(hit))
    acc.prefix_blocks += int(np.count_nonzero(prefix))
    acc.hit_tokens += int(sizes[hit].sum())
    acc.prefix_tokens += int(sizes[prefix].sum())
