"""saria's L2 adapter in LMCache 0.5.6's multiprocess mode, on CPU: through
LMCache's own StorageManager (store, lookup and lock, load back byte-exact;
admission as documented; a new adapter on the same directory; a corrupted
chunk is a miss) and through ``lmcache server`` (starts with the adapter,
refuses a bad param by name)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("lmcache") is None,
                                reason="needs LMCache: pip install 'saria[lmcache]'")
# LMCache is imported inside the tests, never at collection (see conftest.py).

CHUNK = 32 << 10


def adapter_json(path, **params) -> dict:
    return {"type": "plugin", "module_path": "saria.lmcache", "class_name": "SariaL2Adapter",
            "adapter_params": {"path": str(path), "capacity": "128MiB",
                               "dram": 4 * (CHUNK + 64), **params}}


def hashes(tag: str, n: int) -> list[bytes]:
    out, h = [], b""
    for i in range(n):  # prefix-chained, as LMCache's chunk hashes are
        h = hashlib.sha256(h + f"{tag}-{i}".encode()).digest()
        out.append(h)
    return out


class Session:
    def __init__(self, path, l1_chunks: int = 24, **params) -> None:
        from saria.lmcache.harness import MPDriver, StoreCounter, fill_from_hash, l2_adapter, \
            storage_manager

        self.sm = storage_manager(adapter_json(path, **params), l1_chunks * CHUNK)
        self.counter = StoreCounter()
        self.sm.register_l2_listener(self.counter)
        self.drv = MPDriver(self.sm, CHUNK, fill_from_hash)
        self.adapter = l2_adapter(self.sm)

    def settle(self) -> None:
        """Waits until LMCache's store controller has handed every chunk
        written into L1 to the adapter, the adapter's store thread is done
        with them, and saria's SSD writes have landed."""
        deadline = time.monotonic() + 30
        while self.adapter.store.counters["offered_chunks"] < self.drv.written:
            assert time.monotonic() < deadline, "the store controller did not hand chunks over"
            time.sleep(0.02)
        self.adapter._store_pool.submit(lambda: None).result(timeout=30)  # FIFO, one thread
        self.adapter.store.flush()

    def drop_l1(self, hs: list[bytes]) -> None:
        keys = [self.drv.key(h) for h in hs]
        deadline = time.monotonic() + 30
        while keys and time.monotonic() < deadline:
            keys = [k for k in keys if not self.sm.delete_l1_keys([k])[0]]
            time.sleep(0.02)
        assert not keys, "L1 kept chunks the store controller still holds"

    def close(self) -> None:
        if self.sm is not None:
            self.sm.close()
            self.sm = None


