"""Worker side: moves whole KV pages between vLLM's KV cache, the shared DRAM
pool and the SSD store, layer by layer, beside the forward pass.

The worker holds no index and makes no decision: each step's
``SariaMetadata`` names the transfers (see ``meta.py``), and the worker runs
each with the handler for its (source, destination) media:

* ``DRAM -> KV`` and ``KV -> DRAM`` (``PageCopier``): one layer's pages
  between pool slots and KV blocks. On CPU a native row copy in the calling
  thread (on 2 cores, handing copies to a thread cost more than it
  overlapped); on CUDA per-block async copies on a side stream from the
  page-locked pool.
* ``SSD -> KV`` (``SsdPageReader``): the worker opens the store's drive files
  read-only (O_DIRECT, through the native store, which verifies the header,
  the key and both checksums) and reads whole blocks, in chunks, into two
  aligned staging buffers on a background thread; while one chunk is read
  the previous one's pages of every layer go into the KV cache, so the copy
  hides behind the drive. A block that fails its read is
  reported (vLLM recomputes it; the scheduler drops the copy). On CUDA the
  staging buffer would be page-locked and a GPUDirect Storage handler
  (kvikio ``CuFile`` reads into a GPU staging buffer, then a scatter into the
  pages) plugs in here as another handler for the same media pair: not
  written yet, because no machine with a GPU has run it.

Loads run before the forward (saria's loads are synchronous in vLLM's sense):
a ``LoadCoordinator`` runs a step's DRAM copies and SSD reads as the
``coordinator`` setting says -- ``serial`` (DRAM, then SSD), ``overlap``
(both at once, DRAM at full speed) or ``paced`` (DRAM copies throttled by
``saria.transfer.paced_dram_rate`` while SSD reads are in flight, full speed
once they are done) -- and records bytes and seconds per source. Each layer
waits only for its own pages (``wait_for_layer_load``). Stores are queued as
each layer finishes (``save_kv_layer``) and not waited for at the end of the
step: the scheduler learns they are done from ``build_connector_worker_meta``
and keeps a finished request's blocks allocated until ``get_finished``
reports them.
"""

from __future__ import annotations

import logging
import os
import time
from collections import defaultdict, deque
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from saria.connector.config import ConnectorConfig
from saria.connector.layout import Geometry, pool_path
from saria.connector.meta import Medium, SariaMetadata, SariaWorkerMetadata, Transfer
from saria.connector.stats import Deltas
from saria.tiers.copy import copy_rows
from saria.tiers.dram import DramPool
from saria.transfer import LinkModel, paced_dram_rate

log = logging.getLogger("saria.connector")

DRAM_TO_KV, KV_TO_DRAM, SSD_TO_KV = ((Medium.DRAM, Medium.KV), (Medium.KV, Medium.DRAM),
                                     (Medium.SSD, Medium.KV))


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

    def page_rows(self, layer: int) -> torch.Tensor | None:
        """Layer `layer`'s pages as a 2-D ``[blocks, page_bytes]`` byte view
        (rows strided, bytes inside a page contiguous), or None when the
        layout keeps a page in several pieces (K and V apart)."""
        blocks = self.layers[layer]
        try:
            rows = blocks.view(blocks.shape[0], -1)
        except RuntimeError:
            return None
        return rows if rows.stride(1) == 1 else None


