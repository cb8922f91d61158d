"""The SSD tier engine (saria._store through saria.tiers.ssd.SsdStore).

Everything runs on the real filesystem under tmp_path with O_DIRECT.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from saria import _store
from saria.errors import ConfigError
from saria.tiers import SsdStore, StoreClosedError
from saria.tiers.ssd import DATA_FILE_NAME, DATA_OFFSET, HEADER_BYTES, slot_bytes_for

HERE = Path(__file__).resolve().parent


def keys_for(n: int, tag: bytes = b"k") -> np.ndarray:
    raw = b"".join(hashlib.sha256(tag + i.to_bytes(8, "little")).digest() for i in range(n))
    return np.frombuffer(raw, dtype=np.uint8).reshape(n, 32).copy()


def random_blocks(n: int, bb: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, bb), dtype=np.uint8)


def cap_for(slots: int, bb: int) -> int:
    return DATA_OFFSET + slots * slot_bytes_for(bb)


def data_file(d: Path) -> Path:
    return d / DATA_FILE_NAME


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x5A]))
        f.flush()
        os.fsync(f.fileno())


# ---------------------------------------------------------------------------
# checksum
# ---------------------------------------------------------------------------
def test_crc32c_known_vector_and_paths_agree():
    assert _store.crc32c(b"123456789") == 0xE3069283
    assert _store.crc32c_portable(b"123456789") == 0xE3069283
    rng = np.random.default_rng(1)
    for n in [0, 1, 7, 8, 9, 63, 3071, 3072, 3073, 9001, 1 << 20, (1 << 20) + 5]:
        b = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert _store.crc32c(b) == _store.crc32c_portable(b), n
        cut = n // 3
        assert _store.crc32c(b[cut:], _store.crc32c(b[:cut])) == _store.crc32c(b)


# ---------------------------------------------------------------------------
# round trip, recovery
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("bb", [1, 4032, 4096, 5000, 65539, 1 << 20])
@pytest.mark.parametrize("n_drives", [1, 3])
def test_round_trip_and_reopen(tmp_path, bb, n_drives):
    dirs = [tmp_path / f"d{i}" for i in range(n_drives)]
    n = 24
    cap = cap_for(16, bb)
    keys = keys_for(n)
    data = random_blocks(n, bb, seed=bb)
    with SsdStore(dirs, cap, bb, unit_bytes=64 << 10) as s:
        assert s.capacity_slots == 16 * n_drives
        assert len(s.recovered.handles) == 0
        h = s.write(keys[: n // 2], data[: n // 2])
        h2 = s.write(keys[n // 2 :], data[n // 2 :])
        h = np.concatenate([h, h2])
        if n_drives == 1:
            assert (h[:16] >= 0).all() and (h[16:] == -1).all()
            stored = h >= 0
        else:
            assert (h >= 0).all()
            assert len(set(s.drive_of(h).tolist())) == n_drives  # striped over every drive
            stored = np.ones(n, bool)
        assert len(set(h[stored].tolist())) == stored.sum()
        # read in a scrambled order with a duplicate
        order = np.random.default_rng(0).permutation(np.flatnonzero(stored))
        order = np.concatenate([order, order[:1]])
        out, ok = s.load(h[order], keys[order])
        assert ok.all()
        assert np.array_equal(out, data[order])
        st = s.stats()
        assert st["total"]["blocks_written"] == stored.sum()
        assert st["total"]["payload_bytes_written"] == stored.sum() * bb
        assert st["total"]["bytes_written"] == n_drives * 4096 + stored.sum() * s.slot_bytes
    # reopen: the same blocks come back with the same handles
    with SsdStore(dirs, cap, bb) as s:
        rk, rh, rseq = s.take_recovered()
        got = {bytes(k): int(x) for k, x in zip(rk, rh)}
        want = {bytes(keys[i]): int(h[i]) for i in np.flatnonzero(stored)}
        assert got == want
        assert s.free_slots == s.capacity_slots - stored.sum()
        out, ok = s.load(rh, rk)
        assert ok.all()
        idx = {bytes(keys[i]): i for i in range(n)}
        assert np.array_equal(out, data[[idx[bytes(k)] for k in rk]])
        # opened from the journal: sequence numbers resume 2**32 past the largest
        # entry (above any write whose entry a crash cut)
        assert {d["recovery_source"] for d in s.stats()["drives"]} == {"journal"}
        assert s.stats()["next_seq"] == int(rseq.max()) + 1 + 2**32
        h3 = s.write(keys_for(1, b"new"), random_blocks(1, bb))
        assert h3[0] >= 0 or stored.sum() == s.capacity_slots
        new = int(h3[0])
    # a full scan finds the same blocks; after a scan they continue right after the largest
    with SsdStore(dirs, cap, bb, verify_on_open="full") as s:
        rk, rh, rseq = s.take_recovered()
        want[bytes(keys_for(1, b"new")[0])] = new
        if new < 0:
            del want[bytes(keys_for(1, b"new")[0])]
        assert {bytes(k): int(x) for k, x in zip(rk, rh)} == want
        assert {d["recovery_source"] for d in s.stats()["drives"]} == {"full scan"}
        assert s.stats()["next_seq"] == int(rseq.max()) + 1


def test_header_scan_mode_and_durable(tmp_path):
    bb = 100_000  # slots of 104 KiB > 64 KiB: header-only scan reads one page per slot
    keys, data = keys_for(6), random_blocks(6, bb)
    with SsdStore(tmp_path, cap_for(8, bb), bb, durable=True) as s:
        h = s.write(keys, data)
        s.sync()
    with SsdStore(tmp_path, cap_for(8, bb), bb, verify_on_open="header") as s:
        rk, rh, _ = s.recovered
        assert sorted(rh.tolist()) == sorted(h.tolist())
        # the scan read a page per slot, not the slots themselves, and counts it as recovery
        assert s.stats()["total"]["recovery_bytes_read"] == 4096 + 8 * 4096
        assert s.stats()["total"]["bytes_read"] == 0


def test_duplicate_keys_newest_wins(tmp_path):
    bb = 4096
    k = keys_for(1)
    a, b = random_blocks(1, bb, 1), random_blocks(1, bb, 2)
    with SsdStore(tmp_path, cap_for(8, bb), bb) as s:
        h1 = s.write(k, a)[0]
        h2 = s.write(k, b)[0]
        assert h1 != h2
    with SsdStore(tmp_path, cap_for(8, bb), bb) as s:
        rk, rh, _ = s.recovered
        assert rh.tolist() == [h2]
        assert s.free_slots == 7  # the older copy's slot was freed
        out, ok = s.load(rh, rk)
        assert ok.all() and np.array_equal(out, b)


# ---------------------------------------------------------------------------
# corruption, torn writes
# ---------------------------------------------------------------------------
def test_checksum_corruption_is_a_counted_miss(tmp_path):
    bb = 5000
    n = 6
    keys, data = keys_for(n), random_blocks(n, bb)
    with SsdStore(tmp_path, cap_for(8, bb), bb) as s:
        h = s.write(keys, data)
        sb = s.slot_bytes
        path = data_file(tmp_path)
        flip_byte(path, DATA_OFFSET + int(h[1]) * sb + HEADER_BYTES + 1234)  # payload
        flip_byte(path, DATA_OFFSET + int(h[3]) * sb + 20)  # header: a key byte
        flip_byte(path, DATA_OFFSET + int(h[4]) * sb + 50)  # header: the sequence number
        out = np.full((n, bb), 7, dtype=np.uint8)
        ok = s.read(h, keys, out)
        assert ok.tolist() == [True, False, True, False, False, True]
        for i in (1, 3, 4):
            assert not out[i].any()  # zero-filled, never the corrupt bytes
        for i in (0, 2, 5):
            assert np.array_equal(out[i], data[i])
        st = s.stats()["total"]
        assert st["checksum_failures"] == 3
        assert st["blocks_read"] == 3
        # the right slot with the wrong key: a key mismatch, also a miss
        ok = s.read(h[:1], keys[2:3], out[:1])
        assert not ok[0] and not out[0].any()
        assert s.stats()["total"]["key_mismatches"] == 1
        # a bad handle
        ok = s.read([10**6], keys[:1], out[:1])
        assert not ok[0] and s.stats()["bad_handles"] == 1
    # opened from the journal, the corrupt slots are still listed (the journal is a
    # hint): they are misses when loaded, and the scrub finds them
    with SsdStore(tmp_path, cap_for(8, bb), bb) as s:
        rk, rh, _ = s.recovered
        assert sorted(rh.tolist()) == sorted(h.tolist())
        by_handle = {int(x): bytes(k) for k, x in zip(rk, rh)}
        out, ok = s.load(h, keys)
        assert ok.tolist() == [True, False, True, False, False, True]
        rep = s.scrub(100)
        assert sorted(rep.handles.tolist()) == sorted(h[[1, 3, 4]].tolist())
        assert all(bytes(k) == by_handle[int(x)] for k, x in zip(rep.keys, rep.handles))
        assert rep.checked == 6 and rep.bytes_read == 6 * sb and rep.wrapped
        st = s.stats()["total"]
        assert st["scrub_bytes_read"] == 6 * sb and st["scrub_bad_slots"] == 3
        assert st["bytes_read"] == 6 * sb  # the loads above, not the scrub
    # a full scan drops them at open
    with SsdStore(tmp_path, cap_for(8, bb), bb, verify_on_open="full") as s:
        rk, rh, _ = s.recovered
        assert sorted(rh.tolist()) == sorted(h[[0, 2, 5]].tolist())
        assert s.stats()["total"]["recovery_invalid_slots"] == 3


@pytest.mark.parametrize("mode", ["journal", "full"])
def test_torn_write_dropped_on_recovery(tmp_path, mode):
    bb = 3 * 4096
    keys, data = keys_for(4), random_blocks(4, bb)
    with SsdStore(tmp_path, cap_for(4, bb), bb) as s:
        h = s.write(keys, data)
        sb = s.slot_bytes
    # Tear slot h[2]: its first page is a newer record's header, the rest is the old payload.
    with open(data_file(tmp_path), "r+b") as f:
        f.seek(DATA_OFFSET + int(h[0]) * sb)
        first_page = f.read(4096)
        f.seek(DATA_OFFSET + int(h[2]) * sb)
        f.write(first_page)
        # a partial write: only the first page of slot h[3] made it, the rest is zero
        f.seek(DATA_OFFSET + int(h[3]) * sb + 4096)
        f.write(bytes(sb - 4096))
    with SsdStore(tmp_path, cap_for(4, bb), bb, verify_on_open=mode) as s:
        rk, rh, _ = s.recovered
        if mode == "full":
            assert sorted(rh.tolist()) == sorted(h[:2].tolist())
            assert s.stats()["total"]["recovery_invalid_slots"] == 2
        else:  # the journal lists them: a miss when loaded
            assert sorted(rh.tolist()) == sorted(h.tolist())
        out, ok = s.load(h, keys)
        assert ok.tolist() == [True, True, False, False]
        assert np.array_equal(out[:2], data[:2]) and not out[2:].any()


# ---------------------------------------------------------------------------
# SIGKILL mid-burst
# ---------------------------------------------------------------------------
def _derived(key: bytes, n: int) -> bytes:
    return hashlib.shake_128(key).digest(n)


def kill_a_writer(d: Path, rng, cap: int, bb: int, slots: int, batch: int, compact: int,
                  parts: int = 1) -> dict[int, bytes]:
    """Runs tests/ssd_crash_writer.py on `d` until it has wrapped around the
    drive at least once (frees and reuses slots), SIGKILLs it at a random
    moment with writes in flight; returns the blocks it reported written and
    not freed: handle -> key."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "ssd_crash_writer.py"), str(d), str(cap), str(bb), str(batch),
         str(compact), str(parts)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == b"READY", proc.stderr.read().decode() if proc.stderr else ""
    lines: list[bytes] = []
    target = slots * 2 + int(rng.integers(0, slots))
    while len(lines) < target:
        line = proc.stdout.readline()
        assert line, proc.stderr.read().decode() if proc.stderr else "writer exited"
        lines.append(line)
    time.sleep(float(rng.uniform(0, 0.006)))
    proc.send_signal(signal.SIGKILL)
    rest = proc.stdout.read()
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    # a last line without its newline was cut by the kill: not a completion report
    lines += [line for line in rest.splitlines(keepends=True) if line.endswith(b"\n")]
    completed: dict[int, bytes] = {}
    for line in lines:
        fields = line.split()
        if not fields or not line.endswith(b"\n"):
            continue
        if fields[0] == b"W":
            completed[int(fields[1])] = bytes.fromhex(fields[2].decode())
        elif fields[0] == b"F":
            completed.pop(int(fields[1]), None)
    return completed


