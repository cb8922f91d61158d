"""The worker's mover for recurrent-state checkpoints (hybrid models).

vLLM registers a Mamba/GDN layer's cache as raw byte pages (its conv and SSM
states at fixed offsets, padded to the attention page): saria copies each
layer's first ``state_page_bytes`` of the state block, whatever is inside.
With tensor parallelism each rank holds its own share of every state (its
heads), ``state_rank_bytes`` for all its layers, layer after layer.

A checkpoint spans ``state_units`` DRAM slots (or SSD blocks, which the store
verifies by key like any block) and, like an attention block, each slot is
``tp_size`` parts of ``rank_bytes``, rank-major: rank ``r``'s share fills
part ``r`` of the checkpoint's slots in order (``state_units * rank_bytes >=
state_rank_bytes``, as ``state_units = ceil(state_bytes / slot_bytes)``).
NOTE: a rank writes and reads only its own part of each slot, so ranks never
touch each other's bytes, and on the SSD a rank reads and verifies only its
part (``SsdStore.read_part``), as ``SsdPageReader`` does for pages. At TP 1
the part is the whole slot: the format is the one before TP.
Copies are synchronous: loads before vLLM prepares the step's inputs
(``handle_preemptions``; see ``worker._load_states``), stores after the
forward pass (``wait_for_save``). The scheduler completes a stored checkpoint
only when every rank reported its copy (``ops.OpTracker``).
"""

from __future__ import annotations

import numpy as np
import torch

from saria.connector.layout import Geometry
from saria.connector.meta import Medium, StateCopy


class StateMover:
    def __init__(self, kv_caches: dict[str, torch.Tensor], geo: Geometry, pool,
                 ssd_dirs: tuple[str, ...]) -> None:
        gl = geo.groups
        self.geo = geo
        self.page = gl.state_page_bytes
        self.part = geo.rank_bytes                  # this rank's part of a slot
        self.base = geo.tp_rank * geo.rank_bytes    # where it starts in the slot
        self.rows: list[torch.Tensor] = []
        for name in gl.state_layer_names:
            t = kv_caches.get(name)
            if t is None:
                raise RuntimeError(f"saria: vLLM registered no state cache for layer {name}")
            b = t.view(torch.uint8) if t.dtype != torch.uint8 else t
            stride = b.stride(0)
            if b.shape[0] != geo.num_gpu_blocks or b.stride(-1) != 1 or b[0].numel() < self.page:
                raise RuntimeError(f"saria: state cache of {name} (shape {tuple(t.shape)}, "
                                   f"stride {t.stride()}) is not {geo.num_gpu_blocks} pages of "
                                   f">= {self.page} B")
            self.rows.append(torch.as_strided(b, (b.shape[0], self.page), (stride, 1)))
        # this rank's part of every slot: (slots, rank_bytes), a view of the shared pool
        self.pool_part = torch.from_numpy(pool.array)[:, self.base: self.base + self.part]
        self.ssd_dirs = ssd_dirs
        self._store = None

    def _layers(self):
        """(offset in this rank's share, state rows, recurrent group) per layer."""
        return ((layer * self.page, rows, group) for layer, (rows, group)
                in enumerate(zip(self.rows, self.geo.groups.state_layer_groups)))

    def store(self, c: StateCopy) -> None:
        """KV state blocks -> this rank's part of the checkpoint's DRAM slots
        (the other ranks' parts are left as they are)."""
        n = len(c.ids)
        share = torch.from_numpy(np.empty(n * self.part, np.uint8))
        for off, rows, group in self._layers():
            share[off: off + self.page].copy_(rows[c.kv_ids[group]])
        slots = torch.as_tensor(c.ids, dtype=torch.long)
        self.pool_part.index_copy_(0, slots, share.view(n, self.part))

    def load(self, c: StateCopy) -> bool:
        """This rank's part of the checkpoint's DRAM slots or SSD blocks -> KV
        state blocks; False when an SSD part failed its verification (nothing
        is copied then)."""
        n = len(c.ids)
        if c.src == Medium.DRAM:
            share = self.pool_part.index_select(0, torch.as_tensor(c.ids, dtype=torch.long))
        else:
            parts = _aligned(n, self.part)
            handles = np.asarray(c.ids, np.int64)
            keys = np.ascontiguousarray(np.frombuffer(c.keys, np.uint8).reshape(n, 32))
            store = self.ssd_store()
            if self.geo.tp_size > 1:
                ok = store.read_part(handles, keys, self.geo.tp_rank, parts)
            else:
                ok = store.read(handles, keys, parts)
            if not np.all(ok):
                return False
            share = torch.from_numpy(parts)
        flat = share.reshape(-1)
        for off, rows, group in self._layers():
            rows[c.kv_ids[group]].copy_(flat[off: off + self.page])
        return True

    def ssd_store(self):
        """The SSD store this rank reads, opened on first use (fault injection
        in tests goes through it)."""
        if self._store is None:
            from saria.tiers.ssd import SsdStore

            self._store = SsdStore.reader(list(self.ssd_dirs), self.geo.slot_bytes,
                                          parts=self.geo.tp_size)
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


def _aligned(n: int, row: int) -> np.ndarray:
    """(n, row) bytes at a 4096-aligned address (O_DIRECT reads into it)."""
    raw = np.empty(n * row + 4096, np.uint8)
    start = (-raw.ctypes.data) % 4096
    return raw[start: start + n * row].reshape(n, row)
