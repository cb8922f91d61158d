"""A seeded generator of agentic coding sessions shaped like WEKA's Claude Code traces.

Each session is one agent loop: a system + tools prefix, then requests whose context is
the previous request's context plus the model's output and the next tool result, so
every request's ids extend the previous request's (the ids of its full blocks). Events:

- *resumed* sessions start with a long history (WEKA: 25% of first requests > 100K tokens);
- *compaction*: when the context passes the session's limit, it restarts as the system
  prefix plus a summary (new ids after the prefix; WEKA keeps ~237 prefix blocks);
- *prefix reset*: rarely, every id changes, the system prefix included (a changed system
  prompt or model; WEKA: the first id changes in 83 of 47,948 consecutive pairs);
- *subagents*: short side-sessions that share the parent's prefix ids and namespace,
  merged into the parent session (``is_subagent=True``) like the WEKA loader does; the
  parent resumes after the subagent's last request;
- think times from a heavy-tailed mixture (tool runs vs a user stepping away).

Output satisfies ``saria.traces.model``: ``len(hash_ids) == floor(input_tokens /
block_size)`` (full blocks only, like WEKA: the tail always misses), ids prefix-chained
within a namespace, each session's requests sorted by time starting at 0,
``think_time``/``api_time`` set (``t[i] = t[i-1] + api_time[i-1] + think_time[i]``,
plus the run time of a subagent started in between).
Namespaces are per session (``i + 1``, local ids as in WEKA) unless ``shared_prefix`` puts
every session in namespace 0 with one common system + tools prefix (production sharing,
which WEKA's local ids cannot express). A request's ``hash_ids`` is a read-only view into
its session's id buffer, so memory grows with unique ids, not with total blocks.

With the defaults, 710 sessions at seed 1 give (WEKA in brackets): requests per session
p25/median/p75 19/44/92 (18/45/94); input mean 120K, median 93K (122K, 104K), 30% > 128K
(32%), 12% > 200K (13%); output mean 435, median 216 (440, 216); gaps median 20 s, p90
139 s (18, 129); think median 9 s, p90 125 s (10, 162); 1.4% subagent requests (1.4%);
ideal hit ratio 0.979 (0.963).

Deterministic: session ``i`` depends only on ``seed`` and ``i`` (and, with
``shared_prefix``, on the ids used by sessions before it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from saria.traces.model import Trace, TraceRequest, TraceSession

FORMAT = "synthetic"


@dataclass(frozen=True, slots=True)
class AgentShape:
    """Distribution parameters, each with the WEKA statistic it was matched to
    (traces/README.md and the bundled data; lognormals are given by median and sigma).
    """

    #: Requests per session: WEKA p25 18, median 45, p75 94, max 514.
    requests_median: float = 45.0
    requests_sigma: float = 1.2
    max_requests: int = 514
    #: System + tools prefix: WEKA median 14,948 tokens, range 4,210-23,081.
    prefix_median: float = 14_948.0
    prefix_sigma: float = 0.3
    prefix_range: tuple[int, int] = (4_210, 23_081)
    #: First user message; resumed sessions carry history (WEKA first-request input:
    #: median 24K, p75 104K, p90 259K).
    first_message_median: float = 3_000.0
    resume_prob: float = 0.3
    resume_median: float = 130_000.0
    resume_sigma: float = 0.5
    #: Tool result appended per turn; with the output it gives WEKA's context growth per
    #: request (median 646, mean 1,202, p90 3,510 tokens).
    tool_median: float = 400.0
    tool_sigma: float = 1.3
    #: Model output: WEKA mean 440, median 216, p99 3,686.
    output_median: float = 216.0
    output_sigma: float = 1.19
    #: Compaction limit: WEKA compacts at median 151K (p90 165K) down to 25-75K; 1M-context
    #: sessions run far longer (WEKA max input 894K, 13% of requests > 200K).
    compact_at: float = 155_000.0
    long_context_prob: float = 0.35
    long_compact_at: tuple[float, float] = (250_000.0, 880_000.0)
    summary_range: tuple[int, int] = (10_000, 55_000)
    #: Every id changes (first id too): WEKA 83 / 47,948 consecutive pairs.
    reset_prob: float = 0.0017
    #: Subagents: WEKA 63 subagents, 676 of 49,334 requests, median input 45K.
    subagent_prob: float = 0.0015
    subagent_requests_median: float = 8.0
    subagent_requests_sigma: float = 0.8
    subagent_task_median: float = 20_000.0
    #: Think time: mixture of tool runs and away-from-keyboard (WEKA think_time median 10 s,
    #: p75 33, p90 162, p99 3,014; request gaps median 18 s, p90 129 s).
    think_median: float = 7.0
    think_sigma: float = 1.0
    idle_prob: float = 0.22
    idle_median: float = 100.0
    idle_sigma: float = 1.9
    #: Server time = base + output / decode rate + input / prefill rate (WEKA api_time
    #: median 6 s, p90 18 s).
    api_base_s: float = 1.5
    decode_tok_s: float = 60.0
    prefill_tok_s: float = 60_000.0


class _Ids:
    """Fresh ids of one namespace (WEKA's local ids start at 1)."""

    __slots__ = ("next",)

    def __init__(self) -> None:
        self.next = 1

    def take(self, m: int) -> np.ndarray:
        out = np.arange(self.next, self.next + m, dtype=np.uint32)
        self.next += m
        return out


class _Context:
    """A growing context: its token count and the ids of its full blocks."""

    __slots__ = ("bs", "tokens", "buf", "n")

    def __init__(self, bs: int, prefix_ids: np.ndarray, prefix_tokens: int) -> None:
        self.bs, self.tokens, self.n = bs, prefix_tokens, len(prefix_ids)
        self.buf = np.empty(max(256, 2 * self.n), dtype=np.uint32)
        self.buf[: self.n] = prefix_ids

    def append(self, k: int, ids: _Ids) -> None:
        # The block that held the old partial tail now holds new tokens too: it (and every
        # later full block) gets a fresh id; earlier ids are kept, which is the prefix chain.
        self.tokens += k
        need = self.tokens // self.bs
        if need > len(self.buf):
            grown = np.empty(max(need, 2 * len(self.buf)), dtype=np.uint32)
            grown[: self.n] = self.buf[: self.n]
            self.buf = grown  # earlier views keep the old buffer
        self.buf[self.n : need] = ids.take(need - self.n)
        self.n = need

    def ids(self) -> np.ndarray:
        view = self.buf[: self.n]
        view.flags.writeable = False  # later appends write past n only
        return view


def _lognormal(rng: np.random.Generator, median: float, sigma: float, size: int | None = None):
    return rng.lognormal(np.log(median), sigma, size)


def generate_agent_sessions(
    n_sessions: int,
    *,
    seed: int,
    block_size: int = 64,
    shape: AgentShape = AgentShape(),
    shared_prefix: bool = False,
) -> Trace:
    """``n_sessions`` synthetic agent sessions; see the module docstring."""
    if n_sessions < 0:
        raise ValueError(f"n_sessions must be >= 0, got {n_sessions}")
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    shared_ids = _Ids()
    common: tuple[np.ndarray, int] | None = None
    if shared_prefix:
        rng0 = np.random.default_rng([seed, 1 << 31])
        tokens = _prefix_tokens(rng0, shape)
        common = (shared_ids.take(tokens // block_size), tokens)
    sessions = []
    for i in range(n_sessions):
        rng = np.random.default_rng([seed, i])
        ids = shared_ids if shared_prefix else _Ids()
        ns = 0 if shared_prefix else i + 1
        sessions.append(_session(rng, f"synthetic_{i:04d}", ns, block_size, shape, ids, common))
    return Trace(
        name=f"synthetic-agents-{n_sessions}-seed{seed}",
        path="",
        format=FORMAT,
        block_size=block_size,
        partial_last_block=False,
        has_sessions=True,
        sessions=sessions,
    )


def _prefix_tokens(rng: np.random.Generator, shape: AgentShape) -> int:
    lo, hi = shape.prefix_range
    return int(np.clip(_lognormal(rng, shape.prefix_median, shape.prefix_sigma), lo, hi))


def _session(
    rng: np.random.Generator,
    name: str,
    ns: int,
    bs: int,
    shape: AgentShape,
    ids: _Ids,
    common: tuple[np.ndarray, int] | None,
) -> TraceSession:
    n = int(np.clip(round(_lognormal(rng, shape.requests_median, shape.requests_sigma)), 1, shape.max_requests))
    if common is not None:
        sys_ids, sys_tokens = common
    else:
        sys_tokens = _prefix_tokens(rng, shape)
        sys_ids = ids.take(sys_tokens // bs)
    limit = shape.compact_at
    if rng.random() < shape.long_context_prob:
        limit = rng.uniform(*shape.long_compact_at)
    ctx = _Context(bs, sys_ids, sys_tokens)
    first = _lognormal(rng, shape.first_message_median, 1.0)
    if rng.random() < shape.resume_prob:
        first += _lognormal(rng, shape.resume_median, shape.resume_sigma)
    ctx.append(int(min(first, 0.9 * limit)), ids)

    # Per-request draws up front (fewer generator calls); event draws stay per request.
    outputs = np.maximum(1, _lognormal(rng, shape.output_median, shape.output_sigma, n)).astype(np.int64)
    tools = _lognormal(rng, shape.tool_median, shape.tool_sigma, n).astype(np.int64)
    thinks = _think_times(rng, shape, n)
    out: list[TraceRequest] = []
    t = ready = 0.0  # ready: when the main loop may think about its next request
    for k in range(n):
        if k:
            if rng.random() < shape.reset_prob:  # new system prompt: nothing is shared
                sys_ids = ids.take(sys_tokens // bs)
                fresh = _Context(bs, sys_ids, sys_tokens)
                fresh.append(ctx.tokens - sys_tokens, ids)
                ctx = fresh
            ctx.append(int(outputs[k - 1] + tools[k]), ids)
            if ctx.tokens > limit:  # compaction keeps the prefix, replaces the rest
                ctx = _Context(bs, sys_ids, sys_tokens)
                ctx.append(int(rng.integers(*shape.summary_range)), ids)
            t = ready + thinks[k]
        req = _request(ns, name, t, ctx, int(outputs[k]), float(thinks[k]) if k else 0.0, shape, k)
        out.append(req)
        ready = t + req.api_time
        if k + 1 < n and rng.random() < shape.subagent_prob:  # the parent waits for it
            ready = _subagent(rng, ns, name, bs, shape, ids, sys_ids, sys_tokens, ready, k, len(out), out)
    return TraceSession(name=name, namespace=ns, requests=out)


def _subagent(rng, ns, name, bs, shape, ids, sys_ids, sys_tokens, t, marker, seq, out) -> float:
    """Append a subagent's requests starting at ``t``; return when its last one ends."""
    m = int(np.clip(round(_lognormal(rng, shape.subagent_requests_median, shape.subagent_requests_sigma)), 1, 100))
    ctx = _Context(bs, sys_ids, sys_tokens)  # shares the parent's prefix ids
    ctx.append(int(_lognormal(rng, shape.subagent_task_median, 0.8)), ids)
    agent = f"agent_{seq:04d}"
    for j in range(m):
        think = 0.0
        if j:
            think = float(_lognormal(rng, shape.think_median, shape.think_sigma))
            ctx.append(int(out[-1].output_tokens + _lognormal(rng, shape.tool_median, shape.tool_sigma)), ids)
            t += think
        out_tokens = max(1, int(_lognormal(rng, shape.output_median, shape.output_sigma)))
        req = _request(ns, name, t, ctx, out_tokens, think, shape, marker)
        req.is_subagent, req.agent_id, req.sub_index = True, agent, j
        out.append(req)
        t += req.api_time
    return t


def _think_times(rng: np.random.Generator, shape: AgentShape, n: int) -> np.ndarray:
    quick = _lognormal(rng, shape.think_median, shape.think_sigma, n)
    idle = _lognormal(rng, shape.idle_median, shape.idle_sigma, n)
    return np.round(np.where(rng.random(n) < shape.idle_prob, idle, quick), 3)


def _request(ns, name, t, ctx: _Context, out_tokens: int, think: float, shape: AgentShape, line: int) -> TraceRequest:
    api = shape.api_base_s + out_tokens / shape.decode_tok_s + ctx.tokens / shape.prefill_tok_s
    return TraceRequest(
        namespace=ns,
        session=name,
        time=round(t, 3),
        input_tokens=ctx.tokens,
        output_tokens=out_tokens,
        hash_ids=ctx.ids(),
        think_time=think,
        api_time=round(api, 3),
        line=line,
    )
