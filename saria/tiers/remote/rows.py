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

Version 1 proves nothing to a reader: every field is computable by anyone
who reaches the master (it authenticates nobody), so a forged row for a
future prompt passes every check. The cluster tier writes and reads
**version 2** (``SignedRowCodec``): the same 64 bytes, signed with the
fleet's key (``fleetkey.FleetKeys``)::

    @0   u64  magic "SARIAROW"
    @8   u32  version (2)
    @12  u32  payload length (= block_bytes)
    @16  u32  key id (the ring's key that signed the row)
    @20  u32  zero
    @24  8B   namespace tag
    @32  32B  HMAC-SHA256(mac key, header[0:32] || block key || payload)

The MAC covers the header, the block key (not stored: the reader knows what
it asked for) and the payload, so a row of another key, namespace or format,
or with a changed byte, fails. Keys per (key id, namespace) are derived
once: ``HMAC(K, "saria-row-mac\0" || namespace)`` for the MAC and
``HMAC(K, "saria-row-name\0" || namespace)`` for names:
``saria/r2/<key id>/<hex of HMAC(name key, block key)>``, so a client
without the key cannot name a row (to probe, overwrite or remove it).
HMAC-SHA256 was measured against keyed BLAKE2b here (OpenSSL's SHA-NI path:
1.8-2.0 GB/s on one core, BLAKE2b 1.2 GB/s; see BENCHMARKS.md).
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
from typing import Any

import numpy as np

from saria import _store
from saria.tiers.copy import byte_rows

__all__ = ["RowCodec", "SignedRowCodec", "HEADER_BYTES", "FORMAT_VERSION", "crc32c_rows",
           "object_key"]

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


SIGNED_VERSION = 2
_SIGNED_PREFIX = "saria/r2"


def _derive(key: bytes, label: bytes, namespace: str) -> bytes:
    return hmac.digest(key, label + b"\0" + namespace.encode(), "sha256")


class SignedRowCodec(RowCodec):
    """Version 2 rows (module docstring): signed and named with a fleet
    keyring. Writes with the ring's write key; accepts rows of any key in
    the ring. ``keys`` names blocks under the write key, ``names(keys,
    key_id)`` under another of the ring's keys (``read_ids``: the others,
    newest first), for finding rows an older key wrote during a rotation."""

    def __init__(self, namespace: str, block_bytes: int, ring) -> None:
        super().__init__(namespace, block_bytes)
        self.ring = ring
        self.key_id = int(ring.write_id)
        self.read_ids = sorted((k for k in ring.keys if k != self.key_id), reverse=True)
        self._mac = {k: hmac.new(_derive(v, b"saria-row-mac", namespace), digestmod="sha256")
                     for k, v in ring.keys.items()}
        self._name = {k: _derive(v, b"saria-row-name", namespace) for k, v in ring.keys.items()}
        fixed = np.zeros(24, np.uint8)
        fixed[:8] = np.frombuffer(MAGIC, np.uint8)
        fixed[8:12] = np.frombuffer(np.uint32(SIGNED_VERSION).tobytes(), np.uint8)
        fixed[12:16] = np.frombuffer(np.uint32(self.block_bytes).tobytes(), np.uint8)
        self._fixed = fixed  # @0..@16; @16..@24 is the key id and zero

    def key(self, key: bytes) -> str:
        return self.names(np.frombuffer(bytes(key), np.uint8).reshape(1, 32))[0]

    def keys(self, keys: np.ndarray) -> list[str]:
        return self.names(keys, self.key_id)

    def names(self, keys: np.ndarray, key_id: int | None = None) -> list[str]:
        """The store's names of ``keys`` (n, 32) under the ring's key ``key_id``
        (default: the write key)."""
        kid = self.key_id if key_id is None else int(key_id)
        nk = self._name[kid]
        flat = np.ascontiguousarray(keys, np.uint8).tobytes()
        return [f"{_SIGNED_PREFIX}/{kid}/{hmac.digest(nk, flat[i:i + 32], 'sha256').hex()}"
                for i in range(0, len(flat), 32)]

    def _payload_views(self, payload: Any, idx: np.ndarray) -> list[memoryview]:
        addr, _, stride, width = byte_rows(payload, "payload")
        return [memoryview((ctypes.c_char * width).from_address(addr + int(i) * stride))
                for i in idx]

    def _macs(self, kids: np.ndarray, heads: np.ndarray, keys: np.ndarray,
              views: list[memoryview]) -> np.ndarray:
        out = np.empty((len(views), 32), np.uint8)
        for i, view in enumerate(views):
            h = self._mac[int(kids[i])].copy()
            h.update(heads[i, :32].tobytes() + keys[i].tobytes())
            h.update(view)  # OpenSSL hashes this with the GIL released
            out[i] = np.frombuffer(h.digest(), np.uint8)
        return out

    def encode(self, heads: np.ndarray, payload: Any, payload_idx: Any, keys: Any) -> None:
        idx, keys = self._args(heads, payload, payload_idx, keys)
        heads[:, :16] = self._fixed[:16]
        heads[:, 16:20] = np.frombuffer(np.uint32(self.key_id).tobytes(), np.uint8)
        heads[:, 20:24] = 0
        heads[:, 24:32] = self._tag
        kids = np.full(idx.size, self.key_id, np.int64)
        heads[:, 32:64] = self._macs(kids, heads, keys, self._payload_views(payload, idx))

    def verify(self, heads: np.ndarray, payload: Any, payload_idx: Any, keys: Any) -> np.ndarray:
        """(n,) bool: True where the row is a version 2 row of ``keys[i]`` in
        this namespace, signed by a key of the ring, with every byte as signed."""
        idx, keys = self._args(heads, payload, payload_idx, keys)
        ok = (heads[:, :16] == self._fixed[:16]).all(axis=1)
        ok &= (heads[:, 20:24] == 0).all(axis=1) & (heads[:, 24:32] == self._tag).all(axis=1)
        kids = np.ascontiguousarray(heads[:, 16:20]).view(np.uint32).reshape(-1).astype(np.int64)
        ok &= np.isin(kids, list(self._mac))
        if ok.any():
            sel = np.flatnonzero(ok)
            macs = self._macs(kids[sel], heads[sel], keys[sel], self._payload_views(payload, idx[sel]))
            for j, i in enumerate(sel):
                ok[i] = hmac.compare_digest(macs[j].tobytes(), heads[i, 32:64].tobytes())
        return ok
