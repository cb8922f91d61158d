"""Worker side: moves whole KV pages between vLLM's KV cache, the shared DRAM
pool and the SSD store, layer by layer, beside the forward pass.

The worker holds no index and makes no decision: each step's
``SariaMetadata`` names the transfers (see ``meta.py``), and the worker runs
each with the mover for its (source, destination) media (``movers.py``:
``PageCopier`` for DRAM <-> KV, ``SsdPageReader`` for SSD -> KV), ordered
after the forward pass by ``ComputeOrder`` (``ordering.py``).

Loads run before the forward (saria's loads are synchronous in vLLM's
sense), through a ``LoadCoordinator`` (``loads.py``: serial, overlap or
paced); each layer waits only for its own pages (``wait_for_layer_load``).
With several KV-cache groups they are asynchronous (``Geometry.async_loads``):
vLLM runs them beside a forward that does not read them, each rank reports
every one it ran in ``finished_recving`` and a failed one in
``failed_recving`` (vLLM takes no block-level errors there).
Stores are queued as each layer finishes (``save_kv_layer``) and not waited
for at the end of the step: the scheduler learns they are done from
``build_connector_meta`` and keeps a finished request's blocks allocated
until ``get_finished`` reports them. A block the scheduler names is ready
or being filled by exactly this step's stores; the scheduler never names a
slot for a load before the store that fills it was acked (readiness in the
cache core), so loads and stores of one step never meet in a slot.
"""

from __future__ import annotations

import functools
import logging
import os
from collections import defaultdict
from concurrent.futures import Future

import torch

from saria.connector.config import ConnectorConfig
from saria.connector.layout import Geometry, pool_path
from saria.connector.loads import LoadCoordinator, StepLoad
from saria.connector.meta import Medium, SariaMetadata, SariaWorkerMetadata, Transfer
from saria.connector.movers import DRAM_TO_KV, SSD_TO_KV, PageCopier, SsdPageReader
from saria.connector.pages import KVPages
from saria.connector.stats import Deltas
from saria.errors import SariaError
from saria.serve.fence import WorkerFence
from saria.tiers.dram import DramPool

log = logging.getLogger("saria.connector")


def open_shared_pool(cfg: ConnectorConfig, vllm_config, geo: Geometry) -> DramPool:
    """Creates or attaches the engine's shared DRAM pool; a pool that cannot
    be made is a ``dram_bytes`` error (tmpfs too small, as in a container with
    the default 64 MB /dev/shm)."""
    from saria.errors import ConfigError
    from saria.tiers.dram import DramPoolError

    path = pool_path(vllm_config)
    n = cfg.dram_bytes // geo.slot_bytes
    if not os.path.exists(path):
        st = os.statvfs(os.path.dirname(path))
        free = st.f_bavail * st.f_frsize
        if n * geo.slot_bytes > free:
            raise ConfigError("dram_bytes", f"{n * geo.slot_bytes:,} B does not fit in "
                              f"{os.path.dirname(path)} ({free:,} B free); enlarge it (docker "
                              "--shm-size) or lower dram_bytes")
    try:
        return DramPool(n, geo.slot_bytes, shared=path, prefault=False)
    except DramPoolError as e:
        raise ConfigError("dram_bytes", str(e)) from None