class PageCopier:
    """DRAM <-> KV page copies of one layer at a time, in submission order."""

    def __init__(self, pages: KVPages, pool: DramPool, geo: Geometry) -> None:
        self.pages = pages
        self.geo = geo
        self.pool_t = torch.from_numpy(pool.array)  # (slots, slot_bytes) uint8, shared
        self.base = geo.tp_rank * geo.rank_bytes
        self.cuda = pages.device.type == "cuda"
        self.stream = torch.cuda.Stream(pages.device) if self.cuda else None
        self._exec = ThreadPoolExecutor(1, thread_name_prefix="saria-copy")

    def pool_layer(self, layer: int) -> torch.Tensor:
        """This rank's page of `layer` in every slot: ``[slots, page_bytes]``."""
        off = self.base + layer * self.geo.page_bytes
        return self.pool_t[:, off: off + self.geo.page_bytes]

    def submit(self, t: Transfer, layer: int) -> Future:
        if self.cuda:
            return self._exec.submit(self.copy, t, layer)
        f: Future = Future()  # inline (see the module doc); failures travel in the future
        try:
            self.copy(t, layer)
            f.set_result(None)
        except Exception as e:  # noqa: BLE001 -- reported as a failed op, recomputed
            f.set_exception(e)
        return f

    def copy(self, t: Transfer, layer: int) -> int:
        """Copies one layer of `t`; returns the bytes moved."""
        load = t.kind == DRAM_TO_KV
        kv_ids, slots = (t.dst_ids, t.src_ids) if load else (t.src_ids, t.dst_ids)
        blocks, pool = self.pages.layers[layer], self.pool_layer(layer)
        if self.cuda:
            # The pool is page-locked (cudaHostRegister): true async DMA copies.
            with torch.cuda.stream(self.stream):
                for b, s in zip(kv_ids, slots):
                    if load:
                        blocks[b].copy_(pool[s].view(blocks.shape[1:]), non_blocking=True)
                    else:
                        pool[s].copy_(blocks[b].reshape(-1), non_blocking=True)
                self.stream.synchronize()
            return len(kv_ids) * self.geo.page_bytes
        rows = self.pages.page_rows(layer)
        if rows is None:  # a page in pieces: torch gathers it
            ids = torch.tensor(kv_ids, dtype=torch.long)
            idx = torch.tensor(slots, dtype=torch.long)
            if load:
                blocks.index_copy_(0, ids, pool.index_select(0, idx).view(len(ids), *blocks.shape[1:]))
            else:
                pool.index_copy_(0, idx, blocks.index_select(0, ids).reshape(len(ids), -1))
        elif load:
            copy_rows(rows, kv_ids, pool, slots)
        else:
            copy_rows(pool, slots, rows, kv_ids)
        return len(kv_ids) * self.geo.page_bytes

    def close(self) -> None:
        self._exec.shutdown(wait=True)