@pytest.mark.parametrize("run", range(6))
def test_sigkill_mid_write_burst_recovers_completed_blocks(tmp_path, run):
    """SIGKILL of a writer at a random point -- slot writes, journal appends and
    (with a small compaction threshold) checkpoints in flight -- then reopen:
    the journal is usable, every acknowledged block is found at its handle and
    reads back byte-exact, everything else listed is its key's bytes or a miss;
    a full scan of the same drive finds every acknowledged block too."""
    rng = np.random.default_rng(run)
    bb = 3 * 4096 + 100
    slots = 400
    batch = 16
    compact = (0, 24, 40)[run % 3]
    cap = cap_for(slots, bb)
    completed = kill_a_writer(tmp_path, rng, cap, bb, slots, batch, compact)
    assert len(completed) >= batch

    for mode in ("journal", "full"):
        with SsdStore(tmp_path, cap, bb, verify_on_open=mode) as s:
            st = s.stats()["total"]
            assert s.stats()["drives"][0]["recovery_source"] == ("journal" if mode == "journal" else "full scan")
            if mode == "journal":  # megabytes at most, not the drive
                assert st["recovery_bytes_read"] < cap // 10
            rk, rh, _ = s.take_recovered()
            found = {int(h): bytes(k) for k, h in zip(rk, rh)}
            # every completed (and not freed) block is found again, same handle, same key
            for h, k in completed.items():
                assert found.get(h) == k, f"{mode}: completed block at handle {h} not recovered"
            # every recovered block reads back as exactly its key's bytes, or is a miss
            out, ok = s.load(rh, rk)
            for i, k in enumerate(rk):
                if ok[i]:
                    assert out[i].tobytes() == _derived(bytes(k), bb)
                else:
                    assert int(rh[i]) not in completed and not out[i].any()
            if mode == "full":
                assert ok.all()  # a scan lists only records that verify
            # the store keeps working after the crash
            k1 = keys_for(1, b"after" + mode.encode())
            h = s.write(k1, np.frombuffer(_derived(bytes(k1[0]), bb), np.uint8).reshape(1, bb))
            assert h[0] >= 0 or s.free_slots == 0


