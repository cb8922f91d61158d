"""Worker side: copies whole KV pages between vLLM's KV cache and the shared
DRAM pool, layer by layer, beside the forward pass.

The worker holds no index and makes no decision: each step's ``SariaMetadata``
names the copies (see ``meta.py``). Loads run before the forward (saria's loads
are synchronous in vLLM's sense) and each layer waits only for its own pages
(``wait_for_layer_load``); stores are queued as each layer finishes
(``save_kv_layer``) and are *not* waited for at the end of the step: the
scheduler learns they are done from ``build_connector_worker_meta`` and keeps
a finished request's blocks allocated (``request_finished`` -> delay) until
``get_finished`` reports them.

Copies run in submission order, so a load never overtakes the store of the
same slot. On CUDA one copy thread drives per-block async copies between the
pinned pool and device memory on a side stream, beside the compute stream. On
CPU the copies (torch ``index_select`` / ``index_copy_``) run inline in the
calling thread: measured on 2 cores, handing them to a thread cost more (9-18
ms per 256-token batch on a tiny model) than it overlapped, since the copy
and the forward compete for the same cores anyway.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from saria.connector.config import ConnectorConfig
from saria.connector.layout import Geometry, pool_path
from saria.connector.meta import CopyOp, SariaMetadata, SariaWorkerMetadata
from saria.connector.stats import Deltas
from saria.tiers.dram import DramPool

log = logging.getLogger("saria.connector")


class KVPages:
    """vLLM's per-layer KV tensors seen as ``[num_blocks, page_bytes]`` pages."""

    def __init__(self, kv_caches: dict[str, torch.Tensor], geo: Geometry) -> None:
        self.layers: list[torch.Tensor] = []
        missing = [n for n in geo.layer_names if n not in kv_caches]
        if missing:
            raise RuntimeError(f"saria: vLLM registered no KV cache for layer {missing[0]}")
        for name in geo.layer_names:
            t = kv_caches[name]
            if t.stride(-1) != 1:
                raise RuntimeError(f"saria: KV cache of {name} has a strided last dimension")
            dims = [d for d, n in enumerate(t.shape) if n == geo.num_gpu_blocks]
            if not dims:
                raise RuntimeError(f"saria: KV cache of {name} (shape {tuple(t.shape)}) has no "
                                   f"dimension of {geo.num_gpu_blocks} blocks")
            blocks = t.view(torch.uint8).movedim(dims[0], 0)
            if blocks[0].numel() != geo.page_bytes:
                raise RuntimeError(f"saria: a block of {name} holds {blocks[0].numel()} B, "
                                   f"the KV spec says {geo.page_bytes} B")
            self.layers.append(blocks)
        self.device = self.layers[0].device if self.layers else torch.device("cpu")
        self.name_index = {n: i for i, n in enumerate(geo.layer_names)}


class Copier:
    """Runs page copies for one layer at a time, in submission order."""

    def __init__(self, pages: KVPages, pool: DramPool, geo: Geometry) -> None:
        self.pages = pages
        self.geo = geo
        self.pool_t = torch.from_numpy(pool.array)  # (slots, slot_bytes) uint8, shared
        self.base = geo.tp_rank * geo.rank_bytes
        self.cuda = pages.device.type == "cuda"
        self.stream = torch.cuda.Stream(pages.device) if self.cuda else None
        self._exec = ThreadPoolExecutor(1, thread_name_prefix="saria-copy")
        self.bytes_loaded = 0
        self.bytes_stored = 0

    def _pool_layer(self, layer: int) -> torch.Tensor:
        off = self.base + layer * self.geo.page_bytes
        return self.pool_t[:, off: off + self.geo.page_bytes]

    def submit(self, op: CopyOp, layer: int, load: bool) -> Future:
        if self.cuda:
            return self._exec.submit(self._copy, op, layer, load)
        f: Future = Future()  # inline (see the module doc); failures travel in the future
        try:
            self._copy(op, layer, load)
            f.set_result(None)
        except Exception as e:  # noqa: BLE001 -- reported as a failed op, recomputed
            f.set_exception(e)
        return f

    def _copy(self, op: CopyOp, layer: int, load: bool) -> None:
        blocks = self.pages.layers[layer]
        pool = self._pool_layer(layer)
        n = len(op.block_ids)
        if self.cuda:
            self._copy_cuda(op, blocks, pool, load)
        else:
            ids = torch.tensor(op.block_ids, dtype=torch.long)
            slots = torch.tensor(op.slots, dtype=torch.long)
            if load:
                src = pool.index_select(0, slots).view(n, *blocks.shape[1:])
                blocks.index_copy_(0, ids, src)
            else:
                pool.index_copy_(0, slots, blocks.index_select(0, ids).reshape(n, -1))
        nbytes = n * self.geo.page_bytes
        if load:
            self.bytes_loaded += nbytes
        else:
            self.bytes_stored += nbytes

    def _copy_cuda(self, op: CopyOp, blocks: torch.Tensor, pool: torch.Tensor,
                   load: bool) -> None:
        # The pool is pinned (cudaHostRegister), so these are true async DMA copies.
        with torch.cuda.stream(self.stream):
            for b, s in zip(op.block_ids, op.slots):
                if load:
                    blocks[b].copy_(pool[s].view(blocks.shape[1:]), non_blocking=True)
                else:
                    pool[s].copy_(blocks[b].reshape(-1), non_blocking=True)
            self.stream.synchronize()

    def close(self) -> None:
        self._exec.shutdown(wait=True)


