"""saria's storage plugin in LMCache's in-engine (non-MP) mode, through
LMCache 0.5.6's own StorageManager on CPU: puts reach saria, gets come back
byte-exact from saria (also after a restart), the YAML snippet of docs/lmcache.md
loads it, and a bad key is named in LMCache's log line."""

from __future__ import annotations

import importlib.util
import logging

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("lmcache") is None,
                                reason="needs LMCache: pip install 'saria[lmcache]'")
# LMCache is imported inside the tests, never at collection (see conftest.py).

CHUNK, LAYERS, HEADS, HEAD = 16, 4, 2, 32



def plugin_config(tmp_path, **extra) -> dict:
    return {"storage_plugin.saria.module_path": "saria.lmcache",
            "storage_plugin.saria.class_name": "SariaStoragePlugin",
            "storage_plugin.saria.path": str(tmp_path),
            "storage_plugin.saria.capacity": "128MiB",
            "storage_plugin.saria.dram": "64KiB",
            **{f"storage_plugin.saria.{k}": v for k, v in extra.items()}}


def manager(extra: dict, local_cpu: bool = False):
    import torch
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.event_manager import EventManager
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend.storage_manager import StorageManager

    cfg = LMCacheEngineConfig.from_defaults(
        chunk_size=CHUNK, local_cpu=local_cpu, max_local_cpu_size=0.05,
        storage_plugins=["saria"], extra_config=extra)
    md = LMCacheMetadata(model_name="test-model", world_size=1, local_world_size=1, worker_id=0,
                         local_worker_id=0, kv_dtype=torch.bfloat16,
                         kv_shape=(LAYERS, 2, CHUNK, HEADS, HEAD), role="worker",
                         chunk_size=CHUNK)
    return StorageManager(cfg, md, event_manager=EventManager())


def test_chunks_come_back_from_saria_byte_exact_and_after_a_restart(tmp_path):
    import torch
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.memory_management import MemoryFormat

    from saria.lmcache import SariaStoragePlugin

    DTYPE = torch.bfloat16
    extra = plugin_config(tmp_path, admission="full-duplicate")
    sm = manager(extra)
    try:
        plug = sm.storage_backends["saria"]
        assert isinstance(plug, SariaStoragePlugin)
        shape = sm.metadata.get_shapes()[0]
        keys, objs, ref = [], [], []
        for i in range(12):
            k = CacheEngineKey(model_name="test-model", world_size=1, worker_id=0,
                               chunk_hash=0xABC000 + i, dtype=DTYPE)
            m = sm.allocate(shape, DTYPE, fmt=MemoryFormat.KV_2LTD)
            m.tensor.copy_(torch.randn(tuple(shape), generator=torch.Generator().manual_seed(i))
                           .to(DTYPE))
            keys.append(k)
            objs.append(m)
            ref.append(bytes(m.byte_array))
        sm.batched_put(keys, objs)
        plug.store.flush()                        # the buffer's SSD writes have landed
        st = plug.store.status()
        assert st["stored_chunks"] == 12 and st["ssd_writes"] == 12
        assert plug.batched_contains(keys, pin=True) == 12   # the engine's lookup
        got = sm.batched_get(keys, location="saria")
        assert [bytes(g.byte_array) for g in got] == ref
        assert got[0].get_shape() == shape and got[0].get_dtype() == DTYPE
        for g in got:
            g.ref_count_down()
        for k in keys:
            plug.unpin(k)
        assert plug.store.status()["load_hits"] == 12
    finally:
        sm.close()
    sm = manager(extra)                           # a new engine on the same drive
    try:
        got = sm.batched_get(keys, location="saria")
        assert [bytes(g.byte_array) for g in got] == ref
        for g in got:
            g.ref_count_down()
    finally:
        sm.close()


def test_a_bad_key_is_named_in_lmcache_log_and_the_engine_has_no_saria(tmp_path, caplog):
    extra = plugin_config(tmp_path, capacity="lots")
    caplog.set_level(logging.ERROR)
    sm = manager(extra)
    try:
        assert "saria" not in sm.storage_backends
    finally:
        sm.close()
    assert any("capacity: cannot parse 'lots'" in r.getMessage() for r in caplog.records)


def test_the_readme_yaml_loads_saria(tmp_path):
    """docs/lmcache.md's in-engine YAML, with its drive under `tmp_path` and a
    capacity this disk has, gives a storage manager with saria in it."""
    from pathlib import Path

    from lmcache.v1.config import LMCacheEngineConfig

    from saria.lmcache import SariaStoragePlugin

    readme = (Path(__file__).resolve().parents[1] / "docs" / "lmcache.md").read_text()
    yaml = readme.split("```yaml\n", 1)[1].split("```", 1)[0]
    yaml = yaml.replace("/mnt/nvme0/kv", str(tmp_path)).replace("2TB", "128MiB")
    yaml = yaml.replace("max_local_cpu_size: 64", "max_local_cpu_size: 0.05")
    (tmp_path / "lmcache.yaml").write_text(yaml)
    cfg = LMCacheEngineConfig.from_file(str(tmp_path / "lmcache.yaml"))
    assert list(cfg.storage_plugins) == ["saria"]
    sm = manager(cfg.extra_config)
    try:
        plug = sm.storage_backends["saria"]
        assert isinstance(plug, SariaStoragePlugin) and plug.store.params.admission == "saria"
    finally:
        sm.close()