@pytest.fixture
def session(tmp_path):
    made = []

    def make(**kw) -> Session:
        s = Session(tmp_path, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def test_chunks_stored_through_lmcache_come_back_byte_exact_from_saria(session):
    from saria.lmcache import SariaL2Adapter

    s = session(admission="full-duplicate")
    assert isinstance(s.adapter, SariaL2Adapter)
    a = hashes("a", 8)
    assert s.drv.request(a).written == 8
    s.settle()
    assert s.adapter.report_status()["ssd_writes"] == 8
    s.adapter.delete([])                             # publishes the last residency changes
    # LMCache's accounting: all eight held (four moved from the buffer to the SSD)
    assert set(s.counter.stored) == {s.drv.key(h) for h in a} and s.counter.deleted == 0
    s.drop_l1(a)
    r = s.drv.request(a)
    assert (r.l1_hits, r.l2_hits, r.mismatched) == (0, 8, 0)
    st = s.adapter.report_status()
    assert st["is_healthy"] and st["load_hits"] == 8 and st["ssd_bytes_read"] > 0


def test_saria_admission_writes_what_came_back_after_its_first_drop(session):
    """E2 (the default): the buffer's first drop of a chunk is not written;
    a chunk LMCache wanted again after that (an L2 miss, recomputed, stored
    again) is written on its second drop, and is then an L2 hit."""
    s = session(l1_chunks=40)
    a, b, c = hashes("a", 6), hashes("b", 6), hashes("c", 6)
    s.drv.request(a)
    s.drv.request(b)                                 # a's chunks leave the 4-chunk buffer
    s.settle()
    assert s.adapter.report_status()["ssd_writes"] == 0
    s.drop_l1(a)
    r = s.drv.request(a)                             # wanted again: L2 misses, rewritten
    assert r.l2_hits == 0 and r.written == 6
    s.drv.request(c)                                 # a leaves the buffer a second time
    s.settle()
    st = s.adapter.report_status()
    assert st["ssd_writes"] == 6                     # a's six, nothing of b or c
    s.drop_l1(a + b)
    assert s.drv.request(a).l2_hits == 6
    assert s.drv.request(b).l2_hits == 0


def test_a_new_adapter_finds_what_the_last_one_persisted_and_a_corrupted_chunk_is_a_miss(
        session, tmp_path):
    from saria.lmcache.l2_adapter import object_key_digest

    s = session(admission="full-duplicate")
    a = hashes("a", 8)
    s.drv.request(a)
    s.settle()
    cache = s.adapter.store.cache                    # the fourth chunk's SSD slot
    handle = cache.index.slot_of(object_key_digest(s.drv.key(a[3])), "SSD")
    slot_bytes = cache.backend.ssd.slot_bytes
    s.close()
    s2 = session(admission="full-duplicate")
    r = s2.drv.request(a)                            # a restart: L1 empty, saria's SSD kept them
    assert (r.l1_hits, r.l2_hits, r.mismatched) == (0, 8, 0)
    st = s2.adapter.report_status()                  # opened from the journal, counted apart
    assert 0 < st["ssd_recovery_bytes_read"] < 8 * slot_bytes
    assert st["ssd_bytes_read"] == 8 * slot_bytes    # the eight loads, nothing of the open
    s2.close()
    data = tmp_path / "saria-lmcache" / "saria-ssd.data"
    with open(data, "r+b") as f:
        off = 4096 + handle * slot_bytes + 64 + 64 + 1000
        f.seek(off)
        byte = f.read(1)
        f.seek(off)
        f.write(bytes([byte[0] ^ 0xFF]))
    s3 = session(admission="full-duplicate")
    r = s3.drv.request(a)
    assert (r.l2_hits, r.mismatched) == (3, 0)       # the prefix stops at the bad chunk
    assert r.written == 5                            # recomputed from there


# ------------------------------------------------------------------ server

README = Path(__file__).resolve().parents[1] / "docs" / "lmcache.md"  # the LMCache page


def readme_l2_adapter(tmp_path) -> dict:
    """The ``--l2-adapter`` JSON of docs/lmcache.md's ``lmcache server`` command,
    with its drives moved under `tmp_path` and a capacity this disk has."""
    text = README.read_text()
    adapter = json.loads(re.search(r"--l2-adapter '(\{.*?\})'", text).group(1))
    p = adapter["adapter_params"]
    p["path"] = [str(tmp_path / os.path.relpath(d, "/mnt")) for d in p["path"]]
    for d in p["path"]:
        os.makedirs(d)  # LMCache's drives exist before the server starts
    p["capacity"] = "128MiB"
    return adapter


def _free_port() -> int:
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return sk.getsockname()[1]


def _server(l2: dict) -> tuple[subprocess.Popen, int]:
    lmcache = shutil.which("lmcache", path=os.path.dirname(sys.executable))
    assert lmcache, "the lmcache command is not installed beside this python"
    port, http = _free_port(), _free_port()
    env = {**os.environ, "LMCACHE_DISABLE_BANNER": "1"}
    p = subprocess.Popen([lmcache, "server", "--port", str(port), "--http-port", str(http),
                          "--chunk-size", "256", "--l1-size-gb", "0.0625", "--no-l1-use-lazy",
                          "--eviction-policy", "LRU", "--l2-adapter", json.dumps(l2)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    return p, http


@pytest.mark.slow
def test_lmcache_server_starts_with_the_readme_adapter(tmp_path):
    p, http = _server(readme_l2_adapter(tmp_path))
    try:
        deadline = time.monotonic() + 120
        status = None
        while time.monotonic() < deadline and p.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/status", timeout=1) as r:
                    status = json.load(r)
                    break
            except OSError:
                time.sleep(0.5)
        assert status is not None, p.communicate(timeout=5)[0][-3000:]
        adapters = status["storage_manager"]["l2_adapters"]
        text = json.dumps(adapters)
        assert "SariaL2Adapter" in text and "budget" in text and "nvme1" in text
    finally:
        p.send_signal(signal.SIGINT)
        out = p.communicate(timeout=60)[0]
    assert p.returncode in (0, 130) and "Application shutdown complete" in out, out[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("params, message", [
    ({"capacity": "lots"}, "capacity: cannot parse 'lots'"),
    ({"admission": "sometimes"}, "admission: unknown admission policy 'sometimes'"),
    ({"chunk_size": 1}, "chunk_size: unknown key"),
])
def test_lmcache_server_refuses_a_bad_param_by_name(tmp_path, params, message):
    p, _ = _server(adapter_json(tmp_path, **params))
    out = p.communicate(timeout=120)[0]
    assert p.returncode != 0
    assert message in out, out[-3000:]


@pytest.mark.slow
def test_experiment_10_runs_quick(tmp_path):
    """experiments/10_lmcache_adapter.py --quick, as a user runs it: every
    configuration replays the same chunks, no hit returns wrong bytes, fs and
    saria's full duplicate write every chunk, E2 fewer."""
    import csv

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, str(root / "experiments" / "10_lmcache_adapter.py"),
                          "--quick", "--out", str(out)], cwd=root, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    with open(out / "runs.csv", newline="") as f:
        runs = {r["config"]: r for r in csv.DictReader(f)}
    assert set(runs) == {"fs", "saria:full-duplicate", "saria:saria", "saria:budget"}
    assert len({r["chunks"] for r in runs.values()}) == 1
    assert all(r["mismatched"] == "0" for r in runs.values())
    fs, fd, e2 = runs["fs"], runs["saria:full-duplicate"], runs["saria:saria"]
    for r in (fs, fd):  # every chunk stored into L1 reaches the drive, once
        assert 0 < int(r["ssd_chunks_written"]) <= int(r["written"])
    assert int(e2["ssd_chunks_written"]) < int(fd["ssd_chunks_written"])
    with open(out / "bench_l2.csv", newline="") as f:
        assert {r["adapter"] for r in csv.DictReader(f)} == {"fs", "fs O_DIRECT", "saria"}
    assert (out / "lmcache_adapter.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