# ---------------------------------------------------------------------------
# capacity, accounting
# ---------------------------------------------------------------------------
def test_capacity_fill_free_reuse_exact_bytes(tmp_path):
    bb = 6000
    slots = 10
    with SsdStore(tmp_path, cap_for(slots, bb), bb) as s:
        sb = s.slot_bytes
        assert sb == 8192
        keys, data = keys_for(12), random_blocks(12, bb)
        h = s.write(keys, data)
        assert (h[:10] >= 0).all() and (h[10:] == -1).all()
        assert s.free_slots == 0
        assert s.stats()["no_space"] == 2
        freed = h[[1, 2, 3, 7]]
        assert s.free(freed) == 4
        assert s.free(freed[:1]) == 0 and s.stats()["bad_frees"] == 1  # double free is refused
        assert s.free_slots == 4
        k2, d2 = keys_for(4, b"two"), random_blocks(4, bb, 9)
        h2 = s.write(k2, d2)
        assert sorted(h2.tolist()) == sorted(freed.tolist())  # the freed space is reused
        assert s.free_slots == 0
        keep = [0, 4, 5, 6, 8, 9]
        out, ok = s.load(np.concatenate([h[keep], h2]), np.concatenate([keys[keep], k2]))
        assert ok.all() and np.array_equal(out, np.concatenate([data[keep], d2]))
        st = s.stats()["drives"][0]
        assert st["bytes_written"] == 4096 + 14 * sb
        assert st["payload_bytes_written"] == 14 * bb
        assert st["bytes_read"] == 10 * sb  # a new file is not scanned
        assert st["payload_bytes_read"] == 10 * bb
        assert os.path.getsize(data_file(tmp_path)) == 4096 + slots * sb


