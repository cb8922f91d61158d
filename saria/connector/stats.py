"""Metrics of the connector: vLLM's stats hooks and a Prometheus endpoint.

``SariaKVConnectorStats`` carries counter *increments* since the previous
call (vLLM sums the objects of a logging interval with ``aggregate``); the
scheduler side contributes the cache's counters, each worker its copy bytes.
``SariaPromMetrics`` turns them into ``vllm:saria_*`` counters on vLLM's own
``/metrics`` (``vllm serve``). ``serve_prometheus`` is the same data, plus
gauges (DRAM use, SSD free space, write-budget use), on a port of its own for
engines without vLLM's server (``metrics_port``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (KVConnectorPromMetrics,
                                                                   KVConnectorStats)

HELP = {
    "dram_hit_blocks": "blocks loaded from saria's DRAM tier",
    "ssd_hit_blocks": "blocks loaded from saria's SSD tier",
    "dram_hit_bytes": "bytes loaded from saria's DRAM tier",
    "ssd_hit_bytes": "bytes loaded from saria's SSD tier",
    "stored_blocks": "new blocks stored into DRAM",
    "promoted_blocks": "SSD hits kept in DRAM by promotion",
    "dram_evictions": "blocks evicted from DRAM",
    "ssd_evictions": "blocks evicted from the SSD",
    "ssd_write_blocks": "blocks written to the SSD",
    "ssd_write_failures": "SSD block writes that failed",
    "ssd_read_failures": "SSD block reads that failed (checksum, I/O)",
    "writes_dropped": "SSD writes dropped (queue full or no space)",
    "load_ops": "load copies sent to the workers",
    "store_ops": "store copies sent to the workers",
    "load_failures": "load copies the workers failed",
    "store_failures": "store copies the workers failed",
    "hit_tokens": "prompt tokens served by saria",
    "query_tokens": "prompt tokens looked up in saria",
    "promotion_ops": "promotions after prefill: SSD hits copied from KV pages into DRAM",
    "direct_ops": "write-through copies of blocks DRAM did not keep, through staging slots",
    "direct_dropped": "blocks of failed write-through copies (not written)",
    "delayed_frees": "finished requests whose block free waited for a store copy",
    "expired_ops": "copies not reported by every worker in op_timeout_s (loads failed, "
                   "stores quarantined until their last report)",
    "bytes_loaded_dram": "bytes the workers copied from the DRAM pool into the KV cache",
    "bytes_loaded_ssd": "bytes the workers read from the SSD for the KV cache",
    "load_dram_us": "microseconds the workers spent copying loads from DRAM",
    "load_ssd_us": "microseconds the workers' SSD reads of loads took",
    "load_us": "microseconds from the start of a step's loads to its last layer in place",
    "ssd_read_failures_worker": "SSD blocks a worker read that failed verification",
    "ssd_drive_bytes_read": "bytes the workers' SSD readers read from the drives (each rank only "
                            "its part of a block; headers and padding included)",
    "bytes_stored": "bytes the workers copied from the KV cache into the pool",
}


@dataclass
class SariaKVConnectorStats(KVConnectorStats):
    data: dict[str, Any] = field(default_factory=dict)

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> "SariaKVConnectorStats":
        for k, v in (other.data or {}).items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> dict[str, int | float]:
        return dict(self.data)

    def is_empty(self) -> bool:
        return not any(self.data.values())


def cumulative(sched) -> dict[str, int]:
    """The scheduler side's counters since start (cache, store, connector)."""
    c = sched.cache
    s = c.stats
    slot = sched.geo.slot_bytes
    out = {"dram_hit_blocks": s.hit_blocks["DRAM"], "ssd_hit_blocks": s.hit_blocks["SSD"],
           "dram_hit_bytes": s.hit_blocks["DRAM"] * slot,
           "ssd_hit_bytes": s.hit_blocks["SSD"] * slot,
           "stored_blocks": s.stored_blocks, "promoted_blocks": s.promoted_blocks,
           "dram_evictions": s.dram_evictions, "ssd_evictions": s.ssd_evictions,
           "ssd_write_blocks": s.ssd_write_blocks, "ssd_write_failures": s.ssd_write_failures,
           "ssd_read_failures": s.ssd_read_failures, "writes_dropped": s.writes_dropped}
    out.update(sched.counters)
    if sched.cfg.server is None:
        out.update(sched.drive_bytes.read(sched.cache))
    return out


