"""The settings of saria's LMCache adapter and storage plugin.

Both take the same keys (``adapter_params`` of ``lmcache server
--l2-adapter``; ``storage_plugin.<name>.*`` / ``extra_config`` in non-MP
mode). Every key is checked when LMCache builds the adapter, so a bad value
stops the server's start with a ``ConfigError`` whose message starts with
the key (``capacity: ...``); an unknown key is an error too, never ignored.

==============  ===============================================================
key             meaning (default)
==============  ===============================================================
path            a directory, or a list of directories one per drive (required);
                saria's files go under ``<path>/saria-lmcache``
capacity        SSD bytes saria may use, all drives together, split evenly
                ("2TB", "512GiB" or an int; required)
admission       which chunks leaving saria's DRAM buffer are written to the
                SSD: any ``saria replay`` policy -- saria (default),
                full-duplicate, write-back, dram-only, E<k>, R<j>, E<k>+R<j>,
                hicache-selective, kvbm-filter, budget, budget:<fraction>
dwpd            the drives' rated drive writes per day, for budget (1)
dram            saria's DRAM buffer, where stored chunks wait for admission
                (default "2GiB"; at least 4 chunks)
chunk_bytes     bytes of one full LMCache chunk (default: the largest object of
                the first store; a restart reads it back from the store)
write_queue     pending SSD write batches before writes are dropped (1024)
lock_ttl        seconds a lookup's lock on a chunk lasts when LMCache never
                unlocks it (an aborted request): then saria releases it (300,
                LMCache's own L1 read-lock lifetime)
==============  ===============================================================
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from saria.errors import ConfigError
from saria.policy import make_admission
from saria.units import parse_size

STORE_DIR = "saria-lmcache"
_KEYS = ("path", "capacity", "admission", "dwpd", "dram", "chunk_bytes", "write_queue",
         "lock_ttl")


@dataclass(frozen=True, slots=True)
class AdapterParams:
    """Checked settings; ``dirs`` are the store directories (one per drive,
    under the given paths)."""

    dirs: tuple[str, ...]
    capacity_bytes: int
    admission: str = "saria"
    dwpd: float = 1.0
    dram_bytes: int = 2 << 30
    chunk_bytes: int | None = None
    write_queue: int = 1024
    lock_ttl_s: float = 300.0

    @property
    def bytes_per_drive(self) -> int:
        return self.capacity_bytes // len(self.dirs)

    @classmethod
    def from_dict(cls, d: Any) -> "AdapterParams":
        if not isinstance(d, dict):
            raise ConfigError("adapter_params", f"must be a mapping, got {type(d).__name__}")
        unknown = sorted(set(d) - set(_KEYS))
        if unknown:
            raise ConfigError(str(unknown[0]), f"unknown key; valid keys: {', '.join(_KEYS)}")
        dirs = tuple(os.path.join(p, STORE_DIR) for p in _paths(d.get("path")))
        if "capacity" not in d:
            raise ConfigError("capacity", 'required: the SSD bytes saria may use, e.g. "2TB"')
        capacity = _size(d["capacity"], "capacity")
        if capacity < len(dirs) * (4 << 20):
            raise ConfigError("capacity", f"{d['capacity']!r} leaves less than 4 MiB per drive")
        admission = d.get("admission", "saria")
        if not isinstance(admission, str):
            raise ConfigError("admission", f"must be a policy name, got {admission!r}")
        dwpd = d.get("dwpd", 1.0)
        if isinstance(dwpd, bool) or not isinstance(dwpd, (int, float)) or not dwpd > 0:
            raise ConfigError("dwpd", f"must be a positive number, got {dwpd!r}")
        try:
            make_admission(admission, dwpd=float(dwpd))
        except ConfigError as e:  # make_admission names its key "policy"
            raise ConfigError("admission", str(e).partition(": ")[2]) from None
        dram = _size(d.get("dram", "2GiB"), "dram")
        chunk = d.get("chunk_bytes")
        if chunk is not None:
            chunk = _size(chunk, "chunk_bytes")
            if chunk < 1:
                raise ConfigError("chunk_bytes", "must be positive")
        queue = d.get("write_queue", 1024)
        if isinstance(queue, bool) or not isinstance(queue, int) or queue < 1:
            raise ConfigError("write_queue", f"must be a positive integer, got {queue!r}")
        ttl = d.get("lock_ttl", 300.0)
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0:
            raise ConfigError("lock_ttl", f"must be a positive number of seconds, got {ttl!r}")
        return cls(dirs, capacity, admission, float(dwpd), dram, chunk, queue, float(ttl))


def _paths(value: Any) -> list[str]:
    if value is None:
        raise ConfigError("path", "required: a directory, or a list with one per drive")
    paths = [value] if isinstance(value, (str, os.PathLike)) else value
    if not isinstance(paths, (list, tuple)) or not paths:
        raise ConfigError("path", f"must be a directory or a non-empty list of them, got {value!r}")
    out = []
    for p in paths:
        if not isinstance(p, (str, os.PathLike)) or not os.fspath(p):
            raise ConfigError("path", f"not a directory name: {p!r}")
        p = os.path.abspath(os.fspath(p))
        parent = p if os.path.isdir(p) else os.path.dirname(p)
        if not os.path.isdir(parent):
            raise ConfigError("path", f"{p}: neither it nor its parent directory exists")
        if not os.access(parent, os.W_OK):
            raise ConfigError("path", f"{parent}: not writable")
        out.append(p)
    if len(set(out)) != len(out):
        raise ConfigError("path", f"a directory is listed twice: {out}")
    return out


def _size(value: Any, key: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(key, f"must be a size, got {value!r}")
    n = parse_size(value, name=key)
    if n != int(n) or n < 0:
        raise ConfigError(key, f"must be a whole number of bytes, got {value!r}")
    return int(n)


def plugin_params(extra: dict | None, class_name: str = "SariaStoragePlugin") -> tuple[str, dict]:
    """The name of the one ``storage_plugin.<name>.class_name`` entry of
    LMCache's ``extra_config`` naming `class_name`, and its other
    ``storage_plugin.<name>.*`` keys (without the loader's two)."""
    extra = extra or {}
    names = [k[len("storage_plugin."):-len(".class_name")] for k, v in extra.items()
             if k.startswith("storage_plugin.") and k.endswith(".class_name") and v == class_name]
    if len(names) != 1:
        raise ConfigError("storage_plugins", f"{len(names)} entries name {class_name}; saria "
                          "needs exactly one (storage_plugin.<name>.class_name)")
    prefix = f"storage_plugin.{names[0]}."
    return names[0], {k[len(prefix):]: v for k, v in extra.items()
                      if k.startswith(prefix) and k[len(prefix):] not in ("module_path", "class_name")}
