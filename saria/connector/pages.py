"""vLLM's per-layer KV cache tensors as pages a mover can copy.

A *page* is one KV block of one layer, for this tensor-parallel rank: the
worker's movers copy whole pages between the KV cache and DRAM slots or SSD
staging rows, whatever the attention backend's layout (the block dimension
is found by its size; a page kept in pieces, K apart from V, is gathered by
torch).
"""

from __future__ import annotations

import torch

from saria.connector.layout import Geometry


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
