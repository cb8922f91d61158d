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
* ``update_connector_output``: ops the workers finished are committed (stores:
  admission may now write them to the SSD) or released (loads: promotion).
* ``request_finished``: the blocks' free is delayed while a store op still
  reads them.
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
from saria.connector.stats import Deltas, cumulative
from saria.index import Tier
from saria.keys.hashing import BlockHasher, keys_to_array
from saria.runtime import CacheConfig, Reservation, Staged, TieredCache

log = logging.getLogger("saria.connector")


@dataclass
class _Req:
    request: object
    keys: list[bytes] = field(default_factory=list)
    key_array: np.ndarray = field(default_factory=lambda: keys_to_array([]))  # == keys, stacked
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
        self.bs = geo.block_size
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
        self.pool_id = self.cache.pool.shared_id
        self.cache.pool.unlink()
        self.hasher = BlockHasher(self.bs, cfg.hash_algo, cfg.hash_seed)
        self._configs = (vllm_config, kv_cache_config)
        self._engine_hashes: bool | None = None  # decided at the first request (see property)
        self.world = geo.tp_size
        self.reqs: dict[str, _Req] = {}
        self._ops = 0
        self._loads: list[CopyOp] = []
        self._delayed: list[str] = []
        self._pending_stores: dict[int, tuple[str, Reservation]] = {}
        self._pending_loads: dict[int, tuple[str, Staged]] = {}
        self._acks: dict[int, int] = {}
        self._tokens_of: dict[bytes, tuple[tuple[int, ...], object]] = {}
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="saria-ssd-stage")
        self.counters = {"hit_tokens": 0, "query_tokens": 0,
                         "load_ops": 0, "store_ops": 0, "store_failures": 0,
                         "load_failures": 0, "delayed_frees": 0, "ssd_stages": 0,
                         "ssd_stage_us": 0}
        self.started = time.monotonic()
        self.metrics_server = None
        self._deltas = Deltas()
        recovered = len(self.cache._recovered)
        log.info("saria scheduler: block %d tokens, slot %d B, DRAM %d slots, SSD %s "
                 "(%d blocks recovered), admission %s, promotion %s", self.bs,
                 geo.slot_bytes, self.cache.pool.num_slots,
                 ", ".join(dirs) if dirs else "off", recovered, cfg.admission, cfg.promotion)

    @property
    def engine_hashes(self) -> bool:
        """Whether vLLM's ``request.block_hashes`` are saria's keys. Decided
        lazily: EngineCore seeds vLLM's hash root after building the scheduler."""
        if self._engine_hashes is None:
            self._engine_hashes = _engine_hashes_match(self.hasher, *self._configs)
        return self._engine_hashes

    # ------------------------------------------------------------- vLLM API

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        st = self._req(request)
        if not st.cacheable:
            return 0, False
        local = num_computed_tokens // self.bs
        limit = (request.num_tokens - 1) // self.bs  # vLLM must compute >= 1 token
        self._extend_keys(st, limit)
        if st.staging is not None:
            if not st.staging.done():
                return None, False  # SSD read in flight: ask again later
            st.staged, st.staging = st.staging.result(), None
        if st.staged is None:
            keys = st.key_array[:limit]
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
        return (hit - local) * self.bs, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        st = self.reqs.get(request.request_id)
        if st is None:
            return
        st.block_ids = list(blocks.get_block_ids()[0])
        n_ext = num_external_tokens // self.bs
        local = request.num_computed_tokens // self.bs if n_ext == 0 else st.local
        if n_ext and st.staged is not None:
            ids = st.block_ids[local: local + n_ext]
            slots = st.staged.slots[local: local + n_ext].tolist()
            op = CopyOp(self._next_op(), request.request_id, ids, slots)
            self._loads.append(op)
            self._pending_loads[op.op_id] = (request.request_id, st.staged)
            st.staged = None
            self.counters["load_ops"] += 1
        else:
            self._unstage(st)
        st.stored = max(st.stored, local + n_ext)
        self.counters["hit_tokens"] += n_ext * self.bs  # resumed requests too
        if not st.recorded:
            st.recorded = True
            self.counters["query_tokens"] += request.num_tokens
            n = min(len(st.keys), (request.num_tokens - 1) // self.bs)
            if n:
                self.cache.record_access(st.key_array[:n], hits=local + n_ext)

    def build_connector_meta(self, so) -> SariaMetadata:
        stores: list[CopyOp] = []
        new = so.scheduled_new_reqs
        for nr in new:
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
            self._finish(op_id, ok=False)
        for op_id, n in wm.done.items():
            self._acks[op_id] = self._acks.get(op_id, 0) + n
            if self._acks[op_id] >= self.world:
                self._finish(op_id, ok=True)

    def request_finished(self, request, block_ids) -> tuple[bool, None]:
        rid = request.request_id
        st = self.reqs.pop(rid, None)
        if st is not None:
            self._unstage(st)
        busy = any(r == rid for r, _ in self._pending_stores.values())
        if busy:
            self._delayed.append(rid)
            self.counters["delayed_frees"] += 1
        return busy, None

    def take_events(self):
        from saria.connector.events import to_vllm_events

        events = to_vllm_events(self.cache.take_events(), self._tokens_of, self.bs,
                                self.hasher.digest_size)
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

    def _extend_keys(self, st: _Req, blocks: int) -> None:
        have = len(st.keys)
        if blocks <= have:
            return
        r = st.request
        if self.engine_hashes and len(r.block_hashes) >= blocks:
            # The engine hashed these blocks exactly as saria would (same
            # algorithm, seed and block size): take its hashes, skip the work.
            new = list(r.block_hashes[have:blocks])
        else:
            tokens = r.all_token_ids[have * self.bs: blocks * self.bs]
            lora = getattr(r, "lora_request", None)
            new = self.hasher.block_keys(
                tokens, cache_salt=None if have else getattr(r, "cache_salt", None),
                lora_name=lora.lora_name if lora else None,
                lora_path=(lora.lora_path or "") if lora else "",
                mm_features=getattr(r, "mm_features", None) or None,
                parent=st.keys[-1] if have else None, start=have * self.bs if have else None)
        if new:
            # Each key is converted once: lookups, accesses and store plans
            # slice this array for the request's whole life.
            st.keys.extend(new)
            st.key_array = np.concatenate([st.key_array, keys_to_array(new)])

    def _plan_store(self, st: _Req, rid: str, done_tokens: int, out: list[CopyOp]) -> None:
        if not st.cacheable:
            return
        full = done_tokens // self.bs
        self._extend_keys(st, full)
        full = min(full, len(st.keys), len(st.block_ids))
        if full <= st.stored:
            return
        res = self.cache.reserve(st.key_array[:full], st.stored)
        st.stored = full
        if res.num_blocks == 0:
            return
        pos = res.positions.tolist()
        op = CopyOp(self._next_op(), rid, [st.block_ids[p] for p in pos], res.slots.tolist())
        out.append(op)
        self._pending_stores[op.op_id] = (rid, res)
        self.counters["store_ops"] += 1
        if self.cfg.events:
            r = st.request
            lora = getattr(r, "lora_request", None)
            for p in pos:
                self._tokens_of[st.keys[p]] = (
                    tuple(r.all_token_ids[p * self.bs:(p + 1) * self.bs]), lora)

    def _stage_from_ssd(self, keys, blocks: int, local: int) -> Staged:
        t = time.perf_counter()
        staged = self.cache.stage(keys, blocks, local)
        self.counters["ssd_stages"] += 1
        self.counters["ssd_stage_us"] += int((time.perf_counter() - t) * 1e6)
        return staged

    def _finish(self, op_id: int, *, ok: bool) -> None:
        self._acks.pop(op_id, None)
        if op_id in self._pending_stores:
            _, res = self._pending_stores.pop(op_id)
            self.cache.commit(res, ok=ok)
            if not ok:
                self.counters["store_failures"] += 1
        elif op_id in self._pending_loads:
            _, staged = self._pending_loads.pop(op_id)
            self.cache.release(staged, promote=ok)
            if not ok:
                self.counters["load_failures"] += 1

    def _unstage(self, st: _Req) -> None:
        if st.staged is not None:
            self.cache.release(st.staged, promote=False)
            st.staged = None
        if st.staging is not None:
            fut, st.staging = st.staging, None
            fut.add_done_callback(lambda f: self.cache.release(f.result(), promote=False))

    def _next_op(self) -> int:
        self._ops += 1
        return self._ops


def _engine_hashes_match(hasher: BlockHasher, vllm_config, kv_cache_config) -> bool:
    """True when vLLM's ``request.block_hashes`` are saria's keys: the engine
    hashes canonical CBOR with the same function and root (seed), per KV block."""
    algo = getattr(vllm_config.cache_config, "prefix_caching_hash_algo", None)
    if algo != hasher.algo or kv_cache_config is None:
        return False
    if (kv_cache_config.hash_block_size or hasher.block_size) != hasher.block_size:
        return False
    try:
        from vllm.v1.core import kv_cache_utils

        return bytes(kv_cache_utils.NONE_HASH) == hasher.root
    except (ImportError, AttributeError, NameError):
        return False


def _max_blocks(cfg: ConnectorConfig, geo: Geometry) -> int:
    """Index capacity: every block DRAM and SSD can hold, plus history room."""
    held = cfg.dram_bytes // geo.slot_bytes
    if cfg.has_ssd:
        held += len(cfg.ssd_dirs) * (cfg.ssd_bytes // geo.slot_bytes)
    return max(4096, 4 * held)
