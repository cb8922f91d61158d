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
  finished requests (``request_finished``, delayed frees until every rank
  reported ``finished_sending``), then ``update_connector_output``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from types import SimpleNamespace

from whole_stack.pages import chain_digests


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

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.ref = [0] * num_blocks
        self.hash_of: dict[int, bytes] = {}
        self.cached: dict[bytes, int] = {}
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))

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
            d = self.hash_of.pop(b, None)
            if d is not None and self.cached.get(d) == b:
                del self.cached[d]
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
            self.ref[b] -= 1
            assert self.ref[b] >= 0, b
            if self.ref[b] == 0:
                self.free[b] = None

    def evict_cached(self, n: int) -> int:
        """Memory pressure from elsewhere: the `n` oldest free blocks lose their hash."""
        k = 0
        for b in list(self.free)[:n]:
            d = self.hash_of.pop(b, None)
            if d is not None:
                self.cached.pop(d, None)
                k += 1
        return k


class VllmDouble:
    """One engine's scheduler loop around a connector and an ``execute`` callback."""

    def __init__(self, connector, execute, *, block_size: int, num_blocks: int,
                 budget: int) -> None:
        self.connector = connector
        self.execute = execute          # (scheduler_output) -> (worker meta, finished_sending, invalid)
        self.bs = block_size
        self.pool = BlockPool(num_blocks)
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
        self.pool.release(req.block_ids)
        req.block_ids = []
        req.num_computed_tokens = 0
        req.status = "waiting"
        req.resumed = True
        self.waiting.insert(0, req)
        self.preempted.add(req.request_id)

    def idle(self) -> bool:
        return not (self.waiting or self.running or self.delayed_free)

    # ---------------------------------------------------------------- step

    def step(self) -> dict:
        """One schedule -> execute -> update_from_output round; returns what the
        checks need: the step's scheduled requests with the tokens computed
        before it, and the requests vLLM took as failed loads."""
        so, before = self._schedule()
        wmeta, finished_sending, invalid = self.execute(so, before)
        affected = self._update_from_output(so, wmeta, finished_sending, invalid)
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
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if n <= 0:
                continue
            while True:
                need = -(-(req.num_computed_tokens + n) // self.bs) - len(req.block_ids)
                got = self.pool.alloc(max(0, need))
                if got is not None:
                    break
                victim = self.running[-1]
                self.preempt(victim)
                if victim is req:
                    break
            if req not in self.running:
                continue
            req.block_ids += got
            self._cache(req, req.num_computed_tokens + n)
            cached.req_ids.append(req.request_id)
            cached.new_block_ids.append((got,) if got else None)
            cached.num_computed_tokens.append(req.num_computed_tokens)
            num_sched[req.request_id] = n
            budget -= n
        while self.waiting and budget > 0:
            req = self.waiting[0]
            digests = req.digest_chain(self.bs)
            local = self.pool.hit(digests, (req.num_tokens - 1) // self.bs)
            ext, _ = self.connector.get_num_new_matched_tokens(req, len(local) * self.bs)
            computed = len(local) * self.bs + ext
            n = min(req.num_tokens - computed, budget)
            need = -(-(computed + n) // self.bs) - len(local)
            if self.fail_next_alloc:
                self.fail_next_alloc = False
                break
            self.pool.take(local)
            got = self.pool.alloc(need)
            if got is None:
                self.pool.release(local)
                break
            self.waiting.pop(0)
            req.block_ids = local + got
            req.num_computed_tokens = computed
            self._cache(req, computed + n)
            blocks = SimpleNamespace(get_block_ids=lambda ids=list(req.block_ids): (ids,))
            self.connector.update_state_after_alloc(req, blocks, ext)
            req.status = "running"
            self.running.append(req)
            if req.resumed:
                cached.req_ids.append(req.request_id)
                cached.new_block_ids.append((list(req.block_ids),))
                cached.num_computed_tokens.append(computed)
                cached.resumed_req_ids.add(req.request_id)
                req.resumed = False
            else:
                new_reqs.append(SimpleNamespace(req_id=req.request_id, block_ids=[list(req.block_ids)],
                                                num_computed_tokens=computed))
            num_sched[req.request_id] = n
            budget -= n
        for rid, n in num_sched.items():
            req = self.requests[rid]
            before[rid] = req.num_computed_tokens
            req.num_computed_tokens += n          # vLLM's _update_after_schedule
        so = SimpleNamespace(scheduled_new_reqs=new_reqs, scheduled_cached_reqs=cached,
                             num_scheduled_tokens=num_sched, preempted_req_ids=set(self.preempted),
                             finished_req_ids=set(self.finished))
        self.preempted.clear()
        self.finished = []
        return so, before

    def _cache(self, req: Request, tokens: int) -> None:
        n = min(tokens, req.num_tokens) // self.bs
        self.pool.cache(req.block_ids[:n], req.digest_chain(self.bs)[:n])

    def _update_from_output(self, so, wmeta, finished_sending, invalid) -> set[str]:
        affected: set[str] = set()
        if invalid:
            affected = self._invalid_blocks(self.running, invalid, so.num_scheduled_tokens)
        for rid in so.num_scheduled_tokens:
            req = self.requests.get(rid)
            if req is None or rid in affected or req.status != "running":
                continue
            if req.num_computed_tokens >= req.num_tokens:  # sampled a token
                req.all_token_ids.append(7_000_000 + req.outputs)
                if req.outputs >= req.max_new:
                    self.running.remove(req)
                    self._finish(req)
        for rid in finished_sending:
            req = self.delayed_free.pop(rid, None)
            assert req is not None, f"finished_sending for {rid}, which vLLM does not wait for"
            self.pool.release(req.block_ids)
            req.block_ids = []
        self.connector.update_connector_output(SimpleNamespace(kv_connector_worker_meta=wmeta))
        return affected

    def _finish(self, req: Request) -> None:
        req.status = "finished"
        self.finished.append(req.request_id)
        delay, _ = self.connector.request_finished(req, list(req.block_ids))
        if delay:
            self.delayed_free[req.request_id] = req
        else:
            self.pool.release(req.block_ids)
            req.block_ids = []

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
