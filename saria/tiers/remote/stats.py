"""What the cluster tier did: counters and call latencies, for status pages.

``RemoteStats`` is filled by ``RemoteTier`` (and its guard's outcomes) and
read as one plain dict (``snapshot``) by ``saria status``, the Prometheus
endpoint and the benches. Latencies keep the last ``window`` calls per
operation; percentiles are over those.
"""

from __future__ import annotations

import threading
from collections import Counter, deque

import numpy as np

__all__ = ["RemoteStats"]


class RemoteStats:
    """Thread-safe counters (``add``) and per-operation latencies (``observe``)."""

    def __init__(self, window: int = 4096) -> None:
        self._lock = threading.Lock()
        self.counters: Counter[str] = Counter()
        self._window = window
        self._latency: dict[str, deque[float]] = {}

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                if n:
                    self.counters[name] += int(n)

    def observe(self, op: str, seconds: float) -> None:
        with self._lock:
            q = self._latency.get(op)
            if q is None:
                q = self._latency[op] = deque(maxlen=self._window)
            q.append(float(seconds))

    def latency(self, op: str) -> dict[str, float]:
        """p50 / p99 / max seconds of ``op``'s recent calls ({} if none)."""
        with self._lock:
            q = self._latency.get(op)
            values = np.array(q if q else (), dtype=np.float64)
        if not values.size:
            return {}
        p50, p99 = np.percentile(values, [50, 99])
        return {"calls": int(values.size), "p50_s": float(p50), "p99_s": float(p99),
                "max_s": float(values.max())}

    def snapshot(self) -> dict:
        with self._lock:
            counters = dict(self.counters)
            ops = list(self._latency)
        return {"counters": counters, "latency": {op: self.latency(op) for op in ops}}
