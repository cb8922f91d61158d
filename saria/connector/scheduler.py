"""Scheduler side: the index, the policies and the tiers, in vLLM's EngineCore.

Why here. vLLM runs the scheduler connector and the worker connectors in
different processes that share nothing but the pickled per-step metadata.
saria's decisions (what is cached where, what admission writes to the SSD,
what promotion keeps) are all scheduler decisions, made by the one cache core
(``TieredCache`` over ``saria.core.CacheManager``) -- so the core lives here:
index, policies, the SSD store's owner (its writer) and the allocator of the
DRAM pool. The pool itself is shared memory (``/dev/shm``) and the SSD
store's drive files are opened read-only by the workers, which move every
byte of a load or store in the slots and handles this side names (LMCache's
multi-process split: storage decisions in one place, copies in the workers).

Flow per request (``keys`` are saria block keys of the request's tokens):

* ``get_num_new_matched_tokens``: the longest prefix cached in any tier
  beyond vLLM's own hit, locked at once (``prepare_load``) so no eviction
  can take it before the copy. A hit is never capped by DRAM: SSD blocks are
  read by the workers straight into KV pages.
* ``update_state_after_alloc``: the locked prefix becomes a load op: DRAM ->
  KV and SSD -> KV transfers into the request's new KV blocks (synchronous:
  done before its layers run; asynchronous with several KV-cache groups,
  ``Geometry.async_loads``: the request waits one step for them).
* ``build_connector_meta``: every request's newly computed full blocks get DRAM
  slots (``prepare_store``) and become a store op. Under a write-through
  policy the blocks DRAM cannot keep (a prompt longer than the free DRAM)
  still go to the SSD, as the replay assumes: copied into a few staging slots
  and written from there, in waves as staging frees up (a finished request
  keeps its KV pages until its last wave is copied). A request whose prefill
  is done and which read blocks from the SSD gets its lazy partial promotion:
  the policy's pick of those blocks is copied from its KV pages into DRAM
  (``prepare_promotion``), a store that the request never waits for.
* ``update_connector_output``: ops every worker finished are completed
  (stores: admission may now write them to the SSD; loads: SSD blocks that
  failed their read leave the SSD tier -- vLLM recomputes them).
* ``request_finished``: the blocks' free is delayed while a store op still
  reads them.

The parts: ``RequestHasher`` (a request's keys), ``OpTracker`` (op ids, acks
from every tensor-parallel rank, deadlines), and the cache's own API for
every figure (``stats``, ``gauges``): this class only sequences them.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from dataclasses import dataclass, field

import numpy as np

from saria.connector.config import ConnectorConfig
from saria.connector import hybrid
from saria.connector.layout import Geometry, pool_path
from saria.connector.meta import Medium, SariaMetadata, SariaWorkerMetadata, Transfer
from saria.connector.ops import OpTracker
from saria.connector.request_keys import KeyChain, RequestHasher
from saria.connector.stats import Deltas, DriveBytes, cumulative
from saria.core import LoadSpec
from saria.policy import make_admission
from saria.errors import ConfigError, SariaError
from saria.index import Tier
from saria.keys.hashing import BlockHasher
from saria.runtime import CacheConfig, TieredCache

log = logging.getLogger("saria.connector")


@dataclass
class _Req:
    request: object
    chain: KeyChain = field(default_factory=KeyChain)
    block_ids: list[int] = field(default_factory=list)
    groups: list[list[int]] | None = None  # several attention groups: ids per group
    state_ids: list[list[int]] = field(default_factory=list)  # recurrent groups' ids
    stored: int = 0                    # blocks below this need no store op
    load: LoadSpec | None = None       # a matched prefix, locked, not yet a load op
    local: int = 0                     # vLLM's own hit (blocks) at the last query
    recorded: bool = False
    cacheable: bool = True
    # SSD hits of its completed load, for promotion after prefill: (positions, DRAM blocks)
    promotable: tuple[np.ndarray, int] | None = None
    # async loads (several KV-cache groups): one failed, so vLLM recomputes the
    # request and is offered no load for it again (a persistent cause -- a copy
    # that always fails, a pool that cannot be mapped -- would loop otherwise)
    load_failed: bool = False
    # write-through blocks DRAM did not keep, waiting for staging slots: (key chain, positions)
    direct: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    drain_by: float = 0.0              # finished: its waves still to copy are dropped then


@dataclass
class _Wave:
    """Direct writes in flight: ``chain[positions]`` copied into staging slots."""

    chain: np.ndarray
    positions: np.ndarray
    staging: np.ndarray


class SariaScheduler:
    """The SCHEDULER role of ``SariaConnector``."""

    def __init__(self, cfg: ConnectorConfig, vllm_config, geo: Geometry,
                 kv_cache_config=None) -> None:
        self.cfg = cfg
        self.geo = geo
        self.block_size = geo.block_size
        hybrid.check_supported(cfg, geo)
        if cfg.server is not None:  # the node's shared cache (saria serve)
            from saria.connector.remote import ServerCache

            try:
                self.cache = ServerCache(cfg, geo, vllm_config)
            except SariaError as e:
                raise ConfigError("server", f"{cfg.server}: {e}") from None
            self.pool_id = None
            dirs = self.cache.ssd_dirs
        else:
            dirs = self._local_cache(cfg, vllm_config, geo)
        self.hasher = RequestHasher(BlockHasher(self.block_size, cfg.hash_algo, cfg.hash_seed),
                                    vllm_config, kv_cache_config)
        self.ops = OpTracker(geo.tp_size, cfg.op_timeout_s)
        self.reqs: dict[str, _Req] = {}
        self._draining: dict[str, _Req] = {}     # finished, direct writes still to copy
        self._finishing: dict[str, _Req] = {}    # finished before their load was reported
        self._loads: list[Transfer] = []
        self._states: list = []                  # state checkpoints to load (hybrid models)
        self._checked = 0                        # this step's blocks asked to be stored
        self._stats_mark: tuple | None = None     # what the last take_stats saw
        self._next_summary = time.monotonic() + cfg.log_interval_s
        self._late_stores: list[Transfer] = []   # promotions of requests that finished
        self._delayed: list[str] = []
        self._tokens_of: dict[bytes, tuple[tuple[int, ...], object]] = {}
        # KV blocks whose load failed, until a forward (or a load) writes them again:
        # block -> how many of its tokens, from its first, forwards wrote since
        self._unfilled: dict[int, int] = {}
        self.counters = {"hit_tokens": 0, "query_tokens": 0,
                         "load_ops": 0, "store_ops": 0, "promotion_ops": 0, "direct_ops": 0,
                         "direct_dropped": 0,
                         "store_failures": 0, "load_failures": 0, "expired_ops": 0,
                         "delayed_frees": 0}
        self.started = time.monotonic()
        self.metrics_server = None
        self._deltas = Deltas()
        self.drive_bytes = DriveBytes()  # its own drives' bytes, for stats
        gauges = self.cache.gauges()
        if cfg.server is not None:
            log.info("saria scheduler: block %d tokens, slot %d B, cache server %s (namespace "
                     "%s, DRAM %d slots, SSD %s), coordinator %s", self.block_size,
                     geo.slot_bytes, cfg.server, self.cache.client.info.get("namespace"),
                     gauges.get("dram_slots", 0), ", ".join(dirs) or "off", cfg.coordinator)
            return
        log.info("saria scheduler: block %d tokens, slot %d B, DRAM %d slots, SSD %s "
                 "(%d blocks recovered), admission %s, promotion %s, coordinator %s",
                 self.block_size, geo.slot_bytes, gauges["dram_slots"],
                 ", ".join(dirs) if dirs else "off", gauges["ssd_recovered_unadopted"],
                 cfg.admission, cfg.promotion, cfg.coordinator)

    def _local_cache(self, cfg: ConnectorConfig, vllm_config, geo: Geometry) -> tuple[str, ...]:
        """The in-process cache (no server): this engine's own DRAM pool and drives."""
        dirs = cfg.store_dirs(geo)
        for d in dirs:
            os.makedirs(d, exist_ok=True)
        dram_slots = cfg.dram_bytes // geo.slot_bytes
        staging = 0
        if (dirs and make_admission(cfg.admission).writes_on_create and dram_slots > 1
                and geo.num_layer_groups == 1 and not geo.hybrid):  # see _promote
            staging = max(1, dram_slots // 8)  # write-through of blocks DRAM does not keep
        path = pool_path(vllm_config)
        self.remote_tier = None
        try:
            if cfg.remote is not None:  # this engine's own client of the cluster tier
                from saria.tiers.remote import RemoteSettings, RemoteTier

                self.remote_tier = RemoteTier(RemoteSettings.from_mapping(cfg.remote),
                                              geo.namespace(cfg.hash_algo, cfg.hash_seed),
                                              geo.slot_bytes)
            self.cache = TieredCache(CacheConfig(
                block_bytes=geo.slot_bytes, dram_bytes=cfg.dram_bytes, ssd_dirs=dirs,
                ssd_bytes=cfg.ssd_bytes, admission=cfg.admission, promotion=cfg.promotion,
                promotion_r=cfg.promotion_r, min_victim_age_s=cfg.promotion_min_age_s,
                write_queue=cfg.write_queue, events=cfg.events,
                shared_pool=path, max_blocks=_max_blocks(cfg, geo),
                staging_slots=staging, dwpd=cfg.dwpd, state_bytes=geo.state_bytes,
                ssd_parts=geo.tp_size,  # each rank's worker reads its part of a block alone
                pin=False),  # only the workers' mappings need page-locking (for DMA)
                remote=self.remote_tier)
        except BaseException as e:
            # the engine will not start: the pool file the workers made must not outlive it
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            if self.remote_tier is not None:
                self.remote_tier.close()
            if isinstance(e, OSError) and e.errno == errno.EBUSY:
                # another cache owns the drive: one line, the holder's pid
                raise ConfigError("ssd_dirs", e.strerror or str(e)) from None
            raise
        # Workers mapped the pool before this side existed (vLLM creates the
        # worker connectors first); drop the name so nothing outlives the engine.
        pool = self.cache.backend.pool
        self.pool_id = pool.shared_id
        pool.unlink()
        return dirs

    @property
    def engine_hashes(self) -> bool:
        """Whether vLLM's ``request.block_hashes`` are saria's keys."""
        return self.hasher.engine_hashes

    # ------------------------------------------------------------- vLLM API

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        st = self._req(request)
        if not st.cacheable or st.load_failed:
            return 0, False
        local = num_computed_tokens // self.block_size
        limit = (request.num_tokens - 1) // self.block_size  # vLLM must compute >= 1 token
        self.hasher.extend(st.chain, request, limit)
        if st.load is not None and local < st.load.start:
            # vLLM's own hit shrank since the load was prepared (its pages were
            # evicted while the request waited): the blocks in between were not
            # fetched for it, nor are its failures checked from there -- prepare again.
            self._cancel(st)
        if st.load is None:
            keys = st.chain.array[:limit]
            plan = self.cache.lookup(keys)
            if plan.num_blocks <= local:  # hybrid models: the index ends it at a checkpoint
                return 0, False
            st.load = self.cache.prepare_load(keys, plan.num_blocks, start=local)
        st.local = local
        hit = st.load.num_blocks
        if hit <= local:
            self._cancel(st)
            return 0, False
        return (hit - local) * self.block_size, self.geo.async_loads

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        st = self.reqs.get(request.request_id)
        if st is None:
            return
        hybrid.set_ids(st, self.geo, blocks.get_block_ids())
        n_ext = num_external_tokens // self.block_size
        local = request.num_computed_tokens // self.block_size if n_ext == 0 else st.local
        if n_ext and st.load is not None:
            self._start_load(request.request_id, st, local, n_ext)
        else:
            self._cancel(st)
        st.stored = max(st.stored, local + n_ext)
        self.counters["hit_tokens"] += n_ext * self.block_size  # resumed requests too
        if not st.recorded:
            st.recorded = True
            self.counters["query_tokens"] += request.num_tokens
            n = min(len(st.chain), (request.num_tokens - 1) // self.block_size)
            if n:
                at = local + n_ext if self.geo.hybrid and n_ext else 0
                self.cache.touch(st.chain.array[:n], hits=local + n_ext, checkpoint_at=at)

    def build_connector_meta(self, so) -> SariaMetadata:
        for op in self.ops.expired():
            self.counters["expired_ops"] += 1
            if op.quarantined:  # a rank may still write into its slots: keep them
                log.error("saria: %s op %d of request %s got no report from every worker "
                          "in %.0f s; its DRAM slots stay held until the last one reports",
                          op.kind, op.op_id, op.req_id, self.ops.timeout_s)
                continue
            log.error("saria: load op %d of request %s got no ack from every worker in %.0f s; "
                      "failing it", op.op_id, op.req_id, self.ops.timeout_s)
            self._complete(op, ok=False)
        stores, self._late_stores = self._late_stores, []
        for rid in getattr(so, "preempted_req_ids", None) or ():
            st = self.reqs.get(rid)
            if st is not None:
                st.promotable = None  # its pages are freed: nothing left to promote from
            if st is not None and st.direct:
                # vLLM freed its KV pages: waves not copied yet would read
                # whatever the pages hold next and write it under these keys
                self._drop_direct(st)
        for nr in so.scheduled_new_reqs:
            st = self.reqs.get(nr.req_id)
            if st is not None:
                hybrid.set_ids(st, self.geo, nr.block_ids)
                self._plan_store(st, nr.req_id, nr.num_computed_tokens
                                 + so.num_scheduled_tokens[nr.req_id], stores)
        cached = so.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            st = self.reqs.get(rid)
            if st is None:
                continue
            nb = cached.new_block_ids[i]
            if rid in cached.resumed_req_ids and nb is not None:
                hybrid.set_ids(st, self.geo, nb)
            elif nb is not None:
                hybrid.extend_ids(st, self.geo, nb)
            self._plan_store(st, rid, cached.num_computed_tokens[i]
                             + so.num_scheduled_tokens[rid], stores)
        self._drain_direct(stores)
        states, self._states = self._states, []
        if self.geo.hybrid:  # recurrent states vLLM computed this step: checkpoints
            states += hybrid.plan_checkpoints(self, so)
        meta = SariaMetadata(loads=self._loads, stores=stores, delayed=self._delayed,
                             preempted=sorted(getattr(so, "preempted_req_ids", None) or ()),
                             pool_id=self.pool_id, server_pool=self._server_pool(),
                             server_epoch=self._epoch(), server_fence=self._fence(),
                             unfilled=self._attended_unfilled(so), states=states,
                             stores_due=self._checked)
        self._loads, self._delayed, self._checked = [], [], 0
        if self.cfg.log_interval_s and time.monotonic() >= self._next_summary:
            self._summary()
        return meta

    def _summary(self) -> None:
        """One line in vLLM's log every ``log_interval_s``: what the cache did
        since start, for an operator who reads the log, not a dashboard."""
        self._next_summary = time.monotonic() + self.cfg.log_interval_s
        s, c = self.cache.stats, self.counters
        q = c["query_tokens"]
        log.info("saria: %d of %d prompt tokens from the cache (%.1f%%; blocks from DRAM %d, "
                 "SSD %d), %d blocks stored, %d written to the SSD; failures: %d loads, "
                 "%d stores, %d SSD reads, %d SSD writes, %d writes dropped",
                 c["hit_tokens"], q, 100 * c["hit_tokens"] / q if q else 0.0,
                 s.hit_blocks["DRAM"], s.hit_blocks["SSD"], s.stored_blocks, s.ssd_write_blocks,
                 c["load_failures"], c["store_failures"], s.ssd_read_failures,
                 s.ssd_write_failures, s.writes_dropped)

    def update_connector_output(self, out) -> None:
        wm = getattr(out, "kv_connector_worker_meta", None)
        if not isinstance(wm, SariaWorkerMetadata):
            return
        # an op ends once every rank reported it, failed or not (see ``OpTracker``);
        # a load's failed blocks are unfilled from the first rank that reports them
        for op_id, n in wm.failed.items():
            self._load_failed(self.ops.get(op_id), None)
            op = self.ops.ack(op_id, ok=False, count=n)
            if op is not None:
                self._complete(op, ok=op.ok)
        for op_id, n in wm.done.items():
            bad = wm.bad_ssd.get(op_id, ())
            if bad:
                self._load_failed(self.ops.get(op_id), bad)
            op = self.ops.ack(op_id, ok=True, count=n, bad=bad)
            if op is not None:
                self._complete(op, ok=op.ok)

    def request_finished(self, request, block_ids) -> tuple[bool, None]:
        rid = request.request_id
        st = self.reqs.pop(rid, None)
        if st is not None:
            self._cancel(st)
            if self.ops.loads_pending(rid) and self.geo.async_loads:
                # vLLM keeps an async load's pages itself until its finished_recving
                # and frees them then: a delay here would free them twice
                return False, None
            if self.ops.loads_pending(rid):
                # vLLM reports a request finished before the load it ran in the
                # same step: its outcome decides the promotion, so keep the pages.
                self._finishing[rid] = st
                self.counters["delayed_frees"] += 1
                return True, None
        return self._finish(rid, st)

    def _finish(self, rid: str, st: _Req | None, counted: bool = False) -> tuple[bool, None]:
        """A finished request whose load is settled: its KV pages still hold
        its SSD hits, so promote them, then keep the pages while copies of
        them (stores, promotion, direct writes) are still to run."""
        if st is not None:
            self._promote(st, rid, self._late_stores)
            if st.direct:  # its pages stay until the last wave is copied
                st.drain_by = self.ops.now() + self.ops.timeout_s
                self._draining[rid] = st
                self.counters["delayed_frees"] += not counted
                return True, None
        busy = self.ops.stores_pending(rid) or any(t.req_id == rid for t in self._late_stores)
        if busy:
            self._delayed.append(rid)
            self.counters["delayed_frees"] += not counted
        return busy, None

    def _server_pool(self):
        """What a worker maps when a server owns the cache: the pool file and
        the store's directories (they change when the server restarts)."""
        if self.cfg.server is None or self.cache.pool_path is None:
            return None
        return self.cache.pool_path, self.cache.ssd_dirs

    def _epoch(self) -> str:
        """The cache server's boot and this engine's session there, whose pool
        and slots the workers may use now ("" in-process)."""
        if self.cfg.server is None:
            return ""
        c = self.cache.client
        return f"{c.boot}/{c.session}" if c.boot and c.session else ""

    def _fence(self) -> str:
        return self.cache.fence_path if self.cfg.server is not None else ""

    def take_events(self):
        from saria.connector.events import to_vllm_events

        events = to_vllm_events(self.cache.take_events(), self._tokens_of, self.block_size,
                                self.hasher.hasher.digest_size)
        self._tokens_of.clear()
        return events

    def take_stats(self):
        # vLLM asks every step: a step that moved nothing says nothing (and
        # builds no dict of every counter to find that out)
        st = self.cache.stats
        mark = (tuple(self.counters.values()), st.hit_blocks["DRAM"], st.hit_blocks["SSD"],
                st.stored_blocks, st.promoted_blocks, st.dram_evictions, st.ssd_evictions,
                st.ssd_write_blocks, st.ssd_write_failures, st.ssd_read_failures,
                st.writes_dropped)
        if mark == self._stats_mark:
            return None
        self._stats_mark = mark
        return self._deltas.take(cumulative(self))

    def shutdown(self) -> None:
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
            self.metrics_server.server_close()
        for st in self.reqs.values():
            self._cancel(st)
        for op in self.ops.pending():  # give back what no worker will report any more
            if isinstance(op.spec, _Wave):
                self.cache.release_staging(op.spec.staging)
        self.cache.flush()
        self.cache.close()
        if getattr(self, "remote_tier", None) is not None:
            self.remote_tier.close()

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

    def _start_load(self, rid: str, st: _Req, local: int, n_ext: int) -> None:
        """The locked prefix's blocks [local, local + n_ext) become one load
        op: a DRAM -> KV and an SSD -> KV transfer."""
        spec, st.load = st.load, None
        spec.start = local
        st.promotable = None  # an earlier admission's: its pages are not these
        pos = np.arange(local, local + n_ext)
        op_id = self.ops.start("load", rid, spec)
        for medium, tier in ((Medium.DRAM, Tier.DRAM), (Medium.SSD, Tier.SSD)):
            p = pos[spec.tiers[pos] == tier]
            if p.size == 0:
                continue
            keys = spec.path[p].tobytes() if medium == Medium.SSD else b""
            self._loads.append(Transfer(op_id, rid, medium, Medium.KV, spec.slots[p].tolist(),
                                        [st.block_ids[i] for i in p], keys,
                                        groups=hybrid.group_ids(st, p), epoch=_epoch_of(spec)))
        if self.geo.hybrid:
            self._states.append(hybrid.state_load(self, st, op_id, rid, spec, local + n_ext))
        self.counters["load_ops"] += 1

    def _plan_store(self, st: _Req, rid: str, done_tokens: int, out: list[Transfer]) -> None:
        if not st.cacheable:
            return
        full = done_tokens // self.block_size
        self.hasher.extend(st.chain, st.request, full)
        full = min(full, len(st.chain), len(st.block_ids), hybrid.storable(st, full))
        if full > st.stored:
            self._checked += full - st.stored   # the step has a store due, held or not
            direct = self.cache.staging_slots > 0
            spec = self.cache.prepare_store(st.chain.array[:full], st.stored, direct=direct)
            st.stored = full
            if spec.direct.size:
                st.direct.append((spec.chain, spec.direct))
                spec.direct = spec.direct[:0]
            if spec.num_blocks:
                pos = spec.positions.tolist()
                op_id = self.ops.start("store", rid, spec)
                out.append(Transfer(op_id, rid, Medium.KV, Medium.DRAM,
                                    [st.block_ids[p] for p in pos], spec.slots.tolist(),
                                    groups=hybrid.group_ids(st, pos), epoch=_epoch_of(spec)))
                self.counters["store_ops"] += 1
                if self.cfg.events:
                    self._remember_tokens(st, pos)
        if done_tokens >= getattr(st.request, "num_prompt_tokens", st.request.num_tokens):
            self._promote(st, rid, out)  # the prefill is done

    def _drain_direct(self, out: list[Transfer]) -> None:
        """Direct writes waiting for staging slots: as many as are free go
        out as copies into staging this step; a finished request whose last
        wave left is freed once the workers report it. A finished request's
        KV pages are vLLM's: it waits for staging at most the op deadline,
        and not at all while the cache server is unreachable -- a down or
        full server must not keep them (its waves are dropped, counted)."""
        staging_left = True
        for rid, st in list(self.reqs.items()) + list(self._draining.items()):
            while st.direct and staging_left:
                chain, pos = st.direct[0]
                slots = self.cache.take_staging(pos.size)
                epoch = self._epoch()  # the boot whose staging slots these are
                if slots.size == 0:
                    staging_left = False  # staging full: later steps go on
                    break
                wave, rest = pos[:slots.size], pos[slots.size:]
                st.direct[0] = (chain, rest)
                if rest.size == 0:
                    st.direct.pop(0)
                op_id = self.ops.start("store", rid, _Wave(chain, wave, slots))
                out.append(Transfer(op_id, rid, Medium.KV, Medium.DRAM,
                                    [st.block_ids[p] for p in wave.tolist()], slots.tolist(),
                                    epoch=epoch))
                self.counters["direct_ops"] += 1
            if rid not in self._draining:
                continue
            if st.direct and (not self.cache.reachable or self.ops.now() >= st.drain_by):
                self._drop_direct(st)
            if not st.direct:
                del self._draining[rid]
                self._delayed.append(rid)

    def _drop_direct(self, st: _Req) -> None:
        """The request's write-through waves not copied yet are given up (counted)."""
        self.counters["direct_dropped"] += sum(int(p.size) for _, p in st.direct)
        st.direct = []

    def _promote(self, st: _Req, rid: str, out: list[Transfer]) -> None:
        """Lazy partial promotion after prefill: the policy's pick of the
        request's SSD hits goes from its KV pages into DRAM slots."""
        if st.promotable is None or st.groups is not None:
            return  # several groups: a sliding window's early blocks are gone by now
        ssd_positions, dram_blocks = st.promotable
        st.promotable = None
        spec = self.cache.prepare_promotion(st.chain.array[:len(st.chain)], ssd_positions,
                                            dram_blocks)
        if spec.num_blocks == 0:
            return
        op_id = self.ops.start("store", rid, spec)
        out.append(Transfer(op_id, rid, Medium.KV, Medium.DRAM,
                            [st.block_ids[p] for p in spec.positions.tolist()],
                            spec.slots.tolist(), epoch=_epoch_of(spec)))
        self.counters["promotion_ops"] += 1

    def _remember_tokens(self, st: _Req, positions: list[int]) -> None:
        r = st.request
        lora = getattr(r, "lora_request", None)
        bs = self.block_size
        for p in positions:
            self._tokens_of[st.chain.keys[p]] = (tuple(r.all_token_ids[p * bs:(p + 1) * bs]), lora)

    def _complete(self, op, *, ok: bool) -> None:
        if isinstance(op.spec, _Wave):
            wave = op.spec
            if ok:
                self.cache.write_direct(wave.chain, wave.positions, wave.staging)
            else:
                self.counters["direct_dropped"] += int(wave.positions.size)
            self.cache.release_staging(wave.staging)
            return
        if op.kind == "state":
            self.cache.complete_checkpoint(op.spec, success=ok)
            return
        if op.kind == "store":
            self.cache.complete_store(op.spec, success=ok)
            if not ok:
                self.counters["store_failures"] += 1
            return
        self._complete_load(op, ok)
        rid = op.req_id
        if rid in self._finishing:  # finished in the step of its load: settle it now
            busy, _ = self._finish(rid, self._finishing.pop(rid), counted=True)
            if not busy:
                self._delayed.append(rid)  # vLLM waits for the worker to report it

    def _complete_load(self, op, ok: bool) -> None:
        spec: LoadSpec = op.spec
        st = self.reqs.get(op.req_id) or self._finishing.get(op.req_id)
        if not ok:  # a copy failed (not an SSD block): vLLM recomputes, the cache keeps its copies
            self.cache.cancel_load(spec)
            self.counters["load_failures"] += 1
            if st is not None and self.geo.async_loads:
                st.load_failed = True
            if op.failed == 0:  # expired: no rank said so (a failed report marked them)
                self._mark_unfilled(st, np.arange(spec.start, spec.num_blocks))
            return
        bad = np.asarray(op.bad, np.int64)
        failed = None
        if bad.size:  # marked unfilled as they were reported
            failed = _failed_ssd_positions(spec, bad)
        if bad.size and hybrid.state_failed(self.cache, spec, bad):
            served = self.cache.complete_load(spec, failed, state_failed=True)
        else:
            served = self.cache.complete_load(spec, failed)
        if st is not None and self.geo.async_loads and bad.size:
            # vLLM discarded the whole load (failed_recving) and recomputes it
            st.load_failed = True
            st.stored = min(st.stored, spec.start)
        elif st is not None:
            # vLLM recomputes from the first bad block: store what it recomputes.
            st.stored = min(st.stored, served)
            ssd = spec.positions(Tier.SSD)
            ssd = ssd[ssd < served]
            if ssd.size:
                st.promotable = (ssd, served - spec.start - ssd.size)

    def _load_failed(self, op, bad) -> None:
        """A rank reported that load `op` failed (`bad` None: a copy failed,
        every block) or that its SSD handles `bad` failed their read. The
        rank reported them to vLLM as load errors in the same step, and vLLM
        rewinds the request at once: its blocks are unfilled from now, not
        from when the last rank reports -- with tensor parallelism that may
        be much later (a rank's lost report waits out the op's deadline), and
        meanwhile a request could attend to them (the loader preempted and
        resumed, seed 559 of the simulation's local scenario)."""
        if op is None or op.kind != "load":
            return
        spec: LoadSpec = op.spec
        st = self.reqs.get(op.req_id) or self._finishing.get(op.req_id)
        if st is not None and self.geo.async_loads:
            st.load_failed = True  # vLLM got the failure in this step: no load for it again
        if bad is None:
            self._mark_unfilled(st, np.arange(spec.start, spec.num_blocks))
            return
        self._mark_unfilled(st, _failed_ssd_positions(spec, np.asarray(bad, np.int64)))

    def _mark_unfilled(self, st: _Req | None, positions: np.ndarray) -> None:
        # async loads: vLLM recomputes the request and caches none of its blocks
        if st is not None and not self.geo.async_loads:
            self._unfilled.update((st.block_ids[p], 0) for p in positions.tolist()
                                  if p < len(st.block_ids))

    def _attended_unfilled(self, so) -> list[int]:
        """The unfilled KV blocks a request attends this step without any
        request writing them in the same forward.

        Why: vLLM caches a block in its prefix cache when it allocates it,
        and under the ``recompute`` policy a failed load leaves it cached; it
        counts on the request that held it to recompute it at its next step.
        If that request is preempted or aborted first, the block stays cached
        with whatever its page held, and a later request (or the same one,
        resumed) gets a local hit on it -- wrong KV that no saria load is
        involved in. Reported as a load error, vLLM recomputes it instead.

        A block is filled again only once forwards wrote all its tokens: a
        forward that ends inside it (a chunk of a prefill that vLLM rewound
        to it) leaves the rest of its page as the failed load left it, and
        vLLM has it in its prefix cache all the same (seed 1062 of the
        simulation's local scenario). A request that attends only the part
        written (its own chunk, resumed next step) is not told."""
        if not self._unfilled:
            return []
        bs = self.block_size
        for t in self._loads:  # loads run before the forward and fill whole blocks
            for b in t.dst_ids:
                self._unfilled.pop(b, None)
        spans = [(nr.block_ids[0], nr.num_computed_tokens, so.num_scheduled_tokens[nr.req_id])
                 for nr in so.scheduled_new_reqs]
        cached = so.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            st = self.reqs.get(rid)
            if st is not None:
                spans.append((st.block_ids, cached.num_computed_tokens[i],
                              so.num_scheduled_tokens[rid]))
        # the forward writes tokens [computed, computed + scheduled) of each request
        for ids, computed, scheduled in spans:
            end = computed + scheduled
            for i in range(computed // bs, min(len(ids), -(-end // bs))):
                v = self._unfilled.get(ids[i])
                if v is None or computed > i * bs + v:  # not written on from what is filled
                    continue
                v = min(end, (i + 1) * bs) - i * bs
                if v >= bs:
                    del self._unfilled[ids[i]]
                else:
                    self._unfilled[ids[i]] = v
        # and attends tokens [0, computed): every block holding one must be filled that far
        stale: set[int] = set()
        for ids, computed, _ in spans:
            for i in range(min(len(ids), -(-computed // bs))):
                v = self._unfilled.get(ids[i])
                if v is not None and v < min(computed, (i + 1) * bs) - i * bs:
                    stale.add(ids[i])
        return sorted(stale)

    def _cancel(self, st: _Req) -> None:
        if st.load is not None:
            self.cache.cancel_load(st.load)
            st.load = None


def _epoch_of(spec) -> str:
    """The server boot and session a spec's slots belong to ("" for the
    in-process cache's): the session's end frees them."""
    boot, session = getattr(spec, "boot", ""), getattr(spec, "session", "")
    return f"{boot}/{session}" if boot else ""


def _max_blocks(cfg: ConnectorConfig, geo: Geometry) -> int:
    """Index capacity: every block DRAM and SSD can hold, plus history room."""
    held = cfg.dram_bytes // geo.slot_bytes
    if cfg.has_ssd:
        held += len(cfg.ssd_dirs) * (cfg.ssd_bytes // geo.slot_bytes)
    return max(4096, 4 * held)


def _failed_ssd_positions(spec: LoadSpec, bad: np.ndarray) -> np.ndarray:
    """The positions of `spec` whose SSD handles are among the failed `bad`."""
    ssd = spec.positions(Tier.SSD)
    return ssd[np.isin(spec.slots[ssd], bad)]