class SariaWorker:
    """The WORKER role of ``SariaConnector``."""

    def __init__(self, cfg: ConnectorConfig, vllm_config, geo: Geometry) -> None:
        self.cfg = cfg
        self.geo = geo
        # with a cache server the pool and drives are the server's, named by
        # the scheduler in each step's metadata (they change if it restarts)
        self.pool = None if cfg.server else open_shared_pool(cfg, vllm_config, geo)
        self.ssd_dirs = () if cfg.server else cfg.store_dirs(geo)
        self._server_pool: tuple[str, tuple[str, ...]] | None = None
        self._stale: set[int] = set()  # this step's ops no copy may run for
        self._fence = WorkerFence()    # held while copies of a server session are in flight
        self._pages: KVPages | None = None
        self.copier: PageCopier | None = None
        self.coordinator: LoadCoordinator | None = None
        self._checked_pool = False
        self._step: StepLoad | None = None
        self._loads: list[Transfer] = []      # this step's load transfers
        self._saved_layers: set[int] = set()  # layers whose stores this step are queued
        self._pending: dict[int, tuple[Transfer, list[Future]]] = {}  # store op id -> futures
        self._done = SariaWorkerMetadata()
        self._load_errors: set[int] = set()
        # async loads (``Geometry.async_loads``): requests whose load ended on
        # this rank, and those of them that failed (vLLM recomputes them)
        self._recving: set[str] = set()
        self._failed_recving: set[str] = set()
        self._delayed: set[str] = set()
        self._meta: SariaMetadata | None = None  # the step's metadata, once begun
        self._deltas = Deltas()
        self._stats_mark: tuple | None = None  # what the last take_stats saw
        self.bytes_stored = 0
        self._kv_caches = None
        self.states = None                      # recurrent-state checkpoints (hybrid models)
        self._state_errors: dict[int, str] = {}  # load op id -> why its state did not load
        self._state_bad: dict[int, list[int]] = {}  # load op id -> its checkpoint's failed handles
        self._states_loaded: SariaMetadata | None = None  # the step whose states are in

    # ------------------------------------------------------------ lifecycle

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._pages = KVPages(kv_caches, self.geo)
        self._kv_caches = kv_caches if self.geo.hybrid else None  # state layers (states.py)
        if self.pool is not None:
            self._attach()

    def _attach(self) -> None:
        """Copier and coordinator over the current pool and drives."""
        pages = self._pages
        self.copier = PageCopier(pages, self.pool, self.geo)
        reader = SsdPageReader(self.ssd_dirs, pages, self.geo) if self.ssd_dirs else None
        self.coordinator = LoadCoordinator(self.cfg.coordinator, self.copier, reader,
                                           self.geo.num_layers, self.cfg.ingress_bytes_per_s)
        if self._kv_caches is not None:
            from saria.connector.states import StateMover

            self.states = StateMover(self._kv_caches, self.geo, self.pool, self.ssd_dirs)
        log.info("saria worker: %d layers, %d B pages (%d kernel blocks each), pool %d slots of "
                 "%d B (%s, %s), SSD %s, coordinator %s", self.geo.num_layers, self.geo.page_bytes,
                 pages.kernel_blocks, self.pool.num_slots,
                 self.pool.slot_bytes, "pinned" if self.pool.pinned else "not pinned",
                 pages.device, ", ".join(self.ssd_dirs) or "off", self.cfg.coordinator)

    def shutdown(self) -> None:
        self.shutdown_movers()
        if self.pool is not None and self._server_pool is None:
            self.pool.unlink()  # the engine's own pool (a server's stays the server's)

    def shutdown_movers(self) -> None:
        if self.states is not None:
            self.states.close()
        if self.copier is not None:
            self.copier.close()
        if self.coordinator is not None:
            self.coordinator.close()
            if self.coordinator.reader is not None:
                self.coordinator.reader.close()

    # -------------------------------------------------------------- per step

    def _begin(self, meta: SariaMetadata) -> None:
        """First call of a step (vLLM calls start_load_kv before or after the
        forward, so any of the step's calls may come first)."""
        if meta is self._meta:
            return
        self._meta = meta
        if meta.server_pool is not None and meta.server_pool != self._server_pool:
            self._map_server_pool(meta.server_pool)
        self._check_pool(meta)
        self._saved_layers.clear()
        self._delayed.update(meta.delayed)
        self._load_errors.update(meta.unfilled)
        self._fail_stale(meta)

    def _fail_stale(self, meta: SariaMetadata) -> None:
        """Fails, without a copy, every transfer of the step whose slots the
        worker may not use: another server boot's or session's (a restart or
        a lease that ran out between the prepare and this step: those slots
        now hold other blocks), any when the server's pool could not be
        mapped, and any when the session's fence is gone (the server ended
        it). The rest run under the fence, held until no copy is in flight.
        A load's KV blocks go to vLLM as load errors (recomputed); a store
        is reported failed."""
        ops = meta.loads + meta.stores
        self._stale = {t.op_id for t in ops
                       if self.copier is None or t.epoch != meta.server_epoch}
        if len(self._stale) < len(ops) and not self._fence.hold(meta.server_fence):
            self._stale = {t.op_id for t in ops}
        if not self._stale:
            return
        log.warning("saria: %d op(s) name slots this worker may no longer use (the cache "
                    "server restarted, is gone, or ended the session): failing them",
                    len(self._stale))
        for t in meta.loads:
            if t.op_id in self._stale:
                self._load_failed(t)
                if self.geo.async_loads:
                    self._recving.add(t.req_id)
        for op_id in self._stale:
            self._done.failed[op_id] += 1

    def start_load_kv(self, meta: SariaMetadata) -> None:
        self._begin(meta)
        loads = [t for t in meta.loads if t.op_id not in self._stale]
        if not loads:
            return
        self._check_states_loaded(meta)
        dram = [t for t in loads if t.kind == DRAM_TO_KV]
        ssd = [t for t in loads if t.kind == SSD_TO_KV]
        if ssd and self.coordinator.reader is None:
            raise RuntimeError("saria: the scheduler sent SSD reads to a worker with no SSD tier")
        self._loads = loads
        self._step = self.coordinator.run(dram, ssd)

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self._step is None:  # no load this step: return at once (every layer asks)
            return
        layer = self.copier.pages.name_index.get(layer_name) if self.copier else None
        if layer is None:
            return
        self._step.layer_ready(layer)

    def save_kv_layer(self, meta: SariaMetadata, layer_name: str) -> None:
        self._begin(meta)
        if not meta.stores:  # nothing to copy out this step (most decode steps)
            return
        layer = self.copier.pages.name_index.get(layer_name) if self.copier else None
        if layer is not None:
            self._submit_stores(layer)

    def wait_for_save(self, meta: SariaMetadata) -> None:
        """Queues what no ``save_kv_layer`` call covered this step; does not wait."""
        self._begin(meta)
        if meta.stores:
            for layer in range(self.geo.num_layers):
                self._submit_stores(layer)
        if meta.states:
            self._store_states(meta)
        self._finish_loads()

    def handle_preemptions(self, meta: SariaMetadata) -> None:
        """A preempted request's blocks may be reused this step: finish its
        pending store copies first (only its own: the others keep running)."""
        self._begin(meta)
        self._load_states(meta)  # vLLM's first call of the step (see _load_states)
        gone = set(meta.preempted)
        for t, futs in list(self._pending.values()):
            if t.req_id in gone:
                for f in futs:
                    f.exception()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        done = None
        if self._pending:
            self._collect_stores()
        elif self._fence.holding:
            self._release_fence()
        if self._delayed:
            busy = {t.req_id for t, _ in self._pending.values()}
            done = {r for r in self._delayed if r not in busy}
            self._delayed -= done
        recving, self._recving = self._recving, set()
        return (done or None), (recving or None)

    def get_transfer_results(self, finished_req_ids: set[str]):
        """``get_finished`` with the async loads that failed (every rank
        reports each async load it ran, failed or not, in the same step)."""
        sending, recving = self.get_finished(finished_req_ids)
        failed, self._failed_recving = self._failed_recving, set()
        return _transfer_results()(finished_sending=set(sending or ()),
                                          finished_recving=set(recving or ()),
                                          failed_recving=failed)

    def get_block_ids_with_load_errors(self) -> set[int]:
        out, self._load_errors = self._load_errors, set()
        return out

    def build_worker_meta(self) -> SariaWorkerMetadata | None:
        if self._pending:
            self._collect_stores()
        elif self._fence.holding:
            self._release_fence()
        if not (self._done.done or self._done.failed):
            return None  # nothing to report: no new object either
        out, self._done = self._done, SariaWorkerMetadata()
        return out

    def take_stats(self):
        c = self.coordinator
        # vLLM asks every step: nothing moved since the last answer, nothing to say
        mark = (self.bytes_stored, tuple(c.totals.values()) if c is not None else ())
        if mark == self._stats_mark:
            return None
        self._stats_mark = mark
        now = {"bytes_stored": self.bytes_stored}
        if c is not None:
            t = c.totals
            now.update(bytes_loaded_dram=t["dram_bytes"], bytes_loaded_ssd=t["ssd_bytes"],
                       load_dram_us=t["dram_us"], load_ssd_us=t["ssd_us"], load_us=t["load_us"],
                       ssd_read_failures_worker=t["ssd_blocks_failed"])
            if c.reader is not None:
                now["ssd_drive_bytes_read"] = c.reader.bytes_read  # this rank's, headers included
        return self._deltas.take(now)

    # --------------------------------------------------------------- helpers

    def _map_server_pool(self, server_pool: tuple[str, tuple[str, ...]]) -> None:
        """Maps the cache server's pool (at the first step, and again after
        the server restarted with a new one); ops of the old pool's boot are
        failed, never run against the new one (``_fail_stale``). A pool file
        that is gone (the server stopped or restarted since the scheduler
        named it) leaves nothing mapped: the step's ops fail, vLLM
        recomputes, and the next step's metadata is tried again."""
        path, dirs = server_pool
        if self.copier is not None:
            self.shutdown_movers()
        self.copier, self.coordinator, self._server_pool = None, None, None
        try:
            # the scheduler checked them at hello; check again where the mapping happens
            # (a pool refused as unsafe is never mapped: its ops fail like a gone one's)
            self.cfg.client_security().check_hello({"pool": path, "ssd_dirs": dirs})
            size = os.path.getsize(path)
            self.pool = DramPool(size // self.geo.slot_bytes, self.geo.slot_bytes, shared=path,
                                 prefault=False)
        except (FileNotFoundError, OSError, SariaError) as e:
            log.warning("saria: cannot map the cache server's pool %s (%s); this step's "
                        "copies fail and vLLM recomputes", path, e)
            return
        self.ssd_dirs = tuple(dirs)
        self._server_pool = server_pool
        self._attach()

    def _check_pool(self, meta: SariaMetadata) -> None:
        if self._checked_pool or meta.pool_id is None:
            return
        if meta.pool_id != self.pool.shared_id:
            raise RuntimeError("saria: the worker and the scheduler map different DRAM pools "
                               f"({self.pool.shared_id} vs {meta.pool_id}); the worker must "
                               "start before the scheduler, as vLLM does")
        self._checked_pool = True

    def _submit_stores(self, layer: int) -> None:
        """Queues the step's store copies of `layer`, once per step."""
        if layer in self._saved_layers:
            return
        self._saved_layers.add(layer)
        for t in self._meta.stores:
            if t.op_id in self._stale:
                continue  # failed at the step's start (another pool's slots)
            f = self.copier.submit(t, layer)
            self._pending.setdefault(t.op_id, (t, []))[1].append(f)

    def _collect_stores(self) -> None:
        for op_id, (t, futs) in list(self._pending.items()):
            if len(futs) < self.geo.num_layers or not all(f.done() for f in futs):
                continue
            del self._pending[op_id]
            if self._report(t.op_id, futs, "storing"):
                self.bytes_stored += len(t) * self.geo.rank_bytes
        self._release_fence()

    def _release_fence(self) -> None:
        """Drops the session's fence once no copy is in flight."""
        if self._fence.holding and not self._pending and self._step is None:
            self._fence.release()

    def _finish_loads(self) -> None:
        """Ends the step's loads: every layer in place, then each op reported
        done (with the SSD handles that failed their read) or failed."""
        step, loads = self._step, self._loads
        self._step, self._loads = None, []
        if step is None:
            return
        step.finish()
        bad: dict[int, list[int]] = defaultdict(list)
        for t, kv_ids, handles in step.failed:
            self._load_failed(t, kv_ids)  # vLLM recomputes them
            bad[t.op_id].extend(handles)
        if self.geo.async_loads:
            self._recving.update(t.req_id for t in loads)
        for t in loads:  # a checkpoint whose SSD read failed: its handles, and the request
            handles = self._state_bad.pop(t.op_id, None)
            if handles is not None:
                bad[t.op_id].extend(handles)
                self._failed_recving.add(t.req_id)
        for op_id in dict.fromkeys(t.op_id for t in loads):
            err = step.errors.get(op_id) or self._state_errors.pop(op_id, None)
            if err is not None:
                log.error("saria: loading op %d failed: %s", op_id, err)
                for t in loads:
                    if t.op_id == op_id:
                        self._load_failed(t)
                self._done.failed[op_id] += 1
                continue
            self._done.done[op_id] += 1
            if bad.get(op_id):
                self._done.bad_ssd[op_id] = sorted(bad[op_id])
        self._release_fence()

    def _load_failed(self, t: Transfer, kv_ids=None) -> None:
        """Load transfer `t` (its blocks `kv_ids`, default all) did not land:
        vLLM recomputes them -- with several KV-cache groups the whole
        request, an async load's failure (``Geometry.async_loads``)."""
        if self.geo.async_loads:
            self._failed_recving.add(t.req_id)
        else:
            self._load_errors.update(t.dst_ids if kv_ids is None else kv_ids)

    def _load_states(self, meta: SariaMetadata) -> None:
        """Checkpoints into the state blocks, from ``handle_preemptions``: vLLM
        calls it before it prepares the step's inputs, and in align mode that
        preparation copies a request's boundary state into its running block
        (``preprocess_mamba``) -- ``start_load_kv`` comes after that copy, too
        late. A failed load fails its load op (vLLM recomputes)."""
        if self._states_loaded is meta:
            return
        self._states_loaded = meta
        for c in meta.states:
            if c.dst != Medium.KV:
                continue
            try:
                if not self.states.load(c):  # reported like a KV block's failed read
                    self._state_bad[c.op_id] = list(c.ids)
            except Exception as e:  # noqa: BLE001 -- reported as a failed op, recomputed
                self._state_errors[c.op_id] = f"checkpoint load: {e}"

    def _check_states_loaded(self, meta: SariaMetadata) -> None:
        """A step whose checkpoints were not loaded before its inputs were
        prepared (no ``handle_preemptions`` call) must not use them: its load
        ops fail (vLLM recomputes) rather than run on a stale state."""
        if self._states_loaded is meta:
            return
        for c in meta.states:
            if c.dst == Medium.KV:
                self._state_errors[c.op_id] = "checkpoint not loaded before the step's inputs"

    def _store_states(self, meta: SariaMetadata) -> None:
        """This step's boundary states into their checkpoints' DRAM slots
        (the forward that computed them is done)."""
        for c in meta.states:
            if c.src != Medium.KV:
                continue
            try:
                self.states.store(c)
                self._done.done[c.op_id] += 1
            except Exception as e:  # noqa: BLE001 -- the checkpoint is dropped
                log.error("saria: storing checkpoint op %d failed: %s", c.op_id, e)
                self._done.failed[c.op_id] += 1

    def _report(self, op_id: int, futs: list[Future], what: str) -> bool:
        """Waits for an op's copies and records it done or failed for the
        scheduler; True when every copy succeeded."""
        err = next((e for e in (f.exception() for f in futs) if e is not None), None)
        if err is not None:
            log.error("saria: %s op %d failed: %s", what, op_id, err)
            self._done.failed[op_id] += 1
            return False
        self._done.done[op_id] += 1
        return True


@functools.cache
def _transfer_results():
    """vLLM's ``KVConnectorTransferResults`` (imported once, off the step path)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults

    return KVConnectorTransferResults
