"""The runtime TieredCache on real tiers: bytes that come back are the bytes
that went in, through DRAM and SSD, under threads, after corruption, after a
restart, and with the SSD write queue full; real-mode replay agrees with the
simulator."""

from __future__ import annotations

import threading

import numpy as np

from saria.index import Tier
from saria.keys import BlockHasher, keys_to_array
from saria.runtime import CacheConfig, TieredCache
from saria.sim.real import synthetic_rows
from saria.tiers.ssd import DATA_FILE_NAME

BB = 8192  # block bytes: small blocks keep the tests fast
HASHER = BlockHasher(16, seed="runtime-test")


def keys_for(prefix: int, n: int) -> np.ndarray:
    tokens = [prefix * 100_000 + i for i in range(16 * n)]
    return keys_to_array(HASHER.block_keys(tokens))


def make(tmp_path, **kw) -> TieredCache:
    cfg = dict(block_bytes=BB, dram_bytes=8 * BB, ssd_dirs=(str(tmp_path / "d0"),),
               ssd_bytes=4096 + 64 * (BB + 4096), admission="write-back", promotion="none",
               write_mode="sync")
    cfg.update(kw)
    return TieredCache(CacheConfig(**cfg), clock=lambda: 0.0)


def request(cache: TieredCache, keys: np.ndarray) -> tuple[int, np.ndarray]:
    """One request: lookup, load (verified against the synthetic bytes), store the rest."""
    plan = cache.lookup(keys)
    cache.touch(keys, hits=plan.num_blocks)
    out = np.empty((plan.num_blocks, BB), np.uint8)
    got = cache.load(keys, out, blocks=plan.num_blocks)
    assert (out[: got.blocks] == synthetic_rows(keys[: got.blocks], BB)).all()
    cache.store(keys, synthetic_rows(keys[got.blocks:], BB), start=got.blocks)
    return got.blocks, got.ssd_positions


def test_blocks_round_trip_through_dram_and_ssd(tmp_path):
    with make(tmp_path) as cache:
        a, b = keys_for(1, 6), keys_for(2, 6)
        assert request(cache, a)[0] == 0
        assert request(cache, b)[0] == 0          # a's blocks are pushed to the SSD
        plan = cache.lookup(a)
        assert plan.blocks_from(Tier.SSD) > 0
        hit, from_ssd = request(cache, a)
        assert hit == 6 and from_ssd.size == plan.blocks_from(Tier.SSD)
        assert cache.stats.ssd_write_blocks > 0 and cache.backend.ssd.stats()["total"]["checksum_failures"] == 0


def test_corrupted_ssd_block_is_a_miss_not_wrong_bytes(tmp_path):
    with make(tmp_path) as cache:
        a = keys_for(1, 6)
        request(cache, a)
        request(cache, keys_for(2, 8))            # evicts all of a to the SSD
        plan = cache.lookup(a)
        assert plan.blocks_from(Tier.SSD) == 6
        # Flip one payload byte of a's third block in the data file.
        handle = int(plan.slots[2])
        data = tmp_path / "d0" / DATA_FILE_NAME
        off = 4096 + handle * cache.backend.ssd.slot_bytes + 64 + 100
        with open(data, "r+b") as f:
            f.seek(off)
            byte = f.read(1)
            f.seek(off)
            f.write(bytes([byte[0] ^ 0xFF]))
        out = np.zeros((6, BB), np.uint8)
        got = cache.load(a, out)
        assert got.blocks == 2 and got.failed == 1
        assert (out[:2] == synthetic_rows(a[:2], BB)).all()
        assert cache.stats.ssd_read_failures == 1
        assert cache.lookup(a).num_blocks == 2    # the bad copy left the index


def test_restart_finds_persisted_blocks(tmp_path):
    a = keys_for(1, 6)
    with make(tmp_path, admission="full-duplicate") as cache:
        request(cache, a)
    with make(tmp_path, admission="full-duplicate") as cache:   # a new process would do the same
        plan = cache.lookup(a)
        assert plan.num_blocks == 6 and plan.blocks_from(Tier.SSD) == 6
        out = np.empty((6, BB), np.uint8)
        assert cache.load(a, out).blocks == 6
        assert (out == synthetic_rows(a, BB)).all()
        assert cache.stats.adopted_blocks == 6


def test_restart_from_the_journal_counts_its_reads_apart(tmp_path):
    """A restarted cache adopts its SSD blocks from the journal: the open reads a
    few pages (recovery), not the drive, and "SSD bytes read" stays 0 until a load."""
    a = keys_for(1, 6)
    with make(tmp_path, admission="full-duplicate") as cache:
        request(cache, a)
    with make(tmp_path, admission="full-duplicate") as cache:
        g = cache.gauges()
        assert g["ssd_bytes_read"] == 0 and g["ssd_recovered_unadopted"] == 6
        assert 0 < g["ssd_recovery_bytes_read"] <= 4 * 4096  # superblock, checkpoint, segment
        assert g["ssd_journal_bytes_written"] > 0            # the open's fresh checkpoint
        assert cache.backend.ssd.stats()["drives"][0]["recovery_source"] == "journal"
        assert cache.lookup(a).blocks_from(Tier.SSD) == 6  # adopts them
        out = np.empty((6, BB), np.uint8)
        assert cache.load(a, out).blocks == 6 and (out == synthetic_rows(a, BB)).all()
        assert cache.gauges()["ssd_bytes_read"] == 6 * (BB + 4096)