def open_shared_pool(cfg: ConnectorConfig, vllm_config, geo: Geometry) -> DramPool:
    """Creates or attaches the engine's shared DRAM pool; a pool that cannot
    be made is a ``dram_bytes`` error (tmpfs too small, as in a container with
    the default 64 MB /dev/shm)."""
    import os

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
        self.pool = open_shared_pool(cfg, vllm_config, geo)
        self.copier: Copier | None = None
        self._checked_pool = False
        self._load_futs: dict[int, list[Future]] = defaultdict(list)  # layer -> its loads
        self._saved_layers: set[int] = set()  # layers whose stores this step are queued
        self._pending: dict[int, tuple[CopyOp, list[Future]]] = {}  # store op id -> futures
        self._loads_in_flight: list[tuple[CopyOp, list[Future]]] = []
        self._done = SariaWorkerMetadata()
        self._load_errors: set[int] = set()
        self._delayed: set[str] = set()
        self._meta: SariaMetadata | None = None  # the step's metadata, once begun
        self._deltas = Deltas()

    # ------------------------------------------------------------ lifecycle

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self.copier = Copier(KVPages(kv_caches, self.geo), self.pool, self.geo)
        log.info("saria worker: %d layers, %d B pages, pool %d slots of %d B (%s, %s)",
                 self.geo.num_layers, self.geo.page_bytes, self.pool.num_slots,
                 self.pool.slot_bytes, "pinned" if self.pool.pinned else "not pinned",
                 self.copier.pages.device)

    def shutdown(self) -> None:
        if self.copier is not None:
            self.copier.close()
        self.pool.unlink()

    # -------------------------------------------------------------- per step

    def _begin(self, meta: SariaMetadata) -> None:
        """First call of a step (vLLM calls start_load_kv before or after the
        forward, so any of the step's calls may come first)."""
        if meta is self._meta:
            return
        self._meta = meta
        self._check_pool(meta)
        self._saved_layers.clear()
        self._delayed.update(meta.delayed)

    def start_load_kv(self, meta: SariaMetadata) -> None:
        self._begin(meta)
        for op in meta.loads:
            futs = []
            for layer in range(self.geo.num_layers):
                f = self.copier.submit(op, layer, load=True)
                self._load_futs[layer].append(f)
                futs.append(f)
            self._loads_in_flight.append((op, futs))

    def wait_for_layer_load(self, layer_name: str) -> None:
        layer = self.copier.pages.name_index.get(layer_name) if self.copier else None
        if layer is None:
            return
        for f in self._load_futs.pop(layer, ()):
            f.exception()  # wait; failures are collected in _finish_loads

    def save_kv_layer(self, meta: SariaMetadata, layer_name: str) -> None:
        self._begin(meta)
        layer = self.copier.pages.name_index.get(layer_name) if self.copier else None
        if layer is not None:
            self._submit_stores(layer)

    def wait_for_save(self, meta: SariaMetadata) -> None:
        """Queues what no ``save_kv_layer`` call covered this step; does not wait."""
        self._begin(meta)
        for layer in range(self.geo.num_layers):
            self._submit_stores(layer)
        self._finish_loads()

    def handle_preemptions(self, meta: SariaMetadata) -> None:
        """A preempted request's blocks may be reused this step: finish its
        pending store copies first (only its own: the others keep running)."""
        gone = set(meta.preempted)
        for op, futs in list(self._pending.values()):
            if op.req_id in gone:
                for f in futs:
                    f.exception()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, None]:
        self._collect_stores()
        busy = {op.req_id for op, _ in self._pending.values()}
        done = {r for r in self._delayed if r not in busy}
        self._delayed -= done
        return (done or None), None

    def get_block_ids_with_load_errors(self) -> set[int]:
        out, self._load_errors = self._load_errors, set()
        return out

    def build_worker_meta(self) -> SariaWorkerMetadata | None:
        self._collect_stores()
        out, self._done = self._done, SariaWorkerMetadata()
        return out if (out.done or out.failed) else None

    def take_stats(self):
        c = self.copier
        return self._deltas.take({"bytes_loaded": c.bytes_loaded if c else 0,
                                  "bytes_stored": c.bytes_stored if c else 0})

    # --------------------------------------------------------------- helpers

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
        for op in self._meta.stores:
            f = self.copier.submit(op, layer, load=False)
            self._pending.setdefault(op.op_id, (op, []))[1].append(f)

    def _collect_stores(self) -> None:
        for op_id, (op, futs) in list(self._pending.items()):
            if len(futs) < self.geo.num_layers or not all(f.done() for f in futs):
                continue
            del self._pending[op_id]
            self._report(op, futs, "storing")

    def _finish_loads(self) -> None:
        for op, futs in self._loads_in_flight:
            if not self._report(op, futs, "loading"):
                self._load_errors.update(op.block_ids)  # vLLM recomputes them
        self._loads_in_flight = []
        self._load_futs.clear()

    def _report(self, op: CopyOp, futs: list[Future], what: str) -> bool:
        """Waits for an op's layer copies and records it done or failed for
        the scheduler; True when every layer's copy succeeded."""
        err = next((e for e in (f.exception() for f in futs) if e is not None), None)
        if err is not None:
            log.error("saria: %s op %d failed: %s", what, op.op_id, err)
            self._done.failed[op.op_id] += 1
            return False
        self._done.done[op.op_id] += 1
        return True
