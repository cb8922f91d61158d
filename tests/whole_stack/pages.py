"""Synthetic KV pages: every block's pages are a function of its token prefix.

A block is named by a chain digest of every token up to its end (as vLLM's
block hash is); its page for (rank, layer) is that digest's BLAKE2b expansion
with the rank and layer as tag. The fake forward writes these bytes; a load
must put the same bytes back. A hybrid model's recurrent state after ``t``
tokens is another such expansion (``state``).
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np

GARBAGE = 0xEE  # what a page holds before any forward wrote it


def chain_digests(tokens: list[int], block_size: int, prev: list[bytes] | None = None) -> list[bytes]:
    """Digests of the full blocks of `tokens` (extending `prev`, already computed)."""
    out = list(prev or [])
    for i in range(len(out), len(tokens) // block_size):
        h = hashlib.blake2b(out[-1] if out else b"root", digest_size=16)
        h.update(np.asarray(tokens[i * block_size:(i + 1) * block_size], np.int64).tobytes())
        out.append(h.digest())
    return out


@lru_cache(maxsize=65536)
def page(digest: bytes, rank: int, layer: int, page_bytes: int) -> np.ndarray:
    d = hashlib.blake2b(digest + bytes([rank, layer]), digest_size=64).digest()
    rows = np.frombuffer(d * (-(-page_bytes // 64)), np.uint8)[:page_bytes]
    rows.setflags(write=False)
    return rows


@lru_cache(maxsize=65536)
def state(tokens: tuple[int, ...], rank: int, page_bytes: int) -> np.ndarray:
    """A recurrent layer's state after `tokens` (hybrid models): a function
    of every token so far, at any length, not only at block boundaries."""
    h = hashlib.blake2b(b"state" + bytes([rank]), digest_size=64)
    h.update(np.asarray(tokens, np.int64).tobytes())
    rows = np.frombuffer(h.digest() * (-(-page_bytes // 64)), np.uint8)[:page_bytes]
    rows.setflags(write=False)
    return rows
