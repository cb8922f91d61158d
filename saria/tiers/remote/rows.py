"""saria's objects in the cluster store: self-describing, checksummed rows.

A block travels to and from the cluster as one object, a *row*: a 64-byte
header and the block's bytes. The row says what it is, so a reader never has
to trust the store or the network: an object of another model or layout,
another saria format, a block stored under another key, a torn or corrupted
transfer -- each fails a check and is a miss, never wrong KV.

Object key: ``saria/r1/<namespace>/<block key hex>``. The namespace is the
engine's layout digest (``Geometry.namespace``: model, dtype, block size,
page layout, TP size, hash settings), so two fleets' or two models' objects
never share a key; the block key is saria's chained block hash, so what any
node of the fleet put (same hash seed) is found by key.

Row format (version 1, little endian)::

    @0   u64  magic "SARIAROW"
    @8   u32  version (1)
    @12  u32  payload length (= block_bytes)
    @16  32B  block key
    @48  8B   namespace tag: blake2b-64 of the namespace string
    @56  u32  crc32c of the payload
    @60  u32  crc32c of header bytes [0, 60)
    @64  payload

The header and the payload may lie in different buffers on this side (the
tier's own header rows and a DRAM slot, moved as one object by Mooncake's
scatter-gather calls): the store holds one contiguous row either way.

Checks on read (``RowCodec.verify``): magic, version, length, key, namespace
tag, header crc, payload crc. Checksums are computed natively
(``crc32c_rows``, SSE4.2, the GIL released), one call per batch.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from saria import _store
from saria.tiers.copy import byte_rows

__all__ = ["RowCodec", "HEADER_BYTES", "FORMAT_VERSION", "crc32c_rows", "object_key"]

HEADER_BYTES = 64
FORMAT_VERSION = 1
MAGIC = b"SARIAROW"
_KEY_PREFIX = "saria/r1"


def object_key(namespace: str, key: bytes) -> str:
    """The store's name of one block of one namespace."""
    return f"{_KEY_PREFIX}/{namespace}/{bytes(key).hex()}"


def _index(rows_idx: Any, n_rows: int) -> np.ndarray:
    idx = np.ascontiguousarray(rows_idx, dtype=np.int64).reshape(-1)
    if idx.size and (idx.min() < 0 or idx.max() >= n_rows):
        raise IndexError(f"row index outside [0, {n_rows})")
    return idx


def crc32c_rows(rows: np.ndarray, rows_idx: Any, offset: int, length: int) -> np.ndarray:
    """crc32c of bytes ``[offset, offset + length)`` of each row ``rows[rows_idx[i]]``
    (uint32 per row), natively with the GIL released."""
    addr, n_rows, stride, row_len = byte_rows(rows, "rows")
    if offset < 0 or length < 0 or offset + length > row_len:
        raise ValueError(f"bytes [{offset}, {offset + length}) outside rows of {row_len} B")
    return _store.crc32c_rows(addr, stride, _index(rows_idx, n_rows), offset, length)


class RowCodec:
    """Writes and checks row headers. A row's header and payload may lie in
    different buffers (a header row of the tier's own, the payload in a DRAM
    slot: Mooncake moves both as one object), so every method takes the
    headers ``(n, 64)`` uint8 and the payloads (any 2-D byte rows of
    ``block_bytes``, with their row indices) apart."""

    def __init__(self, namespace: str, block_bytes: int) -> None:
        if not namespace or "/" in namespace:
            raise ValueError(f"namespace must be a non-empty name without '/', got {namespace!r}")
        if not 0 < int(block_bytes) < 1 << 32:
            raise ValueError(f"block_bytes must be in [1, 2**32), got {block_bytes}")
        self.namespace = namespace
        self.block_bytes = int(block_bytes)
        self.row_bytes = HEADER_BYTES + self.block_bytes
        self.tag = hashlib.blake2b(namespace.encode(), digest_size=8).digest()
        fixed = np.zeros(16, np.uint8)
        fixed[:8] = np.frombuffer(MAGIC, np.uint8)
        fixed[8:12] = np.frombuffer(np.uint32(FORMAT_VERSION).tobytes(), np.uint8)
        fixed[12:16] = np.frombuffer(np.uint32(self.block_bytes).tobytes(), np.uint8)
        self._fixed = fixed
        self._tag = np.frombuffer(self.tag, np.uint8)

    def key(self, key: bytes) -> str:
        return object_key(self.namespace, key)

    def keys(self, keys: np.ndarray) -> list[str]:
        """The store's names of ``keys`` (n, 32), as ``key`` gives them one by one."""
        prefix = f"{_KEY_PREFIX}/{self.namespace}/"
        h = np.ascontiguousarray(keys, np.uint8).tobytes().hex()
        return [prefix + h[i:i + 64] for i in range(0, len(h), 64)]

    def _args(self, heads: np.ndarray, payload: Any, payload_idx: Any, keys: Any):
        if heads.ndim != 2 or heads.shape[1] != HEADER_BYTES or heads.dtype != np.uint8:
            raise ValueError(f"heads must be uint8 (n, {HEADER_BYTES}), got {heads.dtype} {heads.shape}")
        _, n_rows, _, row_len = byte_rows(payload, "payload")
        if row_len != self.block_bytes:
            raise ValueError(f"payload rows are {row_len} B, blocks {self.block_bytes} B")
        idx = _index(payload_idx, n_rows)
        keys = np.ascontiguousarray(keys, np.uint8).reshape(-1, 32)
        if not keys.shape[0] == idx.size == heads.shape[0]:
            raise ValueError(f"{keys.shape[0]} keys, {heads.shape[0]} headers, {idx.size} payloads")
        return idx, keys

    def encode(self, heads: np.ndarray, payload: Any, payload_idx: Any, keys: Any) -> None:
        """Fills ``heads[i]`` as the header of ``keys[i]`` whose bytes are
        ``payload[payload_idx[i]]``."""
        idx, keys = self._args(heads, payload, payload_idx, keys)
        heads[:, :16] = self._fixed
        heads[:, 16:48] = keys
        heads[:, 48:56] = self._tag
        heads[:, 56:60] = crc32c_rows(payload, idx, 0, self.block_bytes).view(np.uint8).reshape(-1, 4)
        heads[:, 60:64] = crc32c_rows(heads, np.arange(idx.size), 0, 60).view(np.uint8).reshape(-1, 4)

    def verify(self, heads: np.ndarray, payload: Any, payload_idx: Any, keys: Any) -> np.ndarray:
        """(n,) bool: True where ``heads[i]`` and ``payload[payload_idx[i]]``
        are a sound row of ``keys[i]`` in this namespace and format."""
        idx, keys = self._args(heads, payload, payload_idx, keys)
        ok = (heads[:, :16] == self._fixed).all(axis=1)
        ok &= (heads[:, 16:48] == keys).all(axis=1)
        ok &= (heads[:, 48:56] == self._tag).all(axis=1)
        hcrc = crc32c_rows(heads, np.arange(idx.size), 0, 60)
        ok &= hcrc == np.ascontiguousarray(heads[:, 60:64]).view(np.uint32).reshape(-1)
        if ok.any():  # the payload crc only where the header held
            sel = np.flatnonzero(ok)
            pcrc = crc32c_rows(payload, idx[sel], 0, self.block_bytes)
            ok[sel] = pcrc == np.ascontiguousarray(heads[sel, 56:60]).view(np.uint32).reshape(-1)
        return ok
