"""``SariaConnector``: saria as a vLLM v1 KV connector.

    KVTransferConfig(kv_connector="SariaConnector",
                     kv_connector_module_path="saria.connector.vllm",
                     kv_role="kv_both",
                     kv_connector_extra_config={"dram_bytes": "32GB",
                                                "ssd_dirs": ["/nvme0/kv"],
                                                "ssd_bytes": "2TB"})

With saria installed, ``kv_connector="SariaConnector"`` alone also works: the
``vllm.general_plugins`` entry point registers the name in every vLLM process.

One instance per role: the SCHEDULER instance (``scheduler.py``) owns the
index, policies and tiers; each WORKER instance (``worker.py``) copies pages
between its KV cache and the shared DRAM pool. Settings: ``config.py``.
Set ``kv_load_failure_policy="recompute"`` as well: saria already turns a
failed SSD read into a shorter hit, but a failed worker copy is reported to
vLLM as invalid blocks, which vLLM's default policy (``fail``) would turn into
a failed request instead of a recomputation.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1,
                                                                KVConnectorMetadata,
                                                                KVConnectorRole, SupportsHMA)
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from saria.connector.config import check_fits, parse_config
from saria.connector.layout import geometry
from saria.connector.meta import SariaMetadata
from saria.connector.stats import SariaKVConnectorStats, SariaPromMetrics
from saria.errors import ConfigError

log = logging.getLogger("saria.connector")

__all__ = ["SariaConnector", "register_vllm_plugin"]


class SariaConnector(KVConnectorBase_V1, SupportsHMA):
    _cache_hit_source = CacheHitSource.HOST

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        if kv_cache_config is None:
            raise RuntimeError("SariaConnector needs vLLM's kv_cache_config (vLLM >= 0.32)")
        self._scheduler = self._worker = None
        self._refused: str | None = None  # a worker's settings error, left to the scheduler
        rank = _tp_rank() if role == KVConnectorRole.WORKER else 0
        geo = geometry(vllm_config, kv_cache_config, rank=rank)
        try:
            self.cfg = parse_config(self._kv_transfer_config.kv_connector_extra_config)
            check_fits(self.cfg, geo.slot_bytes, geo.block_size)
        except ConfigError as e:
            if role == KVConnectorRole.WORKER:
                # Both checks are functions of the settings and the block size, which the
                # scheduler's instance sees alike: it refuses them, once, after the
                # workers start. A worker that raised too would add vLLM's tracebacks of
                # every rank (issue 43: five for one misspelt key).
                self._refused = str(e)
                return
            _refuse(e)
        if self._kv_transfer_config.kv_load_failure_policy != "recompute":
            log.warning("saria: kv_load_failure_policy is %r; set 'recompute' so that a failed "
                        "page copy is recomputed instead of failing the request",
                        self._kv_transfer_config.kv_load_failure_policy)
        if role == KVConnectorRole.SCHEDULER:
            from saria.connector.scheduler import SariaScheduler

            try:
                self._scheduler = SariaScheduler(self.cfg, vllm_config, geo, kv_cache_config)
            except ConfigError as e:
                _refuse(e)
            if self.cfg.metrics_port is not None:
                from saria.connector.stats import serve_prometheus

                srv = serve_prometheus(self._scheduler, self.cfg.metrics_port, self.cfg.metrics_host)
                self._scheduler.metrics_server = srv
                log.info("saria: metrics on http://%s:%d/metrics", self.cfg.metrics_host,
                         srv.server_port)
        else:
            from saria.connector.worker import SariaWorker

            self._worker = SariaWorker(self.cfg, vllm_config, geo)
        self.hook_clock = None
        if self.cfg.hook_timing:
            self._time_hooks(role)

    def _time_hooks(self, role) -> None:
        """``hook_timing``: every hook of this instance timed (``hooktime.py``);
        the step closes at ``build_connector_meta`` (scheduler) or
        ``get_transfer_results`` (worker), charged to the kind of its metadata."""
        from saria.connector.hooktime import SCHEDULER_HOOKS, WORKER_HOOKS, HookClock, step_kind

        sched = role == KVConnectorRole.SCHEDULER
        client = getattr(self._scheduler.cache, "client", None) if sched else None
        clock = self.hook_clock = HookClock(
            "scheduler" if sched else "worker",
            rpc_count=(lambda: sum(client.calls.values())) if client is not None else None)
        clock.wrap(self, SCHEDULER_HOOKS if sched else WORKER_HOOKS)
        if sched:  # the closing hook's own time is the step's too: close after it
            build = self.build_connector_meta

            def build_connector_meta(so):
                meta = build(so)
                clock.close_step(step_kind(meta))
                return meta

            self.build_connector_meta = build_connector_meta
            return
        results = self.get_transfer_results

        def get_transfer_results(finished_req_ids):
            # still bound: vLLM clears it after the output (the base class's accessors)
            meta = self._get_connector_metadata() if self.has_connector_metadata() else None
            out = results(finished_req_ids)
            clock.close_step(step_kind(meta) if isinstance(meta, SariaMetadata) else "idle")
            return out

        self.get_transfer_results = get_transfer_results

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a cache: nothing is lost when a block is not saved

    # ------------------------------------------------------------ scheduler

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        return self._scheduler.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output) -> None:
        self._scheduler.update_connector_output(connector_output)

    def request_finished(self, request, block_ids) -> tuple[bool, dict[str, Any] | None]:
        return self._scheduler.request_finished(request, block_ids)

    def request_finished_all_groups(self, request, block_ids) -> tuple[bool, dict[str, Any] | None]:
        # hybrid / sliding-window models (vLLM's hybrid KV cache manager on):
        # saria tracks each group's blocks itself (hybrid.py)
        return self._scheduler.request_finished(request, block_ids)

    def take_events(self):
        return self._scheduler.take_events() if self.cfg.events else ()

    # --------------------------------------------------------------- worker

    def register_kv_caches(self, kv_caches) -> None:
        if self._refused is None:  # refused: the scheduler stops the engine next
            self._worker.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context, **kwargs) -> None:
        if self._refused is not None:  # never reached: no step runs without a scheduler
            raise RuntimeError(f"saria: the connector's settings were refused: {self._refused}")
        self._worker.start_load_kv(self._meta())

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._worker.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs) -> None:
        self._worker.save_kv_layer(self._meta(), layer_name)

    def wait_for_save(self) -> None:
        self._worker.wait_for_save(self._meta())

    def handle_preemptions(self, kv_connector_metadata) -> None:
        # also where recurrent-state checkpoints are loaded (worker._load_states)
        if isinstance(kv_connector_metadata, SariaMetadata):
            self._worker.handle_preemptions(kv_connector_metadata)

    def get_finished(self, finished_req_ids):
        return self._worker.get_finished(finished_req_ids)

    def get_transfer_results(self, finished_req_ids):
        return self._worker.get_transfer_results(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.get_block_ids_with_load_errors()

    def build_connector_worker_meta(self):
        return self._worker.build_worker_meta()

    # ---------------------------------------------------------------- both

    def get_kv_connector_stats(self) -> SariaKVConnectorStats | None:
        side = self._scheduler or self._worker
        return side.take_stats() if side is not None else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None):
        return SariaKVConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return SariaPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self) -> None:
        side = self._scheduler or self._worker
        if side is not None:
            side.shutdown()

    def _meta(self) -> SariaMetadata:
        meta = self._get_connector_metadata()
        assert isinstance(meta, SariaMetadata), type(meta)
        return meta


def _refuse(e: ConfigError) -> None:
    """Stops the engine on a bad setting: in vLLM's engine process, one line
    in vLLM's log and a plain exit (vLLM's front end then says the engine
    failed, "see root cause above": that line); in the caller's own process
    (``LLM`` without multiprocessing), the error itself."""
    import multiprocessing

    if multiprocessing.parent_process() is None:
        raise e
    log.error("saria: bad setting in kv_connector_extra_config: %s", e)
    raise SystemExit(2) from None


def _tp_rank() -> int:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank()
    except Exception:  # noqa: BLE001 -- no TP group (single process): rank 0
        return 0


class _ToVllmLog(logging.Handler):
    """Hands saria's records to the ``vllm`` logger, whose handlers vLLM sets
    up when its engine starts (after plugins load): vLLM's format and stream."""

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger("vllm").handle(record)


def attach_to_vllm_log() -> None:
    """saria's log lines in vLLM's log, at INFO, once per process. Without
    this they went nowhere: ``saria.connector`` had no handler, and vLLM's
    root logger has none either."""
    saria_log = logging.getLogger("saria")
    if any(isinstance(h, _ToVllmLog) for h in saria_log.handlers):
        return
    saria_log.addHandler(_ToVllmLog())
    saria_log.setLevel(logging.INFO)
    saria_log.propagate = False  # once, not again through a root handler


def register_vllm_plugin() -> None:
    """``vllm.general_plugins`` entry point: makes ``kv_connector="SariaConnector"``
    work without ``kv_connector_module_path``."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    attach_to_vllm_log()
    if "SariaConnector" not in KVConnectorFactory._registry:
        KVConnectorFactory.register_connector("SariaConnector", "saria.connector.vllm",
                                              "SariaConnector")
