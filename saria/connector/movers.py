"""The worker's movers, one per (source, destination) medium pair.

* ``DRAM -> KV`` and ``KV -> DRAM`` (``PageCopier``): one layer's pages
  between pool slots and KV blocks. On CPU a native row copy in the calling
  thread (on 2 cores, handing copies to a thread cost more than it
  overlapped); on CUDA per-block async copies on a side stream from the
  page-locked pool. Either way a copy waits for the compute side first
  (``ComputeOrder``): a store never reads a page before the layer wrote it.
* ``SSD -> KV`` (``SsdPageReader``): the worker opens the store's drive files
  read-only (O_DIRECT, through the native store, which verifies the header,
  the key and both checksums) and reads its blocks (with tensor parallelism
  only this rank's part of each: the store keeps one part per rank in every
  slot, each with its own header and crc), in chunks, into two
  aligned staging buffers on a background thread; while one chunk is read
  the previous one's pages of every layer go into the KV cache, so the copy
  hides behind the drive. A block that fails its read is reported (vLLM
  recomputes it; the scheduler drops the copy). On CUDA the staging buffer
  would be page-locked and a GPUDirect Storage handler (kvikio ``CuFile``
  reads into a GPU staging buffer, then a scatter into the pages) plugs in
  here as another mover for the same media pair: not written yet, because no
  machine with a GPU has run it.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch

from saria.connector.groups import NULL_BLOCK
from saria.connector.layout import Geometry
from saria.connector.meta import Medium, Transfer
from saria.connector.ordering import ComputeOrder
from saria.connector.pages import KVPages
from saria.tiers.copy import copy_rows
from saria.tiers.dram import DramPool

DRAM_TO_KV, KV_TO_DRAM, SSD_TO_KV = ((Medium.DRAM, Medium.KV), (Medium.KV, Medium.DRAM),
                                     (Medium.SSD, Medium.KV))


class PageCopier:
    """DRAM <-> KV page copies of one layer at a time, in submission order."""

    def __init__(self, pages: KVPages, pool: DramPool, geo: Geometry,
                 order: ComputeOrder | None = None) -> None:
        self.pages = pages
        self.geo = geo
        self.pool_t = torch.from_numpy(pool.array)  # (slots, slot_bytes) uint8, shared
        self.base = geo.tp_rank * geo.rank_bytes
        self.cuda = pages.device.type == "cuda"
        self.stream = torch.cuda.Stream(pages.device) if self.cuda else None
        self.order = order or ComputeOrder(pages.device, self.stream)
        self._exec = ThreadPoolExecutor(1, thread_name_prefix="saria-copy")

    def pool_layer(self, layer: int) -> torch.Tensor:
        """This rank's page of `layer` in every slot: ``[slots, page_bytes]``."""
        off = self.base + layer * self.geo.page_bytes
        return self.pool_t[:, off: off + self.geo.page_bytes]

    def submit(self, t: Transfer, layer: int) -> Future:
        """Queues one layer's copy of `t` after everything the compute side
        queued so far (``ComputeOrder``): in this thread when that is done
        already (CPU), else on the copy thread."""
        mark = self.order.mark()
        if self.cuda or mark is not None:
            return self._exec.submit(self.copy, t, layer, mark)
        f: Future = Future()  # inline (see the module doc); failures travel in the future
        try:
            self.copy(t, layer)
            f.set_result(None)
        except Exception as e:  # noqa: BLE001 -- reported as a failed op, recomputed
            f.set_exception(e)
        return f

    def copy(self, t: Transfer, layer: int, mark=None) -> int:
        """Copies one layer of `t` once the compute side reached `mark`;
        returns the bytes moved."""
        load = t.kind == DRAM_TO_KV
        kv_ids, slots = t.kv_ids(self.geo.layer_group(layer)), t.other_ids()
        if t.groups is not None:  # a group holding nothing there (null block): skipped
            pairs = [(b, s) for b, s in zip(kv_ids, slots) if b != NULL_BLOCK]
            kv_ids, slots = [b for b, _ in pairs], [s for _, s in pairs]
            if not kv_ids:
                return 0
        blocks, pool = self.pages.layers[layer], self.pool_layer(layer)
        if self.cuda:
            # The pool is page-locked (cudaHostRegister): true async DMA copies.
            with torch.cuda.stream(self.stream):
                self.order.wait(mark)  # a store reads pages its layer's kernels wrote
                for b, s in zip(kv_ids, slots):
                    if load:
                        blocks[b].copy_(pool[s].view(blocks.shape[1:]), non_blocking=True)
                    else:
                        pool[s].copy_(blocks[b].reshape(-1), non_blocking=True)
                self.stream.synchronize()
            return len(kv_ids) * self.geo.page_bytes
        self.order.wait(mark)
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
    """SSD -> KV: blocks read (verified) in chunks into two staging buffers;
    while one chunk is read, the previous one's pages of every layer go into
    the KV cache, so the copy hides behind the drive. With ``tp_size > 1``
    the rank reads only its part of each block (``SsdStore.read_part``):
    ``rank_bytes`` of payload, not ``slot_bytes``; ``bytes_read`` counts what
    this rank read from the drives."""

    def __init__(self, dirs: tuple[str, ...], pages: KVPages, geo: Geometry,
                 chunk_bytes: int = 32 << 20) -> None:
        self.dirs = dirs
        self.pages = pages
        self.geo = geo
        self.parted = geo.tp_size > 1
        # the staging rows: this rank's part of a block, or the whole block
        row = self.row_bytes = geo.rank_bytes if self.parted else geo.slot_bytes
        self.base = 0 if self.parted else geo.tp_rank * geo.rank_bytes
        self.chunk = max(1, chunk_bytes // row)
        self._store = None
        self._bufs = [_aligned_rows(self.chunk, row) for _ in range(2)]
        self._reads = ThreadPoolExecutor(1, thread_name_prefix="saria-ssd-chunk")

    def ssd_store(self):
        """The SSD store this rank reads, opened on first use (fault injection
        in tests goes through it)."""
        if self._store is None:  # the owner made the files before any block was written
            from saria.tiers.ssd import SsdStore

            self._store = SsdStore.reader(list(self.dirs), self.geo.slot_bytes, parts=self.geo.tp_size)
        return self._store

    @property
    def bytes_read(self) -> int:
        """Bytes this rank's reader read from the drives (headers and padding
        included), since it opened."""
        return 0 if self._store is None else int(self._store.stats()["total"]["bytes_read"])

    def load(self, transfers: list[Transfer], timeline=None) -> np.ndarray:
        """Reads every block of `transfers` and puts each good block's pages
        of every layer into its KV block; returns the per-block ok mask (a
        block that failed its read is not copied). Blocking: run it off the
        caller. `timeline` gets (start, end, "ssd" | "ssd-scatter", bytes)."""
        handles = np.concatenate([np.asarray(t.src_ids, np.int64) for t in transfers])
        keys = np.ascontiguousarray(np.frombuffer(b"".join(t.keys for t in transfers),
                                                  np.uint8).reshape(-1, 32))
        groups = self.geo.num_layer_groups
        kv_ids = np.asarray([[b for t in transfers for b in t.kv_ids(g)] for g in range(groups)],
                            np.int64).reshape(groups, -1)
        n, c = handles.size, self.chunk
        ok = np.zeros(n, bool)
        store = self.ssd_store()

        def read(k: int):
            a = time.perf_counter()
            rows = self._bufs[k % 2][: min(c, n - k * c)]
            if self.parted:
                good = store.read_part(handles[k * c:(k + 1) * c], keys[k * c:(k + 1) * c],
                                       self.geo.tp_rank, rows)
            else:
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
            moved = self.scatter(rows, picked, kv_ids[:, k * c:(k + 1) * c][:, picked],
                                 skip_null=transfers[0].groups is not None)
            if timeline is not None:
                timeline.append((a, time.perf_counter(), "ssd-scatter", moved))
        return ok

    def scatter(self, rows: np.ndarray, picked: np.ndarray, kv_ids: np.ndarray,
                skip_null: bool = False) -> int:
        """Copies every layer's pages of the read blocks ``rows[picked]``
        into KV blocks ``kv_ids[group of the layer]`` (with several groups a
        null block is a position the group does not hold: skipped)."""
        if kv_ids.size == 0:
            return 0
        kv_ids = np.atleast_2d(kv_ids)
        cpu = self.pages.device.type == "cpu"
        for layer in range(self.geo.num_layers):
            ids = kv_ids[self.geo.layer_group(layer)]
            at = picked
            if skip_null:
                keep = ids != NULL_BLOCK
                ids, at = ids[keep], picked[keep]
            off = self.base + layer * self.geo.page_bytes
            src = rows[:, off: off + self.geo.page_bytes]
            dst = self.pages.page_rows(layer)
            if dst is not None and cpu:
                copy_rows(dst, ids, src, at)
            else:
                blocks = self.pages.layers[layer]
                for i, b in zip(at.tolist(), ids.tolist()):
                    page = torch.from_numpy(np.ascontiguousarray(src[i]))
                    blocks[b].copy_(page.view(blocks.shape[1:]))
        return int(kv_ids.shape[1]) * self.geo.rank_bytes

    def close(self) -> None:
        self._reads.shutdown(wait=True)
        if self._store is not None:
            self._store.close()


def _aligned_rows(n: int, row_bytes: int) -> np.ndarray:
    """(n, row_bytes) bytes at a 4096-aligned address (O_DIRECT reads into it)."""
    raw = np.empty(n * row_bytes + 4096, np.uint8)
    start = (-raw.ctypes.data) % 4096
    return raw[start: start + n * row_bytes].reshape(n, row_bytes)
