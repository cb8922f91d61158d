"""What ``saria serve`` counts, for its Prometheus endpoint and ``saria status``.

Per engine (the hello's ``name``): blocks looked up and blocks served from
DRAM, from the SSD and (``--remote``) from the cluster tier, in blocks and
bytes; per server: sessions (open
leases), leases expired, RPC count and latency (a histogram per op), and each
namespace's cache gauges (DRAM use, SSD free space, write budget).
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict



#: RPC latency histogram bounds, seconds
BUCKETS = (50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 100e-3, 1.0)


class ServerMetrics:
    def __init__(self, server) -> None:
        self.server = server
        self.expired = 0
        self.reaped = 0  # idle sessions ended for a hello at a full cap
        self.engines: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.rpcs: dict[str, list[int]] = defaultdict(lambda: [0] * (len(BUCKETS) + 1))
        self.rpc_sum: dict[str, float] = defaultdict(float)
        self.errors = 0
        self.specs_aged = 0  # specs ended by --max-lock-age
        self.namespaces_closed = 0  # by --namespace-idle
        self._http = None

    # ------------------------------------------------------------ counting

    def rpc(self, op: str, seconds: float, ok: bool) -> None:
        self.rpcs[op][bisect.bisect_left(BUCKETS, seconds)] += 1
        self.rpc_sum[op] += seconds
        self.errors += not ok

    def lookup(self, s, plan) -> None:
        self.engines[s.engine]["matched_blocks"] += plan.num_blocks

    def served(self, s, spec, served: int) -> None:
        slot = self.server.caches[s.namespace].backend.pool.slot_bytes
        e = self.engines[s.engine]
        dram, ssd = spec.hits(served)
        figures = [("dram", dram), ("ssd", ssd)]
        if self.server.cfg.remote is not None:  # fetched from the cluster tier, counted apart
            remote = spec.remote_hits(served)
            figures = [("dram", dram - remote), ("ssd", ssd), ("remote", remote)]
        for name, n in figures:
            e[f"{name}_hit_blocks"] += n
            e[f"{name}_hit_bytes"] += n * slot

    # ------------------------------------------------------------ reading

    def snapshot(self, tenant: str | None = None) -> dict:
        """Everything, as plain data (``stats`` op, ``saria status``); for a
        `tenant`, only its own engines and sessions (their names start with
        ``TENANT/``) -- no namespace gauges, RPC figures or other engines."""
        srv = self.server
        if tenant is not None:
            mine = f"{tenant}/"
            return {"boot": srv.boot, "address": srv.address, "tenant": tenant,
                    "sessions": sum(s.engine.startswith(mine) for s in srv.sessions.values()),
                    "leases_expired": 0, "sessions_reaped": 0, "rpc_errors": 0,
                    "engines": {k: dict(v) for k, v in self.engines.items()
                                if k.startswith(mine)},
                    "sessions_by_engine": dict(Counter(s.engine for s in srv.sessions.values()
                                                       if s.engine.startswith(mine))),
                    "namespaces": {}, "rpc": {}, "rpc_buckets_s": list(BUCKETS)}
        return {
            "boot": srv.boot, "address": srv.address, "sessions": len(srv.sessions),
            "sessions_fencing": len(srv.fencing),
            "leases_expired": self.expired, "sessions_reaped": self.reaped,
            "rpc_errors": self.errors,
            "engines": {k: dict(v) for k, v in self.engines.items()},
            "sessions_by_engine": dict(Counter(s.engine for s in srv.sessions.values())),
            "namespaces": {ns: {k: float(v) for k, v in c.gauges().items()}
                           for ns, c in srv.caches.items()},
            "rpc": {op: {"count": sum(b), "sum_s": self.rpc_sum[op], "buckets": list(b)}
                    for op, b in self.rpcs.items()},
            "rpc_buckets_s": list(BUCKETS),
            "loop_errors": getattr(srv, "loop_errors", 0), "specs_aged": self.specs_aged,
            "namespaces_closed": self.namespaces_closed,
            "peers_refused": srv.gate.refused if getattr(srv, "gate", None) else 0,
        }

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """The Prometheus endpoint on `host` (loopback unless told: per-engine
        figures tell who is served what)."""
        from prometheus_client import CollectorRegistry, start_http_server

        from saria.errors import ConfigError

        reg = CollectorRegistry()
        reg.register(_Collector(self))
        try:
            self._http, _ = start_http_server(port, addr=host, registry=reg)
        except OSError as e:
            raise ConfigError("metrics_port", f"cannot serve on port {port}: {e.strerror}") from None

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http = None


class _Collector:
    """Reads the server's figures at scrape time (the server loop is the
    only writer; a scrape sees a consistent-enough snapshot of counters)."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.m = metrics

    def collect(self):
        from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                            HistogramMetricFamily)

        snap = self.m.snapshot()
        g = GaugeMetricFamily("saria_serve_sessions", "open sessions (leases)")
        g.add_metric([], snap["sessions"])
        yield g
        c = CounterMetricFamily("saria_serve_leases_expired", "sessions ended by lease expiry")
        c.add_metric([], snap["leases_expired"])
        yield c
        c = CounterMetricFamily("saria_serve_sessions_reaped",
                                "idle sessions ended for a hello at a full session cap")
        c.add_metric([], snap["sessions_reaped"])
        yield c
        yield _by_two(CounterMetricFamily("saria_serve_engine", "per-engine blocks and bytes",
                                          labels=["engine", "figure"]), snap["engines"])
        yield _by_two(GaugeMetricFamily("saria_serve_cache", "per-namespace cache gauges",
                                        labels=["namespace", "gauge"]), snap["namespaces"])
        h = HistogramMetricFamily("saria_serve_rpc_seconds", "RPC latency", labels=["op"])
        for op, r in snap["rpc"].items():
            cum, buckets = 0, []
            for bound, n in zip([*map(str, BUCKETS), "+Inf"], r["buckets"]):
                cum += n
                buckets.append((bound, cum))
            h.add_metric([op], buckets, r["sum_s"])
        yield h


def _by_two(family, table: dict[str, dict[str, float]]):
    """A metric family labelled by a table's two keys (who, which figure)."""
    for who, figs in table.items():
        for k, v in figs.items():
            family.add_metric([who, k], v)
    return family