def _proc_io() -> dict[str, int]:
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(": ") for line in f)}


def test_bytes_written_match_the_kernel_counters(tmp_path):
    if not os.path.exists("/proc/self/io"):
        pytest.skip("/proc/self/io is not available")
    bb = 1 << 20
    n = 64
    keys, data = keys_for(n), random_blocks(n, bb)
    with SsdStore([tmp_path / "a", tmp_path / "b"], cap_for(n, bb), bb) as s:
        before, st0 = _proc_io(), s.stats()["total"]
        h = s.write(keys, data)
        mid, st1 = _proc_io(), s.stats()["total"]
        out, ok = s.load(h, keys)
        after, st2 = _proc_io(), s.stats()["total"]
    assert ok.all() and np.array_equal(out, data)
    ours_w = st1["bytes_written"] - st0["bytes_written"]
    ours_r = st2["bytes_read"] - st1["bytes_read"]
    kern_w = mid["write_bytes"] - before["write_bytes"]
    kern_r = after["read_bytes"] - mid["read_bytes"]
    assert ours_w == n * (bb + 4096)
    assert ours_r == n * (bb + 4096)
    # the kernel counts what this process sent to the block layer: O_DIRECT
    # writes included; allow 1% for anything else the process did meanwhile
    assert abs(kern_w - ours_w) <= 0.01 * ours_w, (kern_w, ours_w)
    assert abs(kern_r - ours_r) <= 0.01 * ours_r, (kern_r, ours_r)


