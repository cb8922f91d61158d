"""Scheduler side: the index, the policies and the tiers, in vLLM's EngineCore.

Why here. vLLM runs the scheduler connector and the worker connectors in
different processes that share nothing but the pickled per-step metadata.
saria's decisions (what is cached where, what admission writes to the SSD,
what promotion keeps) are all scheduler decisions, and ``TieredCache`` makes
them atomically under one lock -- so the whole cache lives here: index,
policies, the SSD store (its I/O threads release the GIL) and the owner's view
of the DRAM pool. The pool itself is shared memory (``/dev/shm``); workers map
it and only copy pages between it and their KV tensors, in the slots this
side names. This is LMCache's multi-process split (storage in one place,
GPU copies in the workers) rather than vLLM's OffloadingConnector split (the
worker owns the host buffers), because the SSD path reads into DRAM slots the
scheduler allocates and must lock.

Flow per request (``keys`` are saria block keys of the request's tokens):

* ``get_num_new_matched_tokens``: the index's longest cached prefix beyond
  vLLM's own hit. A DRAM-only hit is staged (locked) at once; a hit with SSD
  blocks is read into spare DRAM slots on a background thread, and vLLM is
  told "ask again later" (``None``) until the read is done. A failed SSD read
  only shortens the hit: vLLM is never promised a block saria cannot serve.
* ``update_state_after_alloc``: the staged blocks become a load op into the
  request's new KV blocks (synchronous: done before its layers run).
* ``build_connector_meta``: every request's newly computed full blocks get DRAM
  slots (``TieredCache.reserve``) and become a store op.
* ``update_connector_output``: ops the workers finished are completed
  (stores: admission may now write them to the SSD; loads: promotion).
* ``request_finished``: the blocks' free is delayed while a store op still
  reads them.

The parts: ``RequestHasher`` (a request's keys), ``OpTracker`` (op ids, acks
from every tensor-parallel rank, deadlines), and the cache's own API for
every figure (``stats``, ``gauges``): this class only sequences them.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from saria.connector.config import ConnectorConfig
from saria.connector.layout import Geometry, pool_path
from saria.connector.meta import CopyOp, SariaMetadata, SariaWorkerMetadata
from saria.connector.ops import OpTracker
from saria.connector.request_keys import KeyChain, RequestHasher
from saria.connector.stats import Deltas, cumulative
from saria.index import Tier
from saria.keys.hashing import BlockHasher
from saria.runtime import CacheConfig, Staged, TieredCache

log = logging.getLogger("saria.connector")


@dataclass
class _Req:
    request: object
    chain: KeyChain = field(default_factory=KeyChain)
    block_ids: list[int] = field(default_factory=list)
    stored: int = 0                    # blocks below this need no store op
    staged: Staged | None = None
    staging: Future | None = None
    local: int = 0                     # vLLM's own hit (blocks) at the last query
    recorded: bool = False
    cacheable: bool = True


class SariaScheduler:
    """The SCHEDULER role of ``SariaConnector``."""

    def __init__(self, cfg: ConnectorConfig, vllm_config, geo: Geometry,
                 kv_cache_config=None) -> None:
        self.cfg = cfg
        self.geo = geo
        self.block_size = geo.block_size
        ns = geo.namespace(cfg.hash_algo, cfg.hash_seed)
        dirs = tuple(os.path.join(d, f"saria-{ns}") for d in cfg.ssd_dirs) if cfg.has_ssd else ()
        for d in dirs:
            os.makedirs(d, exist_ok=True)
        self.cache = TieredCache(CacheConfig(
            block_bytes=geo.slot_bytes, dram_bytes=cfg.dram_bytes, ssd_dirs=dirs,
            ssd_bytes=cfg.ssd_bytes, admission=cfg.admission, promotion=cfg.promotion,
            promotion_r=cfg.promotion_r, write_queue=cfg.write_queue, events=cfg.events,
            shared_pool=pool_path(vllm_config), max_blocks=_max_blocks(cfg, geo),
            pin=False))  # only the workers' mappings need page-locking (for DMA)
        # Workers mapped the pool before this side existed (vLLM creates the
        # worker connectors first); drop the name so nothing outlives the engine.
        pool = self.cache.backend.pool
        self.pool_id = pool.shared_id
        pool.unlink()
        self.hasher = RequestHasher(BlockHasher(self.block_size, cfg.hash_algo, cfg.hash_seed),
                                    vllm_config, kv_cache_config)
        self.ops = OpTracker(geo.tp_size, cfg.op_timeout_s)
        self.reqs: dict[str, _Req] = {}
        self._loads: list[CopyOp] = []
        self._delayed: list[str] = []
        self._tokens_of: dict[bytes, tuple[tuple[int, ...], object]] = {}
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="saria-ssd-stage")
        self.counters = {"hit_tokens": 0, "query_tokens": 0,
                         "load_ops": 0, "store_ops": 0, "store_failures": 0,
                         "load_failures": 0, "expired_ops": 0, "delayed_frees": 0,
                         "ssd_stages": 0, "ssd_stage_us": 0}
        self.started = time.monotonic()
        self.metrics_server = None
        self._deltas = Deltas()
        gauges = self.cache.gauges()
        log.info("saria scheduler: block %d tokens, slot %d B, DRAM %d slots, SSD %s "
                 "(%d blocks recovered), admission %s, promotion %s", self.block_size,
                 geo.slot_bytes, gauges["dram_slots"], ", ".join(dirs) if dirs else "off",
                 gauges["ssd_recovered_unadopted"], cfg.admission, cfg.promotion)

    @property
    def engine_hashes(self) -> bool:
        """Whether vLLM's ``request.block_hashes`` are saria's keys."""
        return self.hasher.engine_hashes

    # ------------------------------------------------------------- vLLM API

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        st = self._req(request)
        if not st.cacheable:
            return 0, False
        local = num_computed_tokens // self.block_size
        limit = (request.num_tokens - 1) // self.block_size  # vLLM must compute >= 1 token
        self.hasher.extend(st.chain, request, limit)
        if st.staging is not None:
            if not st.staging.done():
                return None, False  # SSD read in flight: ask again later
            st.staged, st.staging = st.staging.result(), None
        if st.staged is None:
            keys = st.chain.array[:limit]
            plan = self.cache.lookup(keys)
            if plan.num_blocks <= local:
                return 0, False
            if np.any(plan.tiers[local:plan.num_blocks] == Tier.SSD):
                st.staging = self._reader.submit(self._stage_from_ssd, keys, plan.num_blocks,
                                                 local)
                return None, False
            st.staged = self.cache.stage(keys, plan.num_blocks, local)
        st.local = local
        hit = st.staged.num_blocks
        if hit <= local:
            self._unstage(st)
            return 0, False
        return (hit - local) * self.block_size, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        st = self.reqs.get(request.request_id)
        if st is None:
            return
        st.block_ids = list(blocks.get_block_ids()[0])
        n_ext = num_external_tokens // self.block_size
        local = request.num_computed_tokens // self.block_size if n_ext == 0 else st.local
        if n_ext and st.staged is not None:
            ids = st.block_ids[local: local + n_ext]
            slots = st.staged.slots[local: local + n_ext].tolist()
            op_id = self.ops.start("load", request.request_id, st.staged)
            self._loads.append(CopyOp(op_id, request.request_id, ids, slots))
            st.staged = None
            self.counters["load_ops"] += 1
        else:
            self._unstage(st)
        st.stored = max(st.stored, local + n_ext)
        self.counters["hit_tokens"] += n_ext * self.block_size  # resumed requests too
        if not st.recorded:
            st.recorded = True
            self.counters["query_tokens"] += request.num_tokens
            n = min(len(st.chain), (request.num_tokens - 1) // self.block_size)
            if n:
                self.cache.touch(st.chain.array[:n], hits=local + n_ext)

    def build_connector_meta(self, so) -> SariaMetadata:
        for op in self.ops.expired():
            log.error("saria: %s op %d of request %s got no ack from every worker in %.0f s; "
                      "failing it", op.kind, op.op_id, op.req_id, self.ops.timeout_s)
            self.counters["expired_ops"] += 1
            self._complete(op, ok=False)
        stores: list[CopyOp] = []
        for nr in so.scheduled_new_reqs:
            st = self.reqs.get(nr.req_id)
            if st is not None:
                st.block_ids = list(nr.block_ids[0])
                self._plan_store(st, nr.req_id, nr.num_computed_tokens
                                 + so.num_scheduled_tokens[nr.req_id], stores)
        cached = so.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            st = self.reqs.get(rid)
            if st is None:
                continue
            nb = cached.new_block_ids[i]
            if rid in cached.resumed_req_ids and nb is not None:
                st.block_ids = list(nb[0])
            elif nb is not None:
                st.block_ids.extend(nb[0])
            self._plan_store(st, rid, cached.num_computed_tokens[i]
                             + so.num_scheduled_tokens[rid], stores)
        meta = SariaMetadata(loads=self._loads, stores=stores, delayed=self._delayed,
                             preempted=sorted(getattr(so, "preempted_req_ids", None) or ()),
                             pool_id=self.pool_id)
        self._loads, self._delayed = [], []
        return meta

    def update_connector_output(self, out) -> None:
        wm = getattr(out, "kv_connector_worker_meta", None)
        if not isinstance(wm, SariaWorkerMetadata):
            return
        for op_id, n in wm.failed.items():
            op = self.ops.ack(op_id, ok=False, count=n)
            if op is not None:
                self._complete(op, ok=False)
        for op_id, n in wm.done.items():
            op = self.ops.ack(op_id, ok=True, count=n)
            if op is not None:
                self._complete(op, ok=True)

    def request_finished(self, request, block_ids) -> tuple[bool, None]:
        rid = request.request_id
        st = self.reqs.pop(rid, None)
        if st is not None:
            self._unstage(st)
        busy = self.ops.stores_pending(rid)
        if busy:
            self._delayed.append(rid)
            self.counters["delayed_frees"] += 1
        return busy, None

    def take_events(self):
        from saria.connector.events import to_vllm_events

        events = to_vllm_events(self.cache.take_events(), self._tokens_of, self.block_size,
                                self.hasher.hasher.digest_size)
        self._tokens_of.clear()
        return events

    def take_stats(self):
        return self._deltas.take(cumulative(self))

    def shutdown(self) -> None:
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
            self.metrics_server.server_close()
        self._reader.shutdown(wait=True)
        for st in self.reqs.values():
            self._unstage(st)
        self.cache.flush()
        self.cache.close()

    # --------------------------------------------------------------- helpers

    def _req(self, request) -> _Req:
        st = self.reqs.get(request.request_id)
        if st is None:
            st = _Req(request)
            # Prompt embeddings are hashed by vLLM per block in a way saria
            # does not reproduce: such requests bypass the cache.
            st.cacheable = getattr(request, "prompt_embeds", None) is None
            self.reqs[request.request_id] = st
        return st

    def _plan_store(self, st: _Req, rid: str, done_tokens: int, out: list[CopyOp]) -> None:
        if not st.cacheable:
            return
        full = done_tokens // self.block_size
        self.hasher.extend(st.chain, st.request, full)
        full = min(full, len(st.chain), len(st.block_ids))
        if full <= st.stored:
            return
        spec = self.cache.prepare_store(st.chain.array[:full], st.stored)
        st.stored = full
        if spec.num_blocks == 0:
            return
        pos = spec.positions.tolist()
        op_id = self.ops.start("store", rid, spec)
        out.append(CopyOp(op_id, rid, [st.block_ids[p] for p in pos], spec.slots.tolist()))
        self.counters["store_ops"] += 1
        if self.cfg.events:
            r = st.request
            lora = getattr(r, "lora_request", None)
            bs = self.block_size
            for p in pos:
                self._tokens_of[st.chain.keys[p]] = (
                    tuple(r.all_token_ids[p * bs:(p + 1) * bs]), lora)

    def _stage_from_ssd(self, keys, blocks: int, local: int) -> Staged:
        t = time.perf_counter()
        staged = self.cache.stage(keys, blocks, local)
        self.counters["ssd_stages"] += 1
        self.counters["ssd_stage_us"] += int((time.perf_counter() - t) * 1e6)
        return staged

    def _complete(self, op, *, ok: bool) -> None:
        if op.kind == "store":
            self.cache.complete_store(op.spec, success=ok)
            if not ok:
                self.counters["store_failures"] += 1
        else:
            self.cache.release(op.spec, promote=ok)
            if not ok:
                self.counters["load_failures"] += 1

    def _unstage(self, st: _Req) -> None:
        if st.staged is not None:
            self.cache.release(st.staged, promote=False)
            st.staged = None
        if st.staging is not None:
            fut, st.staging = st.staging, None
            fut.add_done_callback(lambda f: self.cache.release(f.result(), promote=False))


def _max_blocks(cfg: ConnectorConfig, geo: Geometry) -> int:
    """Index capacity: every block DRAM and SSD can hold, plus history room."""
    held = cfg.dram_bytes // geo.slot_bytes
    if cfg.has_ssd:
        held += len(cfg.ssd_dirs) * (cfg.ssd_bytes // geo.slot_bytes)
    return max(4096, 4 * held)
