"""The worker's mover for recurrent-state checkpoints (hybrid models).

vLLM registers a Mamba/GDN layer's cache as raw byte pages (its conv and SSM
states at fixed offsets, padded to the attention page): saria copies each
layer's first ``state_page_bytes`` of the state block, whatever is inside.
A checkpoint is every recurrent layer's state, layer after layer, spread
over its ``state_units`` DRAM slots (or SSD blocks, which the store verifies
by key like any block). Copies are synchronous: loads before vLLM prepares the
step's inputs (``handle_preemptions``; see ``worker._load_states``), stores
after the forward pass (``wait_for_save``).
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
        self.pool_t = torch.from_numpy(pool.array)  # (slots, slot_bytes)
        self.ssd_dirs = ssd_dirs
        self._store = None

    def _flat(self, n_units: int) -> np.ndarray:
        return np.empty(n_units * self.geo.slot_bytes, np.uint8)

    def store(self, c: StateCopy) -> None:
        """KV state blocks -> the checkpoint's DRAM slots."""
        buf = torch.from_numpy(self._flat(len(c.ids)))
        for layer, (rows, group) in enumerate(zip(self.rows, self.geo.groups.state_layer_groups)):
            off = layer * self.page
            buf[off: off + self.page].copy_(rows[c.kv_ids[group]])
        slots = torch.as_tensor(c.ids, dtype=torch.long)
        self.pool_t.index_copy_(0, slots, buf.view(len(c.ids), -1))

    def load(self, c: StateCopy) -> bool:
        """The checkpoint's DRAM slots or SSD blocks -> KV state blocks; False
        when an SSD block failed its verification (nothing is copied then)."""
        n = len(c.ids)
        if c.src == Medium.DRAM:
            buf = self.pool_t.index_select(0, torch.as_tensor(c.ids, dtype=torch.long))
        else:
            rows = _aligned(n, self.geo.slot_bytes)
            keys = np.frombuffer(c.keys, np.uint8).reshape(n, 32)
            ok = self.ssd_store().read(np.asarray(c.ids, np.int64), np.ascontiguousarray(keys), rows)
            if not np.all(ok):
                return False
            buf = torch.from_numpy(rows)
        flat = buf.reshape(-1)
        for layer, (rows, group) in enumerate(zip(self.rows, self.geo.groups.state_layer_groups)):
            off = layer * self.page
            rows[c.kv_ids[group]].copy_(flat[off: off + self.page])
        return True

    def ssd_store(self):
        """The SSD store this rank reads, opened on first use (fault injection
        in tests goes through it)."""
        if self._store is None:
            from saria.tiers.ssd import SsdStore

            self._store = SsdStore.reader(list(self.ssd_dirs), self.geo.slot_bytes, parts=1)
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
