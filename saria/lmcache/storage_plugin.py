"""``SariaStoragePlugin``: saria as a storage plugin of LMCache's in-engine
(non-MP) mode, over the same ``ChunkStore`` as the MP adapter.

Settings are flat keys of LMCache's ``extra_config``, next to the two the
plugin loader reads (a nested mapping is not read by LMCache)::

    storage_plugins: [saria]
    extra_config:
      storage_plugin.saria.module_path: saria.lmcache
      storage_plugin.saria.class_name: SariaStoragePlugin
      storage_plugin.saria.path: /mnt/nvme0
      storage_plugin.saria.capacity: 2TB
      storage_plugin.saria.admission: saria

LMCache's loader only logs a plugin that fails to build ("Failed to create
backend saria: capacity: ...") and starts the engine without it; the message
names the key, and saria logs it as an error of its own too.

How the calls map: a put is a store (copied at once, so LMCache may free its
buffer when the call returns); ``contains(pin=True)`` -- the engine's
lookup -- is an access that locks a hit until ``unpin``; ``contains``
without pin only asks; ``get_blocking`` allocates the chunk's buffer from
LMCache's CPU backend with the shape, dtype and format kept in the chunk's
header.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import struct
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import torch
from lmcache.v1.memory_management import MemoryFormat
from lmcache.v1.storage_backend.abstract_backend import StoragePluginInterface

from saria.errors import ConfigError
from saria.lmcache.chunks import ChunkStore
from saria.lmcache.params import AdapterParams, plugin_params

if TYPE_CHECKING:
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.memory_management import MemoryObj

log = logging.getLogger(__name__)

# dtype codes kept in a chunk's header (append only: stored chunks keep theirs)
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn,
           torch.float8_e5m2, torch.uint8, torch.int8, torch.float64)


def engine_key_digest(key: "CacheEngineKey") -> bytes:
    """saria's 32-byte block key for an LMCache ``CacheEngineKey`` (its
    ``to_string``: model, world size, worker, chunk hash, dtype, tags)."""
    return hashlib.sha256(b"saria.lmcache.CacheEngineKey/1\0" + key.to_string().encode()).digest()


def encode_meta(shape: Sequence[int], dtype: torch.dtype, fmt: MemoryFormat) -> bytes:
    if len(shape) > 9 or dtype not in _DTYPES:
        raise ValueError(f"saria cannot keep a chunk of shape {tuple(shape)} and dtype {dtype}")
    return struct.pack(f"<BBB{len(shape)}I", int(fmt.value), _DTYPES.index(dtype), len(shape),
                       *shape)


def decode_meta(meta: bytes) -> tuple[torch.Size, torch.dtype, MemoryFormat]:
    fmt, dt, ndim = struct.unpack_from("<BBB", meta)
    shape = struct.unpack_from(f"<{ndim}I", meta, 3)
    return torch.Size(shape), _DTYPES[dt], MemoryFormat(fmt)


def _chunk_bytes(metadata) -> int | None:
    """Bytes of one full chunk of the engine's layout (LMCache's
    ``metadata.get_shapes()`` and ``kv_dtype``), or None if it cannot tell."""
    try:
        return sum(math.prod(s) * d.itemsize
                   for s, d in zip(metadata.get_shapes(), metadata.get_dtypes(), strict=True)) or None
    except (AttributeError, TypeError):
        return None


class SariaStoragePlugin(StoragePluginInterface):
    """LMCache storage plugin over a ``ChunkStore``; thread-safe."""

    def __init__(self, config=None, metadata=None, local_cpu_backend=None, loop=None,
                 dst_device: str = "cpu") -> None:
        super().__init__(dst_device=dst_device, config=config, metadata=metadata,
                         local_cpu_backend=local_cpu_backend, loop=loop)
        try:
            _, keys = plugin_params(getattr(config, "extra_config", None))
            params = AdapterParams.from_dict(keys)
        except ConfigError as e:
            log.error("saria storage plugin not started: %s", e)
            raise
        if params.chunk_bytes is None and metadata is not None:  # a full chunk, from the model
            params = dataclasses.replace(params, chunk_bytes=_chunk_bytes(metadata))
        self.store = ChunkStore(params)

    def __str__(self) -> str:
        return "SariaStoragePlugin"

    # ------------------------------------------------------------- lookups

    def contains(self, key: CacheEngineKey, pin: bool = False) -> bool:
        d = engine_key_digest(key)
        return self.store.lookup_lock([d])[0] if pin else self.store.contains(d)

    def exists_in_put_tasks(self, key: CacheEngineKey) -> bool:
        return False  # puts copy before they return

    def pin(self, key: CacheEngineKey) -> bool:
        return self.store.lookup_lock([engine_key_digest(key)])[0]

    def unpin(self, key: CacheEngineKey) -> bool:
        self.store.unlock([engine_key_digest(key)])
        return True

    async def batched_async_contains(self, lookup_id: str, keys: list[CacheEngineKey],
                                     pin: bool = False) -> int:
        return self.batched_contains(keys, pin)

    # --------------------------------------------------------------- stores

    def batched_submit_put_task(self, keys: Sequence[CacheEngineKey], objs: list[MemoryObj],
                                transfer_spec: Any = None,
                                on_complete_callback: Optional[Callable] = None) -> None:
        self.store.put([engine_key_digest(k) for k in keys], [o.byte_array for o in objs],
                       [encode_meta(o.get_shape(), o.get_dtype(), o.get_memory_format())
                        for o in objs])
        if on_complete_callback is not None:
            for k in keys:
                on_complete_callback(k)
        return None

    # ---------------------------------------------------------------- loads

    def get_blocking(self, key: CacheEngineKey) -> MemoryObj | None:
        got = self.store.fetch(engine_key_digest(key))
        if got is None or self.local_cpu_backend is None:
            return None
        shape, dtype, fmt = decode_meta(got[0])
        obj = self.local_cpu_backend.allocate(shape, dtype, fmt)
        if obj is None:
            return None
        buf = obj.byte_array.cast("B")
        if len(buf) != got[1].size:  # not the layout it was stored with: a miss
            obj.ref_count_down()
            return None
        buf[:] = got[1].data
        return obj

    async def batched_get_non_blocking(self, lookup_id: str, keys: list[CacheEngineKey],
                                       transfer_spec: Any = None) -> list[MemoryObj]:
        """The hits' prefix, as LMCache expects. LMCache's asynchronous path
        leaves unpinning to the backend: every key ``batched_async_contains``
        pinned is unpinned here, read or not."""
        out = []
        try:
            for k in keys:
                obj = self.get_blocking(k)
                if obj is None:
                    break
                out.append(obj)
        finally:
            self.store.unlock([engine_key_digest(k) for k in keys])
        return out

    # ---------------------------------------------------------------- misc

    def remove(self, key: CacheEngineKey, force: bool = True) -> bool:
        return bool(self.store.remove([engine_key_digest(key)]))

    def get_allocator_backend(self):
        return self.local_cpu_backend

    def close(self) -> None:
        self.store.close()
