"""vLLM's scheduler and block pool, as much of them as a KV connector sees.

Modelled on vLLM 0.32 (``vllm/v1/core/sched/scheduler.py``,
``kv_cache_manager.py``), with the parts that matter to a connector kept:

* a block pool with a prefix cache: freed blocks keep their hash and are
  reused least recently freed first (a reuse drops the hash); a waiting
  request's local hit is the longest cached prefix of its full blocks, at
  most ``num_tokens - 1`` tokens; the local hit may shrink between two
  scheduling attempts of the same request (its blocks reused meanwhile);
* a synchronous external hit: ``get_num_new_matched_tokens`` then
  ``allocate_slots``, which caches every full block up to the tokens the
  step computes -- external ones included -- at once, so a request scheduled
  later in the same step can get a local hit on blocks whose load has not
  run yet (vLLM's own rule: a load error on a shared block is recomputed by
  the first request that holds it);
* chunked prefill under a token budget, running requests first, preemption
  of the last running request when blocks run out, resumed requests;
* ``update_from_output``: invalid blocks handled first
  (``_update_requests_with_invalid_blocks``, copied), then sampled tokens,
  finished requests (``request_finished``), then ``update_connector_output``,
  then the frees of requests every rank reported in ``finished_sending``.

Hybrid mode (``hybrid=True``): a second KV-cache group of recurrent states
(vLLM's ``MambaSpec`` in ``align`` mode), so that checkpoints meet the
faults too:

* prefill chunks end at block boundaries where they can (``align``);
* block 0 is vLLM's null block; a request's state table has an entry per
  block position, a real block only at the positions where one of its chunks
  ended (the state after ``t`` tokens lives at position ``(t - 1) // bs``),
  null elsewhere;
* a local hit ends where the state group caches a state (one computed at
  that boundary; cached once the step that computed it is done);
* with several groups vLLM raises on block-level load errors
  (``_handle_invalid_blocks``): any is a failure here; loads are
  asynchronous -- the request holds its blocks in ``loading`` for one step,
  then runs from its hit, or (``failed_recving``) from vLLM's own hit again,
  none of the load's blocks cached; an aborted loader's blocks wait for its
  ``finished_recving``; ``boundary_state_offloads`` names the states each
  step computes at block boundaries.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from types import SimpleNamespace

from whole_stack.pages import chain_digests
from whole_stack.failures import SimFailure

NULL = 0       # vLLM's null block (hybrid mode: never allocated)
STATE_GID = 1  # the recurrent group's vLLM group id (hybrid mode)


@dataclass
class Request:
    request_id: str
    prompt: list[int]
    max_new: int
    all_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    status: str = "waiting"          # waiting, running, finished
    resumed: bool = False            # preempted before: comes back as a cached request
    scheduled_once: bool = False
    digests: list[bytes] = field(default_factory=list)
    state_ids: list[int] = field(default_factory=list)   # hybrid: recurrent group's table
    # what the connector's fake request needs
    cache_salt: None = None
    lora_request: None = None
    mm_features: None = None
    prompt_embeds: None = None
    block_hashes: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.all_token_ids = list(self.prompt)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt)

    @property
    def outputs(self) -> int:
        return len(self.all_token_ids) - len(self.prompt)

    def digest_chain(self, block_size: int) -> list[bytes]:
        self.digests = chain_digests(self.all_token_ids, block_size, self.digests)
        return self.digests


class BlockPool:
    """KV blocks with reference counts and a prefix cache of freed blocks."""

    def __init__(self, num_blocks: int, first: int = 0) -> None:
        self.num_blocks = num_blocks
        self.ref = [0] * num_blocks
        self.hash_of: dict[int, bytes] = {}
        self.cached: dict[bytes, int] = {}
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(first, num_blocks))

    def hit(self, digests: list[bytes], limit: int) -> list[int]:
        out = []
        for d in digests[:limit]:
            b = self.cached.get(d)
            if b is None:
                break
            out.append(b)
        return out

    def take(self, blocks: list[int]) -> None:
        for b in blocks:
            self.ref[b] += 1
            self.free.pop(b, None)

    def alloc(self, n: int) -> list[int] | None:
        if n > len(self.free):
            return None
        out = []
        for _ in range(n):
            b, _ = self.free.popitem(last=False)
            self.drop_hash(b)
            self.ref[b] = 1
            out.append(b)
        return out

    def cache(self, blocks: list[int], digests: list[bytes]) -> None:
        for b, d in zip(blocks, digests):
            if b not in self.hash_of and d not in self.cached:
                self.hash_of[b] = d
                self.cached[d] = b

    def release(self, blocks: list[int]) -> None:
        for b in reversed(blocks):  # vLLM frees the tail first: it is evicted first
            if b == NULL:
                continue
            self.ref[b] -= 1
            assert self.ref[b] >= 0, b
            if self.ref[b] == 0:
                self.free[b] = None

    def drop_hash(self, b: int) -> bool:
        """Block `b` forgets its prefix hash (it is being reused); True if it had one."""
        d = self.hash_of.pop(b, None)
        if d is not None and self.cached.get(d) == b:
            del self.cached[d]
        return d is not None

    def evict_cached(self, n: int) -> int:
        """Memory pressure from elsewhere: the `n` oldest free blocks lose their hash."""
        return sum(self.drop_hash(b) for b in list(self.free)[:n])


class VllmDouble:
    """One engine's scheduler loop around a connector and an ``execute`` callback."""

    def __init__(self, connector, execute, *, block_size: int, num_blocks: int,
                 budget: int, hybrid: bool = False) -> None:
        self.connector = connector
        # (scheduler_output, before) -> (worker meta, finished_sending, invalid,
        #                                finished_recving, failed_recving)
        self.execute = execute
        self.bs = block_size
        self.hybrid = hybrid
        self.pool = BlockPool(num_blocks, first=1 if hybrid else 0)
        self.received: set[str] = set()   # async loads every rank finished
        self.loading_aborted: set[str] = set()  # finished while their async load ran
        self.budget = budget
        self.requests: dict[str, Request] = {}
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.delayed_free: dict[str, Request] = {}
        self.preempted: set[str] = set()
        self.fail_next_alloc = False
        self.finished: list[str] = []

    # ------------------------------------------------------------ requests

    def add(self, req: Request) -> None:
        self.requests[req.request_id] = req
        self.waiting.append(req)

    def abort(self, rid: str) -> None:
        req = self.requests.get(rid)
        if req is None or req.status == "finished":
            return
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        self._finish(req)

    def preempt(self, req: Request) -> None:
        self.running.remove(req)
        self._release(req)
        req.num_computed_tokens = 0
        req.status = "waiting"
        req.resumed = True
        self.waiting.insert(0, req)
        self.preempted.add(req.request_id)

    def idle(self) -> bool:
        return not (self.waiting or self.running or self.delayed_free)

    def _release(self, req: Request) -> None:
        self.pool.release(req.block_ids)
        self.pool.release(req.state_ids)
        req.block_ids, req.state_ids = [], []

    def _ids(self, req: Request, attn: list[int], states: list[int]) -> tuple:
        return (attn, states) if self.hybrid else (attn,)

    # ---------------------------------------------------------------- step

    def step(self) -> dict:
        """One schedule -> execute -> update_from_output round; returns what the
        checks need: the step's scheduled requests with the tokens computed
        before it, and the requests vLLM took as failed loads."""
        so, before = self._schedule()
        wmeta, finished_sending, invalid, recving, failed_recving = self.execute(so, before)
        affected = self._update_from_output(so, wmeta, finished_sending, invalid, recving,
                                            failed_recving)
        return {"before": before, "affected": affected, "so": so}

    def _schedule(self):
        budget = self.budget
        new_reqs, cached = [], SimpleNamespace(req_ids=[], new_block_ids=[], num_computed_tokens=[],
                                               resumed_req_ids=set())
        num_sched: dict[str, int] = {}
        before: dict[str, int] = {}
        for req in list(self.running):
            if budget <= 0 or req not in self.running:
                continue
            n = self._chunk(req, req.num_computed_tokens, budget)
            if n <= 0:
                continue
            while True:
                na, ns = self._need(req, req.num_computed_tokens + n)
                got = self.pool.alloc(na + ns)
                if got is not None:
                    break
                victim = self.running[-1]
                self.preempt(victim)
                if victim is req:
                    break
            if req not in self.running:
                continue
            attn, states = self._append(req, got, na)
            self._cache(req, req.num_computed_tokens + n)
            cached.req_ids.append(req.request_id)
            cached.new_block_ids.append(self._ids(req, attn, states) if got else None)
            cached.num_computed_tokens.append(req.num_computed_tokens)
            num_sched[req.request_id] = n
            budget -= n
        i = 0
        while i < len(self.waiting) and budget > 0:
            req = self.waiting[i]
            if req.status == "loading":
                if req.request_id not in self.received:
                    i += 1          # its async load has not finished on every rank
                    continue
                self.received.discard(req.request_id)
                req.status = "waiting"
                if req.num_computed_tokens == 0:   # failed_recving: vLLM's lookup again
                    self._release(req)
                else:                              # _update_waiting_for_remote_kv
                    self._cache(req, req.num_computed_tokens)
                    self._cache_state(req, req.num_computed_tokens)
            if req.num_computed_tokens:            # after its load: no lookup
                computed, ext = req.num_computed_tokens, 0
                n = self._chunk(req, computed, budget)
                na, ns = self._need(req, computed + n)
                got = self.pool.alloc(na + ns)
                if got is None:
                    break
                self._append(req, got, na)
            else:
                got = self._admit(req, budget)
                if got is None:
                    break
                computed, ext, n, is_async = got
                if is_async:
                    i += 1
                    continue
            self.waiting.pop(i)
            req.num_computed_tokens = computed
            self._cache(req, computed + n)
            blocks = SimpleNamespace(get_block_ids=lambda ids=self._ids(req, list(req.block_ids),
                                                                        list(req.state_ids)): ids)
            self.connector.update_state_after_alloc(req, blocks, ext)
            req.status = "running"
            self.running.append(req)
            if req.resumed:
                cached.req_ids.append(req.request_id)
                cached.new_block_ids.append(self._ids(req, list(req.block_ids),
                                                      list(req.state_ids)))
                cached.num_computed_tokens.append(computed)
                cached.resumed_req_ids.add(req.request_id)
                req.resumed = False
            else:
                new_reqs.append(SimpleNamespace(
                    req_id=req.request_id, num_computed_tokens=computed,
                    block_ids=list(self._ids(req, list(req.block_ids), list(req.state_ids)))))
            num_sched[req.request_id] = n
            budget -= n
        offers: dict[str, list] = {}
        for rid, n in num_sched.items():
            req = self.requests[rid]
            before[rid] = req.num_computed_tokens
            req.num_computed_tokens += n          # vLLM's _update_after_schedule
            end = req.num_computed_tokens
            if self.hybrid and end % self.bs == 0:  # a state computed at a block boundary
                offers[rid] = [(STATE_GID, req.state_ids[end // self.bs - 1], end)]
        so = SimpleNamespace(scheduled_new_reqs=new_reqs, scheduled_cached_reqs=cached,
                             num_scheduled_tokens=num_sched, preempted_req_ids=set(self.preempted),
                             finished_req_ids=set(self.finished),
                             kv_connector_block_state=SimpleNamespace(
                                 boundary_state_offloads=offers))
        self.preempted.clear()
        self.finished = []
        return so, before

    def _admit(self, req: Request, budget: int):
        """A waiting request's lookup (vLLM's, then the connector's) and its
        blocks: (computed, external, scheduled, async) or None (no room)."""
        digests = req.digest_chain(self.bs)
        local = self.pool.hit(digests, (req.num_tokens - 1) // self.bs)
        lstate = None
        if self.hybrid:  # the hit ends where the state group caches a state
            while local and self.pool.cached.get(b"S" + digests[len(local) - 1]) is None:
                local.pop()
            lstate = self.pool.cached.get(b"S" + digests[len(local) - 1]) if local else None
        ext, is_async = self.connector.get_num_new_matched_tokens(req, len(local) * self.bs)
        is_async = bool(is_async and ext)
        computed = len(local) * self.bs + ext
        n = 0 if is_async else self._chunk(req, computed, budget)
        if self.fail_next_alloc:
            # no room: the request waits, and the pressure that refused it
            # reuses free cached blocks meanwhile -- here its hit's tail, when
            # no running request holds it (vLLM frees tails first, so they go
            # early). Its next lookup then finds a shorter hit under the load
            # saria prepared for this one (failure 2's window).
            self.fail_next_alloc = False
            if local and local[-1] in self.pool.free:
                self.pool.drop_hash(local[-1])
            return None
        end = computed + n
        na = -(-end // self.bs) - len(local)
        # states: the one the request starts from (vLLM's own, or a new block
        # a load fills) and the one its chunk ends in
        start_state = computed // self.bs - 1 if computed else None
        new_start = start_state is not None and (ext or lstate is None)
        ns = (int(bool(new_start)) + int(n > 0)) if self.hybrid else 0
        held = local + ([lstate] if self.hybrid and lstate is not None and not new_start else [])
        self.pool.take(held)
        got = self.pool.alloc(na + ns)
        if got is None:
            self.pool.release(held)
            return None
        req.block_ids = local + got[:na]
        if self.hybrid:
            states = got[na:]
            table = [NULL] * (-(-end // self.bs))
            if start_state is not None:
                table[start_state] = states.pop(0) if new_start else lstate
            if n > 0:
                table[(end - 1) // self.bs] = states.pop(0)
            req.state_ids = table
        if is_async:  # WAITING_FOR_REMOTE_KVS: blocks held, nothing cached until it lands
            req.num_computed_tokens = computed
            ids = self._ids(req, list(req.block_ids), list(req.state_ids))
            self.connector.update_state_after_alloc(
                req, SimpleNamespace(get_block_ids=lambda: ids), ext)
            req.status = "loading"
        return computed, ext, n, is_async

    def _chunk(self, req: Request, computed: int, budget: int) -> int:
        """Tokens to compute this step; hybrid: a chunk ends at a block boundary
        where it can (``align`` mode: that is where states are kept)."""
        n = min(req.num_tokens - computed, budget)
        if self.hybrid:
            end = (computed + n) // self.bs * self.bs
            if end > computed:
                n = end - computed
        return n

    def _need(self, req: Request, end: int) -> tuple[int, int]:
        """Blocks to add for `end` tokens: attention, and (hybrid) the state
        block of the last new position."""
        na = max(0, -(-end // self.bs) - len(req.block_ids))
        return na, (1 if self.hybrid and na else 0)

    def _append(self, req: Request, got: list[int], na: int) -> tuple[list[int], list[int]]:
        attn, states = got[:na], []
        req.block_ids += attn
        if self.hybrid and na:
            states = [NULL] * (na - 1) + got[na:]
            req.state_ids += states
        return attn, states

    def _cache_state(self, req: Request, tokens: int) -> None:
        """The state after `tokens` (a block boundary) in the state group's cache."""
        if self.hybrid and tokens and tokens % self.bs == 0:
            k = tokens // self.bs
            b = req.state_ids[k - 1] if len(req.state_ids) >= k else NULL
            if b != NULL:
                self.pool.cache([b], [b"S" + req.digest_chain(self.bs)[k - 1]])

    def _cache(self, req: Request, tokens: int) -> None:
        n = min(tokens, req.num_tokens) // self.bs
        self.pool.cache(req.block_ids[:n], req.digest_chain(self.bs)[:n])

    def _update_from_output(self, so, wmeta, finished_sending, invalid, recving=(),
                            failed_recving=()) -> set[str]:
        affected: set[str] = set()
        for rid in failed_recving:  # _handle_failed_recving, recompute policy
            req = self.requests.get(rid)
            if req is not None and req.status == "loading":
                req.num_computed_tokens = 0
        if invalid and self.hybrid:
            raise SimFailure("vllm-raises", f"block-level load errors {sorted(invalid)} with "
                             "several KV-cache groups (vLLM's _handle_invalid_blocks raises)")
        if invalid:
            affected = self._invalid_blocks(self.running, invalid, so.num_scheduled_tokens)
        for rid in so.num_scheduled_tokens:  # states computed this step are cached now
            req = self.requests.get(rid)
            if req is not None and req.status == "running" and rid not in affected:
                self._cache_state(req, req.num_computed_tokens)
        for rid in so.num_scheduled_tokens:
            req = self.requests.get(rid)
            if req is None or rid in affected or req.status != "running":
                continue
            if req.num_computed_tokens >= req.num_tokens:  # sampled a token
                req.all_token_ids.append(7_000_000 + req.outputs)
                if req.outputs >= req.max_new:
                    self.running.remove(req)
                    self._finish(req)
        # _update_from_kv_xfer_finished: the connector hears first, then the frees
        self.connector.update_connector_output(SimpleNamespace(kv_connector_worker_meta=wmeta))
        for rid in recving:
            req = self.requests.get(rid)
            assert req is not None, f"finished_recving for {rid}, which vLLM does not know"
            if req.status == "loading":
                self.received.add(rid)
            else:  # aborted while it loaded: its blocks go now
                assert req.status == "finished", f"finished_recving for {rid} ({req.status})"
                if rid in self.loading_aborted:
                    self.loading_aborted.discard(rid)
                    self._release(self.delayed_free.pop(rid))
        for rid in finished_sending:
            req = self.delayed_free.pop(rid, None)
            assert req is not None, f"finished_sending for {rid}, which vLLM does not wait for"
            self._release(req)
        return affected

    def _finish(self, req: Request) -> None:
        rid = req.request_id
        loading = req.status == "loading" and rid not in self.received
        self.received.discard(rid)
        req.status = "finished"
        self.finished.append(rid)
        delay, _ = self.connector.request_finished(req, list(req.block_ids))
        if loading:  # vLLM frees its blocks at its finished_recving
            self.loading_aborted.add(rid)
        if delay or loading:
            self.delayed_free[rid] = req
        else:
            self._release(req)

    def _invalid_blocks(self, requests, invalid: set[int], num_sched: dict[str, int]) -> set[str]:
        """vLLM 0.32's ``_update_requests_with_invalid_blocks`` under the
        ``recompute`` policy (nothing is evicted from the prefix cache)."""
        affected: set[str] = set()
        marked: set[int] = set()
        for request in requests:
            is_affected = marked_invalid = False
            rid = request.request_id
            req_computed = request.num_computed_tokens - num_sched.get(rid, 0)
            req_blocks = (req_computed + self.bs - 1) // self.bs
            for idx, block_id in zip(range(req_blocks), request.block_ids):
                if block_id not in invalid:
                    continue
                is_affected = True
                if block_id in marked:
                    continue
                marked.add(block_id)
                if marked_invalid:
                    continue
                marked_invalid = True
                request.num_computed_tokens = idx * self.bs
            if is_affected:
                if not marked_invalid:
                    request.num_computed_tokens = req_computed
                affected.add(rid)
        return affected
