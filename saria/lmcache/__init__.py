"""saria inside LMCache: saria's SSD tier and admission behind LMCache.

- ``SariaL2Adapter`` -- an L2 adapter for LMCache's multiprocess server
  (``lmcache server --l2-adapter '{"type": "plugin", "module_path":
  "saria.lmcache", "class_name": "SariaL2Adapter", "adapter_params": {...}}'``);
  LMCache picks up ``SariaL2AdapterConfig`` to check the params.
- ``SariaStoragePlugin`` -- a storage plugin for LMCache's in-engine (non-MP)
  mode (``storage_plugins: [saria]`` and ``storage_plugin.saria.module_path:
  saria.lmcache``, ``...class_name: SariaStoragePlugin``).

Both are a ``ChunkStore`` (``chunks.py``: the one cache core over saria's
DRAM buffer and O_DIRECT SSD store) with the same params (``params.py``).
They need LMCache: ``pip install 'saria[lmcache]'``; this package imports
it only when one of them is asked for.
"""

from __future__ import annotations

from saria.lmcache.chunks import ChunkStore
from saria.lmcache.params import AdapterParams

_LAZY = {
    "SariaL2Adapter": "saria.lmcache.l2_adapter",
    "SariaL2AdapterConfig": "saria.lmcache.l2_adapter",
    "SariaStoragePlugin": "saria.lmcache.storage_plugin",
}


def __getattr__(name: str):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'saria.lmcache' has no attribute {name!r}")
    try:
        import lmcache  # noqa: F401
    except ImportError as e:
        raise ImportError(f"saria.lmcache.{name} needs LMCache: pip install 'saria[lmcache]' "
                          f"({e})") from None
    import importlib

    return getattr(importlib.import_module(mod), name)


__all__ = ["AdapterParams", "ChunkStore", *_LAZY]