# ---------------------------------------------------------------------------
# failures
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("err", ["ENOSPC", "EIO", "EFBIG"])
def test_injected_write_failure_on_one_of_two_drives(tmp_path, err):
    bb = 8192
    dirs = [tmp_path / "a", tmp_path / "b"]
    with SsdStore(dirs, cap_for(32, bb), bb) as s:
        keys, data = keys_for(20), random_blocks(20, bb)
        h0 = s.write(keys[:4], data[:4])
        assert (h0 >= 0).all() and set(s.drive_of(h0).tolist()) == {0, 1}
        # Every pwrite of this batch on drive 0 fails (a batch may be cut into
        # several I/Os per drive; those that succeed would stay valid).
        s.inject_failure(0, "write", err, count=100)
        h1 = s.write(keys[4:12], data[4:12])
        d1 = s.drive_of(h1)
        # the batch was striped: the half on drive 0 failed, the half on drive 1 is stored
        assert (h1[:4] == -1).all() or (h1[4:] == -1).all()
        assert ((h1 >= 0) == (d1 == 1)).all() and (h1 >= 0).sum() == 4
        st = s.stats()
        d0 = st["drives"][0]
        assert d0["failed"] and d0["last_errno"] == getattr(errno, err)
        assert d0["write_errors"] == 4 and d0["injected_failures"] >= 1
        assert os.strerror(getattr(errno, err)) in d0["last_error"]
        assert not st["drives"][1]["failed"]
        assert st["total"]["failed_drives"] == 1
        # the failed drive gets no new blocks; its old blocks still read (verified)
        h2 = s.write(keys[12:16], data[12:16])
        assert (h2 >= 0).all() and (s.drive_of(h2) == 1).all()
        good = np.concatenate([h0, h1[h1 >= 0], h2])
        gk = np.concatenate([keys[:4], keys[4:12][h1 >= 0], keys[12:16]])
        gd = np.concatenate([data[:4], data[4:12][h1 >= 0], data[12:16]])
        out, ok = s.load(good, gk)
        assert ok.all() and np.array_equal(out, gd)
        # a read error is a counted miss with zeroed output; the drive stays usable
        s.inject_failure(1, "read", "EIO", count=100)
        out, ok = s.load(h2, keys[12:16])
        assert not ok.any() and not out.any()
        st = s.stats()["drives"][1]
        assert st["read_errors"] == 4 and not st["failed"] and st["last_errno"] == errno.EIO
        s.inject_failure(1, "read", "EIO", count=0)  # clear what is left of the injection
        out, ok = s.load(h2, keys[12:16])
        assert ok.all()
        # the operator fixes drive 0
        s.inject_failure(0, "write", err, count=0)  # the fault is gone
        s.revive(0)
        h3 = s.write(keys[16:20], data[16:20])
        assert (h3 >= 0).all() and set(s.drive_of(h3).tolist()) == {0, 1}


def test_all_drives_failed_or_full_keeps_serving(tmp_path):
    bb = 4096
    with SsdStore(tmp_path, cap_for(8, bb), bb) as s:
        keys, data = keys_for(4), random_blocks(4, bb)
        h = s.write(keys[:2], data[:2])
        s.inject_failure(0, "write", errno.EIO, count=100)
        assert (s.write(keys[2:], data[2:]) == -1).all()
        assert (s.write(keys[2:], data[2:]) == -1).all()  # nowhere to go: refused, not crashed
        assert s.stats()["no_space"] == 2
        out, ok = s.load(h, keys[:2])
        assert ok.all() and np.array_equal(out, data[:2])


