"""``saria lmcache check``: check a saria tier of an LMCache configuration
before LMCache loads it.

    saria lmcache check CONFIG.yaml          # in-engine mode (LMCACHE_CONFIG_FILE)
    saria lmcache check --l2-adapter JSON    # lmcache server's --l2-adapter value

LMCache's in-engine loader only logs a storage plugin it cannot build and runs
without it, so a typo silently turns the SSD tier off; this says what is
wrong, in one line naming the key, and exits 2 -- or prints what saria will
run. It checks what LMCache itself would trip on too: a plugin entry not
listed in ``storage_plugins``, keys nested under ``extra_config`` (LMCache
reads only flat ``storage_plugin.<name>.<key>`` keys), a module path that
does not name saria's class.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from saria.errors import ConfigError
from saria.units import format_size

_CLASSES = {"SariaStoragePlugin": ("saria.lmcache", "saria.lmcache.storage_plugin"),
            "SariaL2Adapter": ("saria.lmcache", "saria.lmcache.l2_adapter")}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("lmcache", help="saria inside LMCache: check a configuration",
                              description=__doc__.split("\n\n", 2)[2])
    sub = p.add_subparsers(dest="lmcache_command", metavar="ACTION")
    sub.required = True
    c = sub.add_parser("check", help="check saria's tier in an LMCache config (YAML or JSON)")
    c.add_argument("config", nargs="?", type=Path, help="an LMCache YAML file (in-engine mode)")
    c.add_argument("--l2-adapter", metavar="JSON", help="the JSON given to lmcache server")
    c.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if (args.config is None) == (args.l2_adapter is None):
        raise ConfigError("saria lmcache check", "give a YAML file or --l2-adapter JSON (one)")
    if args.l2_adapter is not None:
        params = _l2_adapter(args.l2_adapter)
        name, chunk = "--l2-adapter", "learned from the first store"
    else:
        name, params = _yaml(args.config)
        chunk = "from the model's layout"
    _describe(name, params, chunk)
    return 0


def _l2_adapter(text: str):
    from saria.lmcache.params import AdapterParams

    try:
        d = json.loads(text)
    except ValueError as e:
        raise ConfigError("--l2-adapter", f"not JSON: {e}") from None
    if not isinstance(d, dict) or d.get("type") != "plugin":
        raise ConfigError("--l2-adapter", 'saria\'s adapter is {"type": "plugin", ...}')
    _check_class(d.get("class_name"), d.get("module_path"), "SariaL2Adapter", "module_path")
    return AdapterParams.from_dict(d.get("adapter_params", {}))


def _yaml(path: Path):
    from saria.lmcache.params import AdapterParams, plugin_params

    try:
        import yaml
    except ImportError:
        raise ConfigError("saria lmcache check", "reading YAML needs PyYAML (pip install "
                          "'saria[lmcache]')") from None
    try:
        cfg = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(where, f"not YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(cfg, dict):
        raise ConfigError(str(path), "not a mapping of LMCache settings")
    extra = cfg.get("extra_config") or {}
    if not isinstance(extra, dict):
        raise ConfigError("extra_config", "must be a mapping")
    if isinstance(extra.get("storage_plugin"), dict):
        raise ConfigError("extra_config.storage_plugin", "LMCache reads only flat keys: write "
                          "'storage_plugin.<name>.module_path: saria.lmcache', not a nested mapping")
    name, params = plugin_params(extra)
    listed = cfg.get("storage_plugins") or []
    if name not in listed:
        raise ConfigError("storage_plugins", f"does not list {name!r}: LMCache would not load "
                          f"the saria plugin configured under storage_plugin.{name}.*")
    _check_class("SariaStoragePlugin", extra.get(f"storage_plugin.{name}.module_path"),
                 "SariaStoragePlugin", f"storage_plugin.{name}.module_path")
    return f"storage plugin {name!r}", AdapterParams.from_dict(params)


def _check_class(cls, module, want: str, module_key: str) -> None:
    """`cls` must be saria's class `want`, and `module` (named by the config key
    `module_key`) a module that exports it."""
    if cls != want:
        raise ConfigError("class_name", f"is {cls!r}, saria's is {want!r}")
    if module not in _CLASSES[want]:
        raise ConfigError(module_key, f"is {module!r}; use {_CLASSES[want][0]!r}")


def _describe(name: str, p, default_chunk: str) -> None:
    chunk = f"{p.chunk_bytes} B" if p.chunk_bytes else default_chunk
    print(f"ok: {name}: admission {p.admission} ({p.dwpd:g} DWPD), "
          f"{format_size(p.capacity_bytes)} on {len(p.dirs)} drive(s) "
          f"({', '.join(p.dirs)}), DRAM buffer {format_size(p.dram_bytes)}, chunk {chunk}")