class DriveBytes:
    """Per-drive bytes of an engine's own drives, read again only when the SSD
    traffic the cache counts moved: ``gauges`` takes the cache's lock and
    walks the store, and vLLM asks for stats every step -- a third of an idle
    step's connector time. (A server's drives are the node's: its own
    metrics say them, and asking would put an RPC on every decode step.)"""

    def __init__(self) -> None:
        self._mark: tuple | None = None
        self._bytes: dict[str, int] = {}

    def read(self, cache) -> dict[str, int]:
        s = cache.stats
        mark = (s.ssd_write_blocks, s.hit_blocks["SSD"], s.ssd_read_failures,
                s.ssd_write_failures, s.writes_dropped, s.stored_blocks)
        if mark != self._mark:
            self._mark = mark
            self._bytes = {k: int(v) for k, v in cache.gauges().items()
                           if k.startswith("ssd_bytes_") and k.rsplit("_", 1)[-1].startswith("drive")}
        return self._bytes


class Deltas:
    """Increments of a cumulative counter dict between calls."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}

    def take(self, now: dict[str, int]) -> SariaKVConnectorStats:
        d = {k: v - self._last.get(k, 0) for k, v in now.items()}
        self._last = dict(now)
        return SariaKVConnectorStats(data={k: v for k, v in d.items() if v})


def gauges(sched) -> dict[str, float]:
    """Occupancy of the cache's tiers, the SSD write budget in use, and the
    admission's own figures (``budget``: ``admission_budget_used``,
    ``admission_threshold``, ``admission_level`` ...)."""
    g = sched.cache.gauges()  # {} while a cache server does not answer
    out = {"dram_used_slots": g.get("dram_used_slots", 0.0), "dram_slots": g.get("dram_slots", 0.0)}
    out.update({k: v for k, v in g.items() if k.startswith("admission_")})
    if "ssd_slots" in g and sched.cfg.server is None:
        out.update(ssd_free_slots=g["ssd_free_slots"], ssd_slots=g["ssd_slots"],
                   ssd_failed_drives=g["ssd_failed_drives"])
        days = max(time.monotonic() - sched.started, 1.0) / 86400
        drives = len(sched.cfg.ssd_dirs)
        budget = sched.cfg.dwpd * sched.cfg.ssd_bytes * drives * days
        out["ssd_write_budget_used"] = g["ssd_bytes_written"] / budget if budget else 0.0
    return out


class SariaPromMetrics(KVConnectorPromMetrics):
    """``vllm:saria_<counter>`` counters on vLLM's own Prometheus registry."""

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters: dict[str, dict[int, Any]] = {}

    def _counter(self, key: str, engine_idx: int):
        per = self._counters.get(key)
        if per is None:
            c = self._counter_cls(name=f"vllm:saria_{key}", documentation=HELP.get(
                key, key.replace("_", " ")), labelnames=self._labelnames)
            per = self._counters[key] = {i: c.labels(*v) for i, v in
                                         self.per_engine_labelvalues.items()}
        return per[engine_idx]

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for k, v in transfer_stats_data.items():
            if isinstance(v, (int, float)) and v > 0:
                self._counter(k, engine_idx).inc(v)


def serve_prometheus(sched, port: int, host: str = "127.0.0.1"):
    """Serves the scheduler's metrics on ``http://host:port/metrics`` (port 0:
    one the OS picks); returns the server (``server_port`` is the port it got,
    ``shutdown()`` stops it)."""
    import weakref

    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    ref = weakref.ref(sched)  # the server thread must not keep the cache alive

    class _Collector:
        def collect(self):
            sched = ref()
            if sched is None:
                return
            for k, v in cumulative(sched).items():
                m = CounterMetricFamily(f"saria_{k}", HELP.get(k, k.replace("_", " ")))
                m.add_metric([], v)
                yield m
            for k, v in gauges(sched).items():
                m = GaugeMetricFamily(f"saria_{k}", k.replace("_", " "))
                m.add_metric([], v)
                yield m

    reg = CollectorRegistry()
    reg.register(_Collector())
    try:
        server, _ = start_http_server(port, addr=host, registry=reg)
        return server
    except OSError as e:
        from saria.errors import ConfigError

        raise ConfigError("metrics_port", f"cannot serve on {host}:{port}: {e.strerror}") from None