def test_drive_directory_removed_while_open(tmp_path):
    bb = 4096
    dirs = [tmp_path / "a", tmp_path / "b"]
    keys, data = keys_for(12), random_blocks(12, bb)
    with SsdStore(dirs, cap_for(16, bb), bb) as s:
        h = s.write(keys[:4], data[:4])
        shutil.rmtree(dirs[0])
        st = s.stats()  # the health check runs with stats() and with every write
        assert st["drives"][0]["failed"] and st["drives"][0]["last_errno"] == errno.ENOENT
        assert "no longer reachable" in st["drives"][0]["last_error"]
        h2 = s.write(keys[4:12], data[4:12])
        assert (h2 >= 0).all() and (s.drive_of(h2) == 1).all()
        # blocks of the vanished drive: the open file still verifies, or they miss; never wrong bytes
        out, ok = s.load(np.concatenate([h, h2]), keys)
        assert ok[4:].all()
        assert np.array_equal(out[ok], data[ok])
        s.revive(0)  # refused: the data file is gone
        assert s.stats()["drives"][0]["failed"]


def test_degraded_open(tmp_path):
    bb = 4096
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    good = tmp_path / "good"
    with pytest.raises(NotADirectoryError):
        SsdStore([blocker, good], cap_for(4, bb), bb)
    with SsdStore([blocker, good], cap_for(4, bb), bb, allow_degraded=True) as s:
        st = s.stats()
        assert st["drives"][0]["failed"] and st["drives"][0]["last_errno"] == errno.ENOTDIR
        h = s.write(keys_for(3), random_blocks(3, bb))
        assert (s.drive_of(h) == 1).all()


@pytest.fixture
def small_tmpfs(tmp_path):
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2M", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a 2 MiB tmpfs here: {r.stderr.strip() or r.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_real_enospc_on_a_small_tmpfs(small_tmpfs, tmp_path):
    bb = 60_000  # 64 KiB slots
    # pre-allocating more than the filesystem holds fails at open, naming the drive
    with pytest.raises(OSError) as e:
        SsdStore([small_tmpfs / "big"], cap_for(64, bb), bb)
    assert e.value.errno == errno.ENOSPC and "big" in str(e.value)
    assert not (small_tmpfs / "big" / DATA_FILE_NAME).exists()
    # a sparse file on a 2 MiB filesystem: writes run into ENOSPC for real
    try:
        s = SsdStore([small_tmpfs / "d", tmp_path / "disk"], cap_for(64, bb), bb, preallocate=False)
    except OSError as ex:
        if ex.errno == errno.EINVAL:
            pytest.skip(f"tmpfs here does not take O_DIRECT: {ex}")
        raise
    with s:
        stored = []
        for i in range(80):
            k, d = keys_for(1, b"t%d" % i), random_blocks(1, bb, i)
            s_h = s.write(k, d)
            if s_h[0] >= 0:
                stored.append((s_h[0], k, d))
            if s.stats()["drives"][0]["failed"]:
                break
        st = s.stats()["drives"][0]
        assert st["failed"] and st["last_errno"] == errno.ENOSPC, st
        assert st["write_errors"] >= 1
        # everything that was stored reads back; later writes go to the other drive
        for h, k, d in stored:
            out, ok = s.load([h], k)
            assert ok.all() and np.array_equal(out, d)
        h = s.write(keys_for(2, b"after"), random_blocks(2, bb))
        assert (h >= 0).all() and (s.drive_of(h) == 1).all()


# ---------------------------------------------------------------------------
# threads
# ---------------------------------------------------------------------------
def test_concurrent_store_and_load_from_threads(tmp_path):
    bb = 40_000
    n_threads, rounds, per = 6, 12, 9
    dirs = [tmp_path / "a", tmp_path / "b"]
    errors: list[str] = []
    with SsdStore(dirs, cap_for(n_threads * per * 2, bb), bb, threads=4) as s:

        def worker(t: int) -> None:
            rng = np.random.default_rng(t)
            live: list[tuple[int, np.ndarray, np.ndarray]] = []
            try:
                for r in range(rounds):
                    keys = keys_for(per, b"t%d-r%d" % (t, r))
                    data = rng.integers(0, 256, (per, bb), dtype=np.uint8)
                    h = s.write(keys, data)
                    if (h < 0).any():
                        errors.append(f"thread {t}: write failed {h}")
                        return
                    live += [(int(h[i]), keys[i], data[i]) for i in range(per)]
                    hs = np.array([x[0] for x in live])
                    out, ok = s.load(hs, np.stack([x[1] for x in live]))
                    if not ok.all() or not np.array_equal(out, np.stack([x[2] for x in live])):
                        errors.append(f"thread {t} round {r}: bad read")
                        return
                    if len(live) > per:  # free the oldest batch
                        s.free([x[0] for x in live[:per]])
                        live = live[per:]
            except Exception as e:  # pragma: no cover - reported below
                errors.append(f"thread {t}: {e!r}")

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errors, errors
        st = s.stats()
        assert st["total"]["checksum_failures"] == 0 and st["total"]["key_mismatches"] == 0
        assert st["total"]["blocks_written"] == n_threads * rounds * per
        assert s.free_slots == s.capacity_slots - n_threads * per


