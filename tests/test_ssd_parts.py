"""The SSD store's slots of several parts (one per tensor-parallel rank): the
on-disk bytes of every part, a rank reading its part alone, corruption and
torn writes as misses of the ranks whose part they hit (never wrong bytes),
recovery and the journal, and a reopen with another part count refused."""

from __future__ import annotations

import os

import numpy as np
import pytest

from saria.errors import ConfigError
from saria.tiers import SsdStore
from saria.tiers.ssd import DATA_FILE_NAME, DATA_OFFSET, HEADER_BYTES, check_drive, crc32c, slot_bytes_for
from test_ssd_store import _derived, keys_for, kill_a_writer
from test_ssd_store import random_blocks as blocks


def stride_of(bb: int, parts: int) -> int:
    return -(-(HEADER_BYTES + bb // parts) // 4096) * 4096


def u32(b: bytes, at: int) -> int:
    return int.from_bytes(b[at: at + 4], "little")


def part_record(key: bytes, seq: int, payload: bytes, slot: int, part: int, parts: int, stride: int) -> bytes:
    """A part as the format in native/store/ssd_store.h describes it, built here from the text."""
    word = 1 if parts == 1 else 2 | part << 16 | parts << 24
    head = (b"SARIASLT" + word.to_bytes(4, "little") + len(payload).to_bytes(4, "little") + key
            + seq.to_bytes(8, "little") + crc32c(payload).to_bytes(4, "little"))
    head += crc32c(head + slot.to_bytes(4, "little")).to_bytes(4, "little")
    return head + payload + bytes(stride - len(head) - len(payload))


def read_file(d, off: int, n: int) -> bytes:
    with open(d / DATA_FILE_NAME, "rb") as f:
        f.seek(off)
        return f.read(n)


def write_file(d, off: int, data: bytes) -> None:
    with open(d / DATA_FILE_NAME, "r+b") as f:
        f.seek(off)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


@pytest.mark.parametrize("parts,pb", [(1, 5000), (2, 5000), (4, 3 * 4096), (3, 4096 - 64)])
def test_parts_on_disk_byte_exact_and_read_alone(tmp_path, parts, pb):
    bb = parts * pb
    n = 6
    keys, data = keys_for(n), blocks(n, bb)
    stride = stride_of(bb, parts)
    assert slot_bytes_for(bb, parts) == parts * stride
    with SsdStore(tmp_path, DATA_OFFSET + 8 * parts * stride, bb, parts=parts) as s:
        assert (s.slot_bytes, s.parts, s.part_bytes) == (parts * stride, parts, pb)
        h = s.write(keys, data)
        seq0 = s.stats()["next_seq"] - n
        out, ok = s.load(h, keys)
        assert ok.all() and np.array_equal(out, data)
        for p in range(parts):
            part = np.empty((n, pb), np.uint8)
            b0 = s.stats()["total"]["bytes_read"]
            assert s.read_part(h, keys, p, part).all()
            assert np.array_equal(part, data[:, p * pb:(p + 1) * pb])
            assert s.stats()["total"]["bytes_read"] - b0 == n * stride  # its part alone, once
    sb = read_file(tmp_path, 0, 4096)
    assert sb[:8] == b"SARIASUP" and u32(sb, 76) == crc32c(sb[:76])
    if parts == 1:  # the original format: version 1, nothing after the crc
        assert u32(sb, 8) == 1 and not any(sb[80:])
    else:
        assert u32(sb, 8) == 2 and u32(sb, 80) == parts and u32(sb, 84) == crc32c(sb[:84])
        assert not any(sb[88:])
    assert int.from_bytes(sb[24:32], "little") == parts * stride
    for i in range(n):
        slot = int(h[i])
        raw = read_file(tmp_path, DATA_OFFSET + slot * parts * stride, parts * stride)
        want = b"".join(part_record(keys[i].tobytes(), seq0 + i, data[i, p * pb:(p + 1) * pb].tobytes(), slot, p,
                                    parts, stride) for p in range(parts))
        assert raw == want


def test_one_part_store_is_the_original_format(tmp_path):
    """parts=1 writes what a store without the option wrote: same file, byte for byte
    (but the random store id and the creation time in the superblock)."""
    bb, keys, data = 3 * 4096 + 100, keys_for(5), blocks(5, 3 * 4096 + 100)
    for d, kw in ((tmp_path / "a", {}), (tmp_path / "b", {"parts": 1})):
        with SsdStore(d, DATA_OFFSET + 8 * slot_bytes_for(bb), bb, **kw) as s:
            s.write(keys, data)
    a = (tmp_path / "a" / DATA_FILE_NAME).read_bytes()
    b = (tmp_path / "b" / DATA_FILE_NAME).read_bytes()
    assert len(a) == len(b) and a[4096:] == b[4096:] and a[:48] == b[:48] and a[72:76] == b[72:76]


def test_a_corrupted_part_is_a_miss_for_its_rank_only(tmp_path):
    parts, pb = 2, 6000
    bb, stride = parts * pb, stride_of(2 * 6000, 2)
    keys, data = keys_for(4), blocks(4, bb)
    cap = DATA_OFFSET + 4 * parts * stride
    with SsdStore(tmp_path, cap, bb, parts=parts) as s:
        h = s.write(keys, data)
    slot = lambda i: DATA_OFFSET + int(h[i]) * parts * stride  # noqa: E731
    flip = lambda off: write_file(tmp_path, off, bytes([read_file(tmp_path, off, 1)[0] ^ 0x5A]))  # noqa: E731
    flip(slot(0) + stride + HEADER_BYTES + 17)   # block 0: a payload byte of part 1
    flip(slot(1) + 20)                           # block 1: a key byte in part 0's header
    flip(slot(2) + stride + pb + HEADER_BYTES - 1)  # block 2: part 1's last payload byte
    with SsdStore.reader(tmp_path, bb, parts=parts) as r:
        got = {}
        for p in range(parts):
            out = np.empty((4, pb), np.uint8)
            ok = r.read_part(h, keys, p, out)
            got[p] = ok.tolist()
            for i in range(4):
                if ok[i]:
                    assert np.array_equal(out[i], data[i, p * pb:(p + 1) * pb])
                else:
                    assert not out[i].any()
        assert got == {0: [True, False, True, True], 1: [False, True, False, True]}
        full, okf = r.load(h, keys)  # a whole-slot read needs every part
        assert okf.tolist() == [False, False, False, True] and np.array_equal(full[3], data[3])
        assert r.stats()["total"]["checksum_failures"] == 3 + 3
    # a full scan at open keeps only the slots whose every part verifies
    with SsdStore(tmp_path, cap, bb, parts=parts, verify_on_open="full") as s:
        assert s.recovered.handles.tolist() == [int(h[3])]
        assert s.stats()["total"]["recovery_invalid_slots"] == 3
    # the journal still lists them: the scrub reports them
    with SsdStore(tmp_path, cap, bb, parts=parts) as s:
        pass
    rep = check_drive(tmp_path)
    assert rep["parts"] == parts and rep["records"] == 1 and rep["bad_headers"] + rep["bad_payloads"] == 3


def test_scrub_and_header_scan_of_parts(tmp_path):
    parts, pb = 2, 40000   # slots over 64 KiB: the header scan reads each part's first page
    bb, stride = parts * pb, stride_of(2 * 40000, 2)
    keys, data = keys_for(5), blocks(5, bb)
    cap = DATA_OFFSET + 6 * parts * stride
    with SsdStore(tmp_path, cap, bb, parts=parts) as s:
        h = s.write(keys, data)
        write_file(tmp_path, DATA_OFFSET + int(h[1]) * parts * stride + stride + 8, b"\0")  # part 1 header
        write_file(tmp_path, DATA_OFFSET + int(h[3]) * parts * stride + stride + 100, b"\x01\x02")  # payload
        rep = s.scrub(100)
        assert sorted(rep.handles.tolist()) == sorted([int(h[1]), int(h[3])])
    with SsdStore(tmp_path, cap, bb, parts=parts, verify_on_open="header") as s:
        st = s.stats()["total"]
        # part 1's bad header is seen; the bad payload is left to the read
        assert sorted(s.recovered.handles.tolist()) == sorted(int(x) for i, x in enumerate(h) if i != 1)
        assert st["recovery_invalid_slots"] == 1
        assert st["recovery_bytes_read"] == 4096 + 6 * parts * 4096
        out = np.empty((5, pb), np.uint8)
        assert s.read_part(h, keys, 0, out).tolist() == [True] * 5
        assert s.read_part(h, keys, 1, out).tolist() == [True, False, True, False, True]


def test_torn_multi_part_rewrite_is_never_wrong_bytes(tmp_path):
    """A rewrite of a slot that died after part 0 of the new record landed and
    before part 1 and the journal entry: the journal lists the old key there.
    Rank 0 misses (its part is the new key's), rank 1 gets the old key's own
    bytes; a scan finds no record in the slot."""
    parts, pb = 2, 5000
    bb, stride = parts * pb, stride_of(2 * 5000, 2)
    cap = DATA_OFFSET + 2 * parts * stride
    old_k, new_k = keys_for(1, b"old"), keys_for(1, b"new")
    old_d, new_d = blocks(1, bb, 1), blocks(1, bb, 2)
    with SsdStore(tmp_path / "d", cap, bb, parts=parts) as s:
        h = s.write(old_k, old_d)
    with SsdStore(tmp_path / "other", cap, bb, parts=parts) as s:  # the new record, same slot
        assert s.write(new_k, new_d).tolist() == h.tolist()
    off = DATA_OFFSET + int(h[0]) * parts * stride
    write_file(tmp_path / "d", off, read_file(tmp_path / "other", off, stride))  # part 0 only
    with SsdStore(tmp_path / "d", cap, bb, parts=parts) as s:
        assert s.stats()["drives"][0]["recovery_source"] == "journal"
        assert s.recovered.handles.tolist() == h.tolist()
        out = np.empty((1, pb), np.uint8)
        assert s.read_part(h, old_k, 0, out).tolist() == [False] and not out.any()
        assert s.read_part(h, new_k, 0, out).tolist() == [True]  # the new key's own part 0 bytes
        assert np.array_equal(out[0], new_d[0, :pb])
        assert s.read_part(h, old_k, 1, out).tolist() == [True]
        assert np.array_equal(out[0], old_d[0, pb:])
        assert s.read_part(h, new_k, 1, out).tolist() == [False]
        assert s.load(h, old_k)[1].tolist() == [False] and s.load(h, new_k)[1].tolist() == [False]
    with SsdStore(tmp_path / "d", cap, bb, parts=parts, verify_on_open="full") as s:
        assert s.recovered.handles.size == 0
        assert s.stats()["total"]["recovery_invalid_slots"] == 1


def test_reopen_with_another_part_count_is_refused(tmp_path):
    bb = 4 * 3000
    cap = DATA_OFFSET + 4 * slot_bytes_for(bb, 2)
    with SsdStore(tmp_path / "two", cap, bb, parts=2) as s:
        s.write(keys_for(1), blocks(1, bb))
    with SsdStore(tmp_path / "one", cap, bb) as s:
        s.write(keys_for(1), blocks(1, bb))
    for d, have, want in (("two", 2, 1), ("two", 2, 4), ("one", 1, 2)):
        with pytest.raises(ConfigError, match=f"parts: .* was created with parts={have} .*not {want}"):
            SsdStore(tmp_path / d, cap, bb, parts=want)
        with pytest.raises(ConfigError, match=f"was created with parts={have}"):
            SsdStore.reader(tmp_path / d, bb, parts=want)
    with SsdStore(tmp_path / "two", cap, bb, parts=2) as s:  # the right count still opens
        assert s.recovered.handles.size == 1


def test_parts_validation(tmp_path):
    with pytest.raises(ConfigError, match="parts: block_bytes=10001 does not split into 2"):
        SsdStore(tmp_path, 1 << 20, 10001, parts=2)
    with pytest.raises(ConfigError, match="parts: must be >= 1"):
        SsdStore(tmp_path, 1 << 20, 10000, parts=0)
    with SsdStore(tmp_path, 1 << 20, 10000, parts=2) as s:
        h = s.write(keys_for(1), blocks(1, 10000))
        with pytest.raises(ConfigError, match=r"part: must be in \[0, 2\), got 2"):
            s.read_part(h, keys_for(1), 2, np.empty((1, 5000), np.uint8))
        with pytest.raises(ConfigError, match=r"out: must have shape \(1, 5000\)"):
            s.read_part(h, keys_for(1), 1, np.empty((1, 10000), np.uint8))


@pytest.mark.parametrize("run", range(3))
def test_sigkill_mid_multi_part_burst_never_serves_wrong_bytes(tmp_path, run):
    """SIGKILL of a writer of 2-part slots mid-burst (slot rewrites, journal
    appends, checkpoints in flight), then every listed block read part by
    part: each part is its key's bytes or a miss; every acknowledged block
    reads back whole."""
    rng = np.random.default_rng(100 + run)
    parts, bb, slots, batch = 2, 2 * (3 * 4096 + 100), 200, 16
    cap = DATA_OFFSET + slots * slot_bytes_for(bb, parts)
    completed = kill_a_writer(tmp_path, rng, cap, bb, slots, batch, (0, 24, 40)[run % 3], parts)
    pb = bb // parts
    for mode in ("journal", "full"):
        with SsdStore(tmp_path, cap, bb, parts=parts, verify_on_open=mode) as s:
            rk, rh, _ = s.take_recovered()
            found = {int(h): bytes(k) for k, h in zip(rk, rh)}
            for h, k in completed.items():
                assert found.get(h) == k, f"{mode}: acknowledged block at handle {h} not recovered"
            whole_ok = s.load(rh, rk)[1]
            for p in range(parts):
                out = np.empty((rh.size, pb), np.uint8)
                ok = s.read_part(rh, rk, p, out)
                for i, k in enumerate(rk):
                    if ok[i]:
                        assert out[i].tobytes() == _derived(bytes(k), bb)[p * pb:(p + 1) * pb]
                    else:
                        assert int(rh[i]) not in completed and not out[i].any()
                assert ok[whole_ok].all()  # a whole-slot hit is a hit of every part
            if mode == "full":
                assert whole_ok.all()