class SsdPageReader:
    """SSD -> KV: whole blocks read (verified) in chunks into two staging
    buffers; while one chunk is read, the previous one's pages of every layer
    go into the KV cache, so the copy hides behind the drive."""

    def __init__(self, dirs: tuple[str, ...], pages: KVPages, geo: Geometry,
                 chunk_bytes: int = 32 << 20) -> None:
        self.dirs = dirs
        self.pages = pages
        self.geo = geo
        self.base = geo.tp_rank * geo.rank_bytes
        self.chunk = max(1, chunk_bytes // geo.slot_bytes)
        self._store = None
        self._bufs = [_aligned_rows(self.chunk, geo.slot_bytes) for _ in range(2)]
        self._reads = ThreadPoolExecutor(1, thread_name_prefix="saria-ssd-chunk")

    def _reader(self):
        if self._store is None:  # the owner made the files before any block was written
            from saria.tiers.ssd import SsdStore

            self._store = SsdStore.reader(list(self.dirs), self.geo.slot_bytes)
        return self._store

    def load(self, transfers: list[Transfer], timeline=None) -> np.ndarray:
        """Reads every block of `transfers` and puts each good block's pages
        of every layer into its KV block; returns the per-block ok mask (a
        block that failed its read is not copied). Blocking: run it off the
        caller. `timeline` gets (start, end, "ssd" | "ssd-scatter", bytes)."""
        handles = np.concatenate([np.asarray(t.src_ids, np.int64) for t in transfers])
        keys = np.ascontiguousarray(np.frombuffer(b"".join(t.keys for t in transfers),
                                                  np.uint8).reshape(-1, 32))
        kv_ids = np.asarray([b for t in transfers for b in t.dst_ids], np.int64)
        n, c = handles.size, self.chunk
        ok = np.zeros(n, bool)
        store = self._reader()

        def read(k: int):
            a = time.perf_counter()
            rows = self._bufs[k % 2][: min(c, n - k * c)]
            good = store.read(handles[k * c:(k + 1) * c], keys[k * c:(k + 1) * c], rows)
            if timeline is not None:
                timeline.append((a, time.perf_counter(), "ssd", rows.nbytes))
            return rows, good

        chunks = -(-n // c)
        pending = self._reads.submit(read, 0)
        for k in range(chunks):
            rows, good = pending.result()
            if k + 1 < chunks:
                pending = self._reads.submit(read, k + 1)
            ok[k * c: k * c + good.size] = good
            a = time.perf_counter()
            picked = np.flatnonzero(good)
            moved = self.scatter(rows, picked, kv_ids[k * c:(k + 1) * c][picked])
            if timeline is not None:
                timeline.append((a, time.perf_counter(), "ssd-scatter", moved))
        return ok

    def scatter(self, rows: np.ndarray, picked: np.ndarray, kv_ids: np.ndarray) -> int:
        """Copies every layer's pages of the read blocks ``rows[picked]``
        into KV blocks `kv_ids`."""
        if kv_ids.size == 0:
            return 0
        cpu = self.pages.device.type == "cpu"
        for layer in range(self.geo.num_layers):
            off = self.base + layer * self.geo.page_bytes
            src = rows[:, off: off + self.geo.page_bytes]
            dst = self.pages.page_rows(layer)
            if dst is not None and cpu:
                copy_rows(dst, kv_ids, src, picked)
            else:
                blocks = self.pages.layers[layer]
                for i, b in zip(picked.tolist(), kv_ids.tolist()):
                    page = torch.from_numpy(np.ascontiguousarray(src[i]))
                    blocks[b].copy_(page.view(blocks.shape[1:]))
        return int(kv_ids.size) * self.geo.rank_bytes

    def close(self) -> None:
        self._reads.shutdown(wait=True)
        if self._store is not None:
            self._store.close()


def _aligned_rows(n: int, row_bytes: int) -> np.ndarray:
    """(n, row_bytes) bytes at a 4096-aligned address (O_DIRECT reads into it)."""
    raw = np.empty(n * row_bytes + 4096, np.uint8)
    start = (-raw.ctypes.data) % 4096
    return raw[start: start + n * row_bytes].reshape(n, row_bytes)


class LoadCoordinator:
    """Runs a step's loads -- DRAM copies and SSD reads -- under one mode and
    measures them. Rates for pacing are learnt from the step's own past
    loads (exponential averages of each source alone), unless given."""

    def __init__(self, mode: str, copier: PageCopier, reader: SsdPageReader | None,
                 num_layers: int, ingress_Bps: float | None = None) -> None:
        self.mode = mode
        self.copier = copier
        self.reader = reader
        self.num_layers = num_layers
        self.ingress_Bps = ingress_Bps
        self.dram_Bps = 10e9   # first guesses, replaced by measurements
        self.ssd_Bps = 2e9
        self._io = ThreadPoolExecutor(1, thread_name_prefix="saria-ssd-read")
        self.totals = {"dram_bytes": 0, "dram_us": 0, "ssd_bytes": 0, "ssd_us": 0,
                       "load_us": 0, "ssd_blocks_failed": 0}
        self.timeline: deque = deque(maxlen=4096)  # (start, end, source, bytes) per copy/read

    def link(self) -> LinkModel:
        ingress = self.ingress_Bps or max(self.dram_Bps, self.ssd_Bps)
        return LinkModel(ingress, self.dram_Bps, self.ssd_Bps)

    def run(self, dram: list[Transfer], ssd: list[Transfer]) -> "StepLoad":
        """Starts the step's loads; DRAM copies of every layer are done (CPU)
        or queued (CUDA) when it returns, SSD reads may still be in flight."""
        step = StepLoad(self, ssd)
        t0 = time.perf_counter()
        step.t0 = t0
        if ssd and self.mode != "serial":
            step.start_reads()
        d_bytes = sum(len(t) for t in dram) * self.copier.geo.page_bytes * self.num_layers
        s_bytes = sum(len(t) for t in ssd) * self.copier.geo.slot_bytes
        rate = None
        if self.mode == "paced" and ssd and d_bytes:
            rate = paced_dram_rate(self.link(), d_bytes, s_bytes)
        done = 0
        for layer in range(self.num_layers):
            for t in dram:
                a = time.perf_counter()
                step.futures[layer].append((t, self.copier.submit(t, layer)))
                n = len(t) * self.copier.geo.page_bytes
                done += n
                self.timeline.append((a, time.perf_counter(), "dram", n))
                if rate and step.reading():  # pace while the SSD path runs
                    wait = t0 + done / rate - time.perf_counter() if rate > 0 else 0.0
                    if wait > 0:
                        step.wait_reads(wait)
        if d_bytes:
            dt = time.perf_counter() - t0
            self.totals["dram_bytes"] += d_bytes
            self.totals["dram_us"] += int(dt * 1e6)
            if not ssd or self.mode == "serial":  # alone: a clean rate sample
                self.dram_Bps = _ewma(self.dram_Bps, d_bytes / max(dt, 1e-9))
        if ssd and self.mode == "serial":
            step.start_reads()
        return step

    def close(self) -> None:
        self._io.shutdown(wait=True)


class StepLoad:
    """One step's loads in progress: per-layer DRAM copy futures and the SSD
    job (read and pages put in place, on the coordinator's I/O thread)."""

    def __init__(self, coord: LoadCoordinator, ssd: list[Transfer]) -> None:
        self.coord = coord
        self.ssd = ssd
        self.futures: dict[int, list[tuple[Transfer, Future]]] = defaultdict(list)
        self.errors: dict[int, BaseException] = {}  # op id -> its first failed DRAM copy
        self.read: Future | None = None
        self.done_reading = False
        self.t0 = 0.0
        self.read_start = 0.0
        self.failed: list[tuple[Transfer, list[int], list[int]]] = []  # (t, kv ids, handles)

    def start_reads(self) -> None:
        self.read_start = time.perf_counter()
        self.read = self.coord._io.submit(self.coord.reader.load, self.ssd, self.coord.timeline)

    def reading(self) -> bool:
        return self.read is not None and not self.read.done()

    def wait_reads(self, timeout: float) -> None:
        try:
            self.read.result(timeout=timeout)
        except Exception:  # noqa: BLE001 -- a timeout, or a failure collected later
            pass

    def layer_ready(self, layer: int) -> None:
        """Waits for `layer`'s DRAM copies and for the SSD blocks' pages."""
        for t, f in self.futures.pop(layer, ()):
            err = f.exception()  # waits
            if err is not None:
                self.errors.setdefault(t.op_id, err)
        if self.read is not None and not self.done_reading:
            self._finish_read()

    def _finish_read(self) -> None:
        self.done_reading = True
        n = sum(len(t) for t in self.ssd)
        try:
            ok = self.read.result()
        except Exception as e:  # noqa: BLE001 -- the whole read failed: every block recomputed
            log.error("saria: SSD read failed: %s", e)
            ok = np.zeros(n, bool)
        end = time.perf_counter()
        c = self.coord
        n_bytes = n * c.copier.geo.slot_bytes
        c.totals["ssd_bytes"] += n_bytes
        c.totals["ssd_us"] += int((end - self.read_start) * 1e6)
        if c.mode == "serial" or not any(self.futures.values()):
            c.ssd_Bps = _ewma(c.ssd_Bps, n_bytes / max(end - self.read_start, 1e-9))
        start = 0
        for t in self.ssd:
            mask = ok[start: start + len(t)]
            if not mask.all():
                self.failed.append((t, [b for b, m in zip(t.dst_ids, mask) if not m],
                                    [h for h, m in zip(t.src_ids, mask) if not m]))
            start += len(t)
        c.totals["ssd_blocks_failed"] += int(np.count_nonzero(~ok))

    def finish(self) -> None:
        """Every layer in place (the step's loads end)."""
        for layer in range(self.coord.num_layers):
            self.layer_ready(layer)
        self.coord.totals["load_us"] += int((time.perf_counter() - self.t0) * 1e6)


def _ewma(old: float, sample: float, weight: float = 0.3) -> float:
    return (1 - weight) * old + weight * sample


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
        self._delayed: set[str] = set()
        self._meta: SariaMetadata | None = None  # the step's metadata, once begun
        self._deltas = Deltas()
        self.bytes_stored = 0

    # ------------------------------------------------------------ lifecycle

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._pages = KVPages(kv_caches, self.geo)
        if self.pool is not None:
            self._attach()

    def _attach(self) -> None:
        """Copier and coordinator over the current pool and drives."""
        pages = self._pages
        self.copier = PageCopier(pages, self.pool, self.geo)
        reader = SsdPageReader(self.ssd_dirs, pages, self.geo) if self.ssd_dirs else None
        self.coordinator = LoadCoordinator(self.cfg.coordinator, self.copier, reader,
                                           self.geo.num_layers, self.cfg.ingress_bytes_per_s)
        log.info("saria worker: %d layers, %d B pages, pool %d slots of %d B (%s, %s), SSD %s, "
                 "coordinator %s", self.geo.num_layers, self.geo.page_bytes, self.pool.num_slots,
                 self.pool.slot_bytes, "pinned" if self.pool.pinned else "not pinned",
                 pages.device, ", ".join(self.ssd_dirs) or "off", self.cfg.coordinator)

    def shutdown(self) -> None:
        self.shutdown_movers()
        if self.pool is not None and self._server_pool is None:
            self.pool.unlink()  # the engine's own pool (a server's stays the server's)

    def shutdown_movers(self) -> None:
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

    def start_load_kv(self, meta: SariaMetadata) -> None:
        self._begin(meta)
        if not meta.loads:
            return
        dram = [t for t in meta.loads if t.kind == DRAM_TO_KV]
        ssd = [t for t in meta.loads if t.kind == SSD_TO_KV]
        if ssd and self.coordinator.reader is None:
            raise RuntimeError("saria: the scheduler sent SSD reads to a worker with no SSD tier")
        self._loads = list(meta.loads)
        self._step = self.coordinator.run(dram, ssd)

    def wait_for_layer_load(self, layer_name: str) -> None:
        layer = self.copier.pages.name_index.get(layer_name) if self.copier else None
        if layer is None or self._step is None:
            return
        self._step.layer_ready(layer)

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
        for t, futs in list(self._pending.values()):
            if t.req_id in gone:
                for f in futs:
                    f.exception()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, None]:
        self._collect_stores()
        busy = {t.req_id for t, _ in self._pending.values()}
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
        c = self.coordinator
        now = {"bytes_stored": self.bytes_stored}
        if c is not None:
            t = c.totals
            now.update(bytes_loaded_dram=t["dram_bytes"], bytes_loaded_ssd=t["ssd_bytes"],
                       load_dram_us=t["dram_us"], load_ssd_us=t["ssd_us"], load_us=t["load_us"],
                       ssd_read_failures_worker=t["ssd_blocks_failed"])
        return self._deltas.take(now)

    # --------------------------------------------------------------- helpers

    def _map_server_pool(self, server_pool: tuple[str, tuple[str, ...]]) -> None:
        """Maps the cache server's pool (at the first step, and again after
        the server restarted with a new one); copies of the old pool's ops
        were voided by the server's restart."""
        path, dirs = server_pool
        if self.copier is not None:
            self.shutdown_movers()
        size = os.path.getsize(path)
        self.pool = DramPool(size // self.geo.slot_bytes, self.geo.slot_bytes, shared=path,
                             prefault=False)
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
            f = self.copier.submit(t, layer)
            self._pending.setdefault(t.op_id, (t, []))[1].append(f)

    def _collect_stores(self) -> None:
        for op_id, (t, futs) in list(self._pending.items()):
            if len(futs) < self.geo.num_layers or not all(f.done() for f in futs):
                continue
            del self._pending[op_id]
            if self._report(t.op_id, futs, "storing"):
                self.bytes_stored += len(t) * self.geo.rank_bytes

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
            self._load_errors.update(kv_ids)  # vLLM recomputes them
            bad[t.op_id].extend(handles)
        for op_id in dict.fromkeys(t.op_id for t in loads):
            err = step.errors.get(op_id)
            if err is not None:
                log.error("saria: loading op %d failed: %s", op_id, err)
                for t in loads:
                    if t.op_id == op_id:
                        self._load_errors.update(t.dst_ids)
                self._done.failed[op_id] += 1
                continue
            self._done.done[op_id] += 1
            if bad.get(op_id):
                self._done.bad_ssd[op_id] = sorted(bad[op_id])

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

