"""The scheduler connector's cache when a ``saria serve`` owns it.

``ServerCache`` gives ``SariaScheduler`` the calls it makes of an in-process
``TieredCache``, over a ``saria.serve.client.RemoteCache``, with the engine's
failure rule: the server is an accelerator, never a dependency. A call that
misses its deadline or that the server refuses is a miss (lookups find
nothing, stores store nothing, completions are dropped) -- the engine
recomputes and keeps serving. A missed deadline opens the client's breaker:
no call leaves the engine's step until a background probe gets a reply
(figures come from the last answer meanwhile); the client then says hello by
itself if the server restarted (a new boot: new pool, new session).

Counters are this engine's view (``stats``: hits it was served, blocks it
stored); the server's own endpoint has the node's figures. KV events are not
published through a server yet (``take_events`` is empty): several engines
would announce the same blocks.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from saria.core import CacheStats
from saria.errors import SariaError
from saria.serve.client import (RemoteCache, RemoteLoadSpec, RemotePlan, RemoteStoreSpec,
                                ServerUnavailable)

log = logging.getLogger("saria.connector")

_EMPTY = np.zeros(0, np.int64)


def server_layout(geo, cfg) -> dict:
    """The layout fingerprint a hello carries (``saria.serve.server.LAYOUT_FIELDS``)."""
    return {"model": geo.model, "dtype": geo.dtype, "block_size": geo.block_size,
            "page_bytes": geo.page_bytes, "num_layers": geo.num_layers, "tp_size": geo.tp_size,
            "kv_layout": geo.kv_layout, "hash_algo": cfg.hash_algo, "hash_seed": cfg.hash_seed,
            "slot_bytes": geo.slot_bytes}


class ServerCache:
    def __init__(self, cfg, geo, vllm_config) -> None:
        par = vllm_config.parallel_config
        dp = getattr(par, "data_parallel_index", None)
        if dp is None:
            dp = getattr(par, "data_parallel_rank", 0)
        self.client = RemoteCache(cfg.server, server_layout(geo, cfg),
                                  name=f"{cfg.engine_name}-dp{dp}", dp_rank=int(dp), tp_rank=0,
                                  timeout_s=cfg.server_timeout_s, start_s=cfg.server_start_s,
                                  security=cfg.client_security())
        self.stats = CacheStats()
        self.failures = 0
        self._gauges: dict[str, float] = {}  # the last answer: figures while the server is down
        self._last_warning = 0.0

    # --------------------------------------------------------- what workers map

    @property
    def pool_path(self) -> str | None:
        return self.client.info.get("pool")

    @property
    def fence_path(self) -> str:
        """The session's fence file its workers hold while copying (saria.serve.fence)."""
        return self.client.info.get("fence", "")

    @property
    def ssd_dirs(self) -> tuple[str, ...]:
        return tuple(self.client.info.get("ssd_dirs", ()))

    @property
    def staging_slots(self) -> int:
        return self.client.staging_slots

    @property
    def reachable(self) -> bool:
        """False while the client's breaker is open (the server missed a deadline)."""
        return not self.client.breaker.is_open

    # ----------------------------------------------------------------- verbs

    def lookup(self, keys):
        self.stats.lookups += 1
        return self._guard(self.client.lookup, RemotePlan(0), keys)

    def touch(self, keys, *, hits: int, checkpoint_at: int = 0) -> int:
        return self._guard(self.client.touch, 0, keys, hits=hits, checkpoint_at=checkpoint_at)

    def prepare_load(self, keys, blocks: int, *, start: int = 0):
        none = RemoteLoadSpec(keys[:0], 0, _EMPTY, _EMPTY)
        return self._guard(self.client.prepare_load, none, keys, blocks, start=start)

    def complete_load(self, spec, failed=None) -> int:
        served = self._guard(self.client.complete_load, 0, spec, failed)
        dram, ssd = spec.hits(served)
        self.stats.hit_blocks["DRAM"] += dram
        self.stats.hit_blocks["SSD"] += ssd
        return served

    def cancel_load(self, spec) -> None:
        self._guard(self.client.cancel_load, None, spec)

    def prepare_store(self, keys, start: int = 0, *, session: int = 0, direct: bool = False):
        none = RemoteStoreSpec.of(keys, _EMPTY, _EMPTY, -1, "")
        return self._guard(self.client.prepare_store, none, keys, start, session=session,
                           direct=direct)

    def prepare_promotion(self, keys, ssd_positions, dram_blocks: int):
        none = RemoteStoreSpec.of(keys, _EMPTY, _EMPTY, -1, "", promotion=True)
        return self._guard(self.client.prepare_promotion, none, keys, ssd_positions, dram_blocks)

    def complete_store(self, spec, *, success: bool = True) -> int:
        n = self._guard(self.client.complete_store, 0, spec, success=success)
        if success and spec.spec >= 0:
            key = "promoted_blocks" if spec.promotion else "stored_blocks"
            setattr(self.stats, key, getattr(self.stats, key) + int(n or 0))
        return n

    def write_direct(self, chain, positions, staging) -> int:
        return self._guard(self.client.write_direct, 0, chain, positions, staging)

    def take_staging(self, count: int):
        return self._guard(self.client.take_staging, _EMPTY, count)

    def release_staging(self, slots) -> None:
        self._guard(self.client.release_staging, None, slots)

    def take_events(self):
        return []

    def gauges(self) -> dict[str, float]:
        g = self._guard(self.client.gauges, None)
        if g is not None:
            self._gauges = g
        return dict(self._gauges)

    def flush(self) -> None:
        self._guard(self.client.flush, None)

    def close(self) -> None:
        self.client.close()

    # ---------------------------------------------------------------- helpers

    def _guard(self, fn, default, *args, **kw):
        try:
            return fn(*args, **kw)
        except ServerUnavailable:  # the client's breaker logs its opening and closing
            self.failures += 1
            return default
        except SariaError as e:  # ServerUnavailable, RemoteError, ProtocolError
            self.failures += 1
            now = time.monotonic()
            if now - self._last_warning > 10:
                self._last_warning = now
                log.warning("saria: the cache server failed a call (%s); this engine recomputes "
                            "meanwhile (%d failed calls so far)", e, self.failures)
            return default