def _corrupt(cache: TieredCache, tmp_path, handle: int) -> None:
    off = 4096 + handle * cache.backend.ssd.slot_bytes + 64 + 100
    with open(tmp_path / "d0" / DATA_FILE_NAME, "r+b") as f:
        f.seek(off)
        byte = f.read(1)
        f.seek(off)
        f.write(bytes([byte[0] ^ 0xFF]))


def _wait(cond, timeout: float = 20.0) -> bool:
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.02)
    return False


def test_scrub_drops_corrupt_blocks_from_the_index_and_the_recovered(tmp_path):
    a, b = keys_for(1, 6), keys_for(2, 6)
    with make(tmp_path, admission="full-duplicate") as cache:
        request(cache, a)
        request(cache, b)
    rate = 40 * (BB + 4096)  # bytes per second: a pass over 12 blocks in well under a second
    with make(tmp_path, admission="full-duplicate", ssd_scrub_bytes_per_s=rate) as cache:
        # adopt a's blocks; leave b's recovered but not adopted
        assert cache.lookup(a).blocks_from(Tier.SSD) == 6
        assert cache.load(a, np.empty((6, BB), np.uint8)).blocks == 6
        with cache._lock:
            ha = int(cache.lookup(a).slots[3])
            hb = cache.backend.recovered[bytes(b[4])]
        _corrupt(cache, tmp_path, ha)
        _corrupt(cache, tmp_path, hb)
        assert _wait(lambda: cache.gauges()["ssd_scrub_bad_slots"] >= 2)
        assert _wait(lambda: cache.lookup(a).num_blocks == 3)   # the bad copy left the index
        assert bytes(b[4]) not in cache.backend.recovered         # and the recovered set
        assert cache.gauges()["ssd_scrub_bytes_read"] > 0
        assert cache.gauges()["ssd_bytes_read"] == 6 * (BB + 4096)  # only the load above
        assert cache.stats.ssd_read_failures == 0                  # found before any load


def test_full_write_queue_drops_writes_and_never_blocks(tmp_path):
    with make(tmp_path, write_mode="async", write_queue=1, admission="full-duplicate") as cache:
        with cache._lock:  # the writer thread cannot take the lock: the queue stays full
            for i in range(5):
                keys = keys_for(10 + i, 1)
                cache.store(keys, synthetic_rows(keys, BB))
            assert cache.stats.writes_dropped >= 3
        cache.flush()
        assert cache.stats.ssd_write_blocks + cache.stats.writes_dropped == 5


def test_failed_ssd_writes_keep_the_cache_working(tmp_path):
    with make(tmp_path) as cache:
        cache.backend.ssd.inject_failure(0, "write", "ENOSPC", count=100)
        a = keys_for(1, 6)
        request(cache, a)
        request(cache, keys_for(2, 8))
        assert cache.stats.ssd_write_failures > 0
        assert cache.lookup(a).blocks_from(Tier.SSD) == 0   # nothing half-written is indexed
        hit, _ = request(cache, keys_for(2, 8))
        assert hit == 8                                   # DRAM still serves


def test_threads_share_the_cache(tmp_path):
    errors = []
    with make(tmp_path, write_mode="async", dram_bytes=32 * BB,
              ssd_bytes=4096 + 512 * (BB + 4096)) as cache:
        def worker(w: int) -> None:
            try:
                for r in range(15):
                    request(cache, keys_for(w * 100 + r % 5, 4))
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)
        threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        cache.flush()
        cache.index.check()
    assert not errors


def test_real_mode_writes_what_the_simulator_predicts(tmp_path):
    from saria.sim.presets import get_preset
    from saria.sim.real import run_real
    from saria.traces import bundled_trace, load_trace
    from saria.traces.arrivals import ArrivalModel

    # 2 sessions: ~90,000 blocks verified and ~900 SSD writes (4 took 25x as long)
    trace = load_trace(bundled_trace("weka"), limit_sessions=2)
    preset = get_preset("qwen3-8b/h100-gen5-1ssd")
    rep = run_real(trace, "E2", preset, ArrivalModel.from_spec("window:1h"), block_bytes=16384,
                   ssd_dir=tmp_path, dram_bytes=20e9, ssd_bytes=3e12, max_context=None)
    assert rep["mismatched_blocks"] == 0 and rep["blocks_verified"] > 0
    assert rep["ssd_write_blocks"] == rep["sim_ssd_blocks_written"] > 0
    assert rep["ssd_bytes_written_store"] >= rep["ssd_payload_bytes_written"]
    if rep["ssd_bytes_written_os"] is not None:
        assert rep["ssd_bytes_written_os"] >= 0.95 * rep["ssd_bytes_written_store"]
