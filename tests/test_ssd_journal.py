"""The SSD store's journal (native/store/journal.h): opens read it instead of
the drive, a journal that does not verify falls back to a scan, a torn tail
is dropped, journal write failures never acknowledge a block, compaction,
the scrub, and ``saria store check``. The SIGKILL crash tests are in
test_ssd_store.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from budgets import examples

from saria.errors import ConfigError
from saria.tiers.ssd import DATA_FILE_NAME, DATA_OFFSET, HEADER_BYTES, SsdStore, check_drive
from test_ssd_store import cap_for, flip_byte, keys_for, random_blocks

CKPT, SEG = "saria-ssd.ckpt", "saria-ssd.journal"


def recovered(s: SsdStore) -> dict[bytes, int]:
    rk, rh, _ = s.take_recovered()
    return {bytes(k): int(h) for k, h in zip(rk, rh)}


def source(s: SsdStore) -> str:
    return s.stats()["drives"][0]["recovery_source"]


def filled(tmp_path, n=20, slots=32, bb=5000, **kw):
    keys, data = keys_for(n), random_blocks(n, bb)
    with SsdStore(tmp_path, cap_for(slots, bb), bb, **kw) as s:
        h = s.write(keys, data)
    assert (h >= 0).all()
    return keys, data, h, cap_for(slots, bb), bb


def test_open_reads_the_journal_not_the_drive(tmp_path):
    keys, data, h, cap, bb = filled(tmp_path, n=200, slots=256, bb=64 << 10)
    with SsdStore(tmp_path, cap, bb) as s:
        assert source(s) == "journal"
        assert recovered(s) == {bytes(k): int(x) for k, x in zip(keys, h)}
        st_ = s.stats()["total"]
        # superblock + the empty checkpoint of the creation + the segment: its header
        # page and 200 entries of 64 B in whole pages
        assert st_["recovery_bytes_read"] == 4096 + 4096 + 4096 + 4 * 4096
        assert st_["recovery_bytes_read"] < 0.01 * cap
        assert st_["bytes_read"] == 0  # what the open read is not "SSD bytes read"
        out, ok = s.load(h, keys)
        assert ok.all() and np.array_equal(out, data)


@pytest.mark.parametrize("damage", ["checkpoint entry", "checkpoint header", "segment header",
                                    "segment middle entry", "segment missing", "checkpoint missing",
                                    "another store's journal"])
def test_a_journal_that_does_not_verify_falls_back_to_a_scan(tmp_path, damage):
    d = tmp_path / "d"
    keys, data, h, cap, bb = filled(d, n=10)
    # a few more calls so the segment holds entries after the checkpoint
    with SsdStore(d, cap, bb) as s:
        h2 = s.write(keys_for(6, b"more"), random_blocks(6, bb, 1))
        h3 = s.write(keys_for(3, b"last"), random_blocks(3, bb, 2))
    want = {bytes(k): int(x) for k, x in zip(keys, h)}
    want.update({bytes(k): int(x) for k, x in zip(keys_for(6, b"more"), h2)})
    want.update({bytes(k): int(x) for k, x in zip(keys_for(3, b"last"), h3)})
    if damage == "checkpoint entry":
        flip_byte(d / CKPT, 4096 + 64 * 3 + 20)
    elif damage == "checkpoint header":
        flip_byte(d / CKPT, 18)
    elif damage == "segment header":
        flip_byte(d / SEG, 30)
    elif damage == "segment middle entry":
        flip_byte(d / SEG, 4096 + 64 * 2 + 9)  # the first call's entries, good ones after
    elif damage == "segment missing":
        os.unlink(d / SEG)
    elif damage == "checkpoint missing":
        os.unlink(d / CKPT)
    else:
        other = tmp_path / "other"
        filled(other, n=10)
        shutil.copy(other / CKPT, d / CKPT)
        shutil.copy(other / SEG, d / SEG)
    with SsdStore(d, cap, bb) as s:
        assert source(s).startswith("full scan ("), source(s)
        assert recovered(s) == want
        assert s.stats()["total"]["recovery_bytes_read"] >= cap - 4096
    with SsdStore(d, cap, bb) as s:  # the scan wrote a fresh journal
        assert source(s) == "journal"
        assert recovered(s) == want


def test_a_torn_tail_is_dropped_and_the_rest_kept(tmp_path):
    keys, data, h, cap, bb = filled(tmp_path, n=10)
    with SsdStore(tmp_path, cap, bb) as s:
        h2 = s.write(keys_for(5, b"more"), random_blocks(5, bb, 1))
    # an append the crash cut: half an entry of garbage after the last good one
    seg = tmp_path / SEG
    raw = bytearray(seg.read_bytes())
    raw[4096 + 5 * 64: 4096 + 5 * 64 + 30] = os.urandom(30)
    seg.write_bytes(bytes(raw))
    with SsdStore(tmp_path, cap, bb) as s:
        assert source(s) == "journal"
        assert s.stats()["drives"][0]["journal_dropped_tail"] == 1
        got = recovered(s)
        for k, x in zip(keys_for(5, b"more"), h2):
            assert got[bytes(k)] == int(x)
        assert len(got) == 15


def test_a_store_without_journal_removes_it_and_the_next_open_scans(tmp_path):
    keys, data, h, cap, bb = filled(tmp_path, n=8)
    assert (tmp_path / CKPT).exists() and (tmp_path / SEG).exists()
    with SsdStore(tmp_path, cap, bb, journal=False, verify_on_open="full") as s:
        assert not (tmp_path / CKPT).exists() and not (tmp_path / SEG).exists()
        h2 = s.write(keys_for(4, b"nj"), random_blocks(4, bb, 3))  # the journal would miss these
    with SsdStore(tmp_path, cap, bb) as s:
        assert source(s).startswith("full scan (missing")
        got = recovered(s)
        assert all(got[bytes(k)] == int(x) for k, x in zip(keys_for(4, b"nj"), h2))
        assert len(got) == 12
    with pytest.raises(ConfigError, match="verify_on_open"):
        SsdStore(tmp_path, cap, bb, journal=False)


def test_a_failed_journal_append_acknowledges_nothing(tmp_path):
    bb = 5000
    cap = cap_for(16, bb)
    with SsdStore([tmp_path / "a", tmp_path / "b"], cap, bb) as s:
        s.inject_failure(0, "journal", "EIO")
        h = s.write(keys_for(8), random_blocks(8, bb))
        d = s.drive_of(h.clip(0))
        st_ = s.stats()
        assert st_["drives"][0]["failed"] and "journal" in st_["drives"][0]["last_error"]
        assert not st_["drives"][1]["failed"]
        assert (h[:4] == -1).all() and (h[4:] >= 0).all() and (d[4:] == 1).all()
        assert st_["drives"][0]["free_slots"] == 16  # given back
        s.revive(0)  # writes a checkpoint: the drive has a journal again
        assert not s.stats()["drives"][0]["failed"]
        h2 = s.write(keys_for(8, b"again"), random_blocks(8, bb))
        assert (h2 >= 0).all()
    with SsdStore([tmp_path / "a", tmp_path / "b"], cap, bb) as s:
        got = recovered(s)
        assert {bytes(k) for k in keys_for(8)[:4]}.isdisjoint(got)  # never acknowledged
        assert all(got[bytes(k)] == int(x) for k, x in zip(keys_for(8)[4:], h[4:]))
        assert all(got[bytes(k)] == int(x) for k, x in zip(keys_for(8, b"again"), h2))


def test_a_failed_checkpoint_keeps_what_was_acknowledged(tmp_path):
    bb = 5000
    cap = cap_for(64, bb)
    acked = {}
    with SsdStore(tmp_path, cap, bb, journal_compact_entries=6) as s:
        for i in range(2):  # 4 entries: the next call's 2 make the checkpoint due
            k = keys_for(2, bytes([i]))
            acked.update(zip(map(bytes, k), s.write(k, random_blocks(2, bb, i)).tolist()))
        # the append succeeds, the checkpoint it triggers does not (2 journal writes: the
        # checkpoint file fails)
        s.inject_failure(0, "journal", "ENOSPC", count=1, skip=1)
        k = keys_for(2, b"t")
        h = s.write(k, random_blocks(2, bb, 9))
        assert (h >= 0).all()  # its entries landed: acknowledged
        acked.update(zip(map(bytes, k), h.tolist()))
        assert s.stats()["drives"][0]["failed"]
        assert (s.write(keys_for(1, b"x"), random_blocks(1, bb)) == -1).all()
    with SsdStore(tmp_path, cap, bb) as s:
        assert source(s) == "journal"
        got = recovered(s)
        assert all(got[k] == v for k, v in acked.items())


def test_compaction_bounds_the_journal_and_keeps_the_live_set(tmp_path):
    bb = 4096
    slots = 40
    cap = cap_for(slots, bb)
    live: dict[bytes, int] = {}
    with SsdStore(tmp_path, cap, bb, journal_compact_entries=16) as s:
        for i in range(60):
            if s.free_slots < 4:
                drop = list(live)[: 8]
                s.free([live.pop(k) for k in drop])
            k = keys_for(3, i.to_bytes(2, "little"))
            h = s.write(k, random_blocks(3, bb, i))
            live.update(zip(map(bytes, k), h.tolist()))
        st_ = s.stats()["drives"][0]
        assert st_["checkpoints"] >= 8 and st_["journal_entries"] < 16
    assert os.path.getsize(tmp_path / SEG) <= 4096 + 16 * 64 + 4096
    assert os.path.getsize(tmp_path / CKPT) <= 4096 + slots * 64 + 4096
    with SsdStore(tmp_path, cap, bb) as s:
        got = recovered(s)
        assert all(got.get(k) == v for k, v in live.items())
        # what else comes back is a block freed since the last checkpoint: its own bytes
        extra = [k for k in got if k not in live]
        if extra:
            _, ok = s.load([got[k] for k in extra], [np.frombuffer(k, np.uint8) for k in extra])
            assert ok.all()


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from(["write", "free", "reopen", "reopen-full"]),
                              st.integers(1, 6)), min_size=1, max_size=30),
       compact=st.sampled_from([0, 3, 10]))
def test_journal_against_a_model(tmp_path_factory, ops, compact):
    """Random writes, frees and reopens (from the journal or a full scan) against
    a dict of live blocks: every live block comes back at its handle with its
    bytes; what else comes back is a freed block whose slot still holds it."""
    d = tmp_path_factory.mktemp("j")
    bb = 4096
    cap = cap_for(24, bb)
    live: dict[bytes, int] = {}
    content: dict[bytes, bytes] = {}
    n = 0
    s = SsdStore(d, cap, bb, journal_compact_entries=compact)
    try:
        for op, k in ops:
            if op == "write":
                keys = keys_for(k, n.to_bytes(4, "little"))
                n += 1
                data = random_blocks(k, bb, n)
                h = s.write(keys, data)
                for kk, hh, row in zip(keys, h.tolist(), data):
                    if hh >= 0:
                        live[bytes(kk)] = hh
                        content[bytes(kk)] = row.tobytes()
            elif op == "free" and live:
                drop = list(live)[:k]
                s.free([live.pop(x) for x in drop])
            elif op.startswith("reopen"):
                s.close()
                s = SsdStore(d, cap, bb, verify_on_open="full" if op == "reopen-full" else "journal",
                             journal_compact_entries=compact)
                got = recovered(s)
                for key, h in live.items():
                    assert got.get(key) == h
                extra = {key: h for key, h in got.items() if key not in live}
                if extra:
                    out, ok = s.load(list(extra.values()), [np.frombuffer(x, np.uint8) for x in extra])
                    assert ok.all()
                    for i, key in enumerate(extra):
                        assert out[i].tobytes() == content[key]
                live = got  # the index adopts what came back
    finally:
        s.close()


def test_scrub_reads_what_it_says_and_finds_nothing_on_a_clean_store(tmp_path):
    keys, data, h, cap, bb = filled(tmp_path, n=12, slots=32)
    with SsdStore(tmp_path, cap, bb) as s:
        r = s.scrub(5)
        assert r.checked == 5 and r.handles.size == 0 and not r.wrapped
        r = s.scrub(100)
        assert r.checked == 7 and r.wrapped
        assert s.stats()["total"]["scrub_bytes_read"] == 12 * s.slot_bytes
        assert s.stats()["total"]["bytes_read"] == 0


# ---------------------------------------------------------------- store check
def _saria(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "saria.cli.main", *args], capture_output=True, text=True,
                          timeout=120)


def test_store_check_reports_a_clean_and_a_damaged_drive(tmp_path):
    import json

    keys, data, h, cap, bb = filled(tmp_path / "d", n=10, slots=16)
    r = check_drive(tmp_path / "d")
    assert (r["records"], r["empty_slots"], r["bad_headers"], r["bad_payloads"]) == (10, 6, 0, 0)
    assert r["journal"] == "ok" and r["journal_entries"] == 10 and r["journal_stale"] == 0
    p = _saria("store", "check", str(tmp_path / "d"), "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)[0]["records"] == 10
    slot = (HEADER_BYTES + bb + 4095) // 4096 * 4096
    flip_byte(tmp_path / "d" / DATA_FILE_NAME, DATA_OFFSET + int(h[2]) * slot + HEADER_BYTES + 7)  # payload
    flip_byte(tmp_path / "d" / DATA_FILE_NAME, DATA_OFFSET + int(h[5]) * slot + 20)  # a key byte
    r = check_drive(tmp_path / "d")
    assert r["bad_payloads"] == 1 and r["bad_headers"] == 1 and r["records"] == 8
    assert r["journal_stale"] == 2  # listed, but the slot no longer holds that record
    p = _saria("store", "check", str(tmp_path / "d"))
    assert p.returncode == 1 and "payload crc fails" in p.stdout
    flip_byte(tmp_path / "d" / SEG, 20)
    assert check_drive(tmp_path / "d")["journal"].startswith("unusable")


def test_store_check_bad_input_is_one_line(tmp_path):
    p = _saria("store", "check", str(tmp_path / "nothing"))
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "saria: error: dir" in p.stderr
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / DATA_FILE_NAME).write_bytes(b"x" * 8192)
    p = _saria("store", "check", str(tmp_path / "junk"))
    assert p.returncode == 2 and "not a saria SSD data file" in p.stderr