def test_gil_is_released_during_io(tmp_path):
    bb = 1 << 20
    n = 48
    keys, data = keys_for(n), random_blocks(n, bb)
    ticks = 0
    stop = False

    def spin() -> None:
        nonlocal ticks
        while not stop:
            ticks += 1

    with SsdStore(tmp_path, cap_for(n, bb), bb) as s:
        th = threading.Thread(target=spin)
        th.start()
        time.sleep(0.01)
        t0 = ticks
        h = s.write(keys, data)
        out, ok = s.load(h, keys)
        t1 = ticks
        stop = True
        th.join()
    assert ok.all()
    # with the GIL held for the whole I/O, the spinning thread would hardly move
    assert t1 - t0 > 1000


# ---------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------
def test_validation_errors_name_the_argument(tmp_path):
    bb = 4096
    with pytest.raises(ConfigError, match="block_bytes"):
        SsdStore(tmp_path, 1 << 20, 0)
    with pytest.raises(ConfigError, match="capacity_bytes"):
        SsdStore(tmp_path, 4096, bb)
    with pytest.raises(ConfigError, match="capacity_bytes"):
        SsdStore([tmp_path / "a", tmp_path / "b"], [1 << 20], bb)
    with pytest.raises(ConfigError, match="dirs"):
        SsdStore([], 1 << 20, bb)
    with pytest.raises(ConfigError, match="dirs"):
        SsdStore([tmp_path, tmp_path], 1 << 20, bb)
    with pytest.raises(ConfigError, match="verify_on_open"):
        SsdStore(tmp_path, 1 << 20, bb, verify_on_open="some")
    s = SsdStore(tmp_path, cap_for(4, bb), bb)
    with pytest.raises(ConfigError, match="keys"):
        s.write(np.zeros((2, 31), np.uint8), np.zeros((2, bb), np.uint8))
    with pytest.raises(ConfigError, match="data"):
        s.write(keys_for(2), np.zeros((2, bb - 1), np.uint8))
    with pytest.raises(ConfigError, match="out"):
        s.read([0], keys_for(1), np.zeros((1, bb), np.int32))
    with pytest.raises(ConfigError, match="errno"):
        s.inject_failure(0, "write", "ENOTANERRNO")
    with pytest.raises(ConfigError, match="drive"):
        s.inject_failure(3, "write", "EIO")
    s.close()
    s.close()
    with pytest.raises(StoreClosedError):
        s.write(keys_for(1), np.zeros((1, bb), np.uint8))
    # reopening with another geometry is refused, naming the argument
    with pytest.raises(ConfigError, match="block_bytes"):
        SsdStore(tmp_path, cap_for(4, bb), 2 * bb)
    with pytest.raises(ConfigError, match="capacity_bytes"):
        SsdStore(tmp_path, cap_for(5, bb), bb)
    # a file that is not ours
    other = tmp_path / "other"
    other.mkdir()
    (other / DATA_FILE_NAME).write_bytes(b"x" * 8192)
    with pytest.raises(ConfigError, match="dirs"):
        SsdStore(other, cap_for(1, bb), bb)
    # non-uint8 rows of the right byte length are accepted
    with SsdStore(tmp_path / "f", cap_for(2, bb), bb) as s2:
        rows = np.arange(2 * bb // 4, dtype=np.float32).reshape(2, bb // 4)
        h = s2.write(keys_for(2), rows)
        out, ok = s2.load(h, keys_for(2))
        assert ok.all() and np.array_equal(out.view(np.float32), rows)


def test_allocator_random_ops_against_a_model(tmp_path):
    bb = 100
    slots = [7, 5]
    rng = np.random.default_rng(5)
    with SsdStore([tmp_path / "a", tmp_path / "b"], [cap_for(n, bb) for n in slots], bb) as s:
        # a fresh drive is written as a log: one batch -> consecutive slots
        h = s.write(keys_for(4, b"first"), random_blocks(4, bb))
        assert sorted(h.tolist()) == [0, 1, 7, 8]
        s.free(h)
        live: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for step in range(300):
            if rng.random() < 0.55:
                n = int(rng.integers(1, 6))
                keys, data = keys_for(n, b"s%d" % step), random_blocks(n, bb, step)
                h = s.write(keys, data)
                want = min(n, sum(slots) - len(live))
                assert (h >= 0).sum() == want
                for i, x in enumerate(h.tolist()):
                    if x >= 0:
                        assert x not in live, "slot handed out twice"
                        live[x] = (keys[i], data[i])
            elif live:
                pick = rng.choice(sorted(live), size=min(len(live), int(rng.integers(1, 5))), replace=False)
                assert s.free(pick) == len(pick)
                for x in pick.tolist():
                    del live[x]
            assert s.free_slots == sum(slots) - len(live)
        hs = np.array(sorted(live), dtype=np.int64)
        if len(hs):
            out, ok = s.load(hs, np.stack([live[x][0] for x in hs]))
            assert ok.all() and np.array_equal(out, np.stack([live[x][1] for x in hs]))


# ---------------------------------------------------------------------------
# readers and the one owner per drive
# ---------------------------------------------------------------------------
def test_a_reader_sees_what_the_owner_writes(tmp_path):
    """The vLLM workers' view: the owner's drive files opened read-only,
    O_DIRECT, every block verified (key, header and payload crc)."""
    bb = 8192
    dirs = [tmp_path / "d0", tmp_path / "d1"]
    with SsdStore(dirs, cap_for(32, bb), bb) as owner:
        keys, data = keys_for(20), random_blocks(20, bb)
        h = owner.write(keys[:10], data[:10])
        with SsdStore.reader(dirs, bb) as reader:
            assert reader.read_only and reader.capacity_slots == owner.capacity_slots
            out, ok = reader.load(h, keys[:10])
            assert ok.all() and (out == data[:10]).all()
            h2 = owner.write(keys[10:], data[10:])       # written after the reader opened
            out, ok = reader.load(h2, keys[10:])
            assert ok.all() and (out == data[10:]).all()
            _, ok = reader.load(h2[:2], keys[:2])        # wrong key: refused
            assert not ok.any()
            flip_byte(data_file(dirs[int(owner.drive_of(h[3:4])[0])]),
                      DATA_OFFSET + (int(h[3]) - int(owner._bases[owner.drive_of(h[3:4])[0]]))
                      * slot_bytes_for(bb) + HEADER_BYTES + 5)
            out, ok = reader.load(h[3:4], keys[3:4])
            assert not ok[0] and not out.any()
            assert reader.stats()["total"]["checksum_failures"] == 1
            with pytest.raises(Exception, match="read-only reader"):
                reader.free(h[:1])
            with pytest.raises(Exception, match="read-only reader"):
                reader.write(keys[:1], data[:1])


def test_a_reader_needs_the_owners_files_and_block_size(tmp_path):
    bb = 8192
    with pytest.raises(OSError, match="cannot open .* to read"):
        SsdStore.reader([tmp_path / "none"], bb)
    with SsdStore([tmp_path / "d0"], cap_for(4, bb), bb):
        with pytest.raises(ConfigError, match="block_bytes: .* was created with block_bytes=8192"):
            SsdStore.reader([tmp_path / "d0"], 4096)


OWNER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from saria.tiers.ssd import SsdStore
s = SsdStore([sys.argv[2]], int(sys.argv[3]), 8192)
print("ready", flush=True)
time.sleep(600)
"""


def test_one_owner_per_drive_across_processes(tmp_path):
    """A second owner of a drive directory is refused, naming the holder's
    pid; the lock dies with its holder (kill -9), so a restart takes over."""
    d = tmp_path / "d0"
    child = subprocess.Popen([sys.executable, "-c", OWNER, str(HERE.parent), str(d),
                              str(cap_for(8, 8192))], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        with pytest.raises(OSError, match=f"{d} is in use by another saria cache "
                                          f"\\(pid {child.pid}\\)") as e:
            SsdStore([d], cap_for(8, 8192), 8192)
        assert e.value.errno == errno.EBUSY
        with SsdStore.reader([d], 8192) as reader:      # readers take no lock
            assert reader.capacity_slots == 8
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    with SsdStore([d], cap_for(8, 8192), 8192) as store:  # the holder died: free
        assert store.free_slots == 8
