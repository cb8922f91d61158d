"""The SSD tier: pre-allocated O_DIRECT files on one or more drives.

``SsdStore`` is a thin Python face on the native engine ``saria._store``
(C++, ``native/store/ssd_store.cpp``). The engine owns the free space and the
bytes; the caller (the radix index) owns the policy: it decides which blocks
to write and which to free, and keeps the returned handles in its tree.

Use::

    with SsdStore(["/nvme0/saria", "/nvme1/saria"], capacity_bytes=64 << 30,
                  block_bytes=1 << 20) as ssd:
        keys, handles, seqs = ssd.take_recovered()     # what survived a restart
        handles = ssd.write(keys, data)                # -1 where a block failed
        ok = ssd.read(handles, keys, out)              # False = miss, never bad bytes
        ssd.free(handles)                              # the index evicted them
        ssd.stats()                                    # per-drive bytes, errors, failed

Engine behaviour
----------------
* **I/O.** Every call releases the GIL. A batch is striped over the healthy
  drives in contiguous chunks; the slots of a chunk are taken from a next-fit
  allocator that walks each drive front to back like a log, so a batch
  becomes a few large sequential ``pwrite`` calls (up to ``unit_bytes``,
  4 MiB by default) that run in parallel on a thread pool (``threads``,
  default 4 per drive; the calling thread works too). Reads of adjacent slots
  are merged the same way. All I/O is O_DIRECT from 4096-aligned buffers:
  nothing of the tier lands in the page cache.
* **Completion.** ``write`` returns a handle only after the ``pwrite`` that
  carries its slot completed in full, so a returned block survives the death
  of the process (kill -9). ``durable=True`` adds an ``fdatasync`` per call
  (power-loss safety on drives with a volatile write cache); ``sync()`` does
  it on demand.
* **Verification.** ``read`` verifies the slot header, the payload crc32c and
  that the stored key is the key the caller expects. Anything else (I/O error,
  torn or corrupt record, wrong key, bad handle) gives ``ok=False``, bumps a
  counter (``read_errors``, ``checksum_failures``, ``key_mismatches``,
  ``bad_handles``) and zero-fills that row of ``out``.
* **Capacity.** Each drive holds ``(capacity_bytes - 4096) // slot_bytes``
  slots. When no healthy drive has a free slot the block gets handle -1 and
  ``no_space`` counts it: the index must free (evict) first. ``free`` returns
  slots to the allocator without writing anything.
* **Failures.** A write that fails (EIO, ENOSPC, EFBIG, a short write, a data
  file no longer at its path, e.g. its directory was removed) marks the drive
  failed: its blocks in that write get -1, no new slots are allocated on it
  until ``revive(drive)``, the other drives go on. Reads from a failed drive
  are still attempted (everything served is verified). ``stats()`` shows the
  failed flag, error counters and the last errno and message per drive.
  ``inject_failure(drive, "write"|"read", errno, count, skip)`` makes the
  engine's next ``count`` I/O calls of that kind on that drive (after
  ``skip``) fail with ``errno``, through the real error path.
* **Accounting.** ``bytes_written`` / ``bytes_read`` per drive count every
  byte that a successful (or partial) ``pwrite``/``pread`` of the data path
  moved: headers, padding and the superblock at creation included, because
  they all wear or load the drive. What opening the store read
  (``recovery_bytes_read``: superblock, journal or scan), what the scrub read
  (``scrub_bytes_read``) and what the journal wrote
  (``journal_bytes_written``) are their own figures. ``payload_bytes_*``
  count block bytes only.

SSD on-disk format (version 1, little endian)
---------------------------------------------
Each drive directory holds one file, ``saria-ssd.data``, of
``4096 + n_slots * slot_bytes`` bytes, where
``slot_bytes = round_up(64 + block_bytes, 4096)``.

* ``[0, 4096)`` superblock: magic ``"SARIASUP"`` (u64), version u32 (1),
  slot header bytes u32 (64), block_bytes u64, slot_bytes u64, n_slots u64,
  data offset u64 (4096), creation time ns u64, random store id (16 bytes),
  drive index u32, crc32c of bytes [0, 76) as u32 at 76; zeros after.
  A new file is made as ``saria-ssd.data.tmp`` (fallocate, superblock,
  fdatasync), renamed into place and the directory fsynced. Reopening
  requires the same ``block_bytes`` and capacity.
* Slot ``i`` at ``4096 + i * slot_bytes``: a 64-byte header, the payload,
  zero padding. Header: magic ``"SARIASLT"`` (u64) @0, version u32 @8,
  payload length u32 @12 (= block_bytes), key (32 bytes) @16, write
  sequence number u64 @48, crc32c of the payload u32 @56, crc32c of header
  bytes [0, 60) followed by the slot index ``i`` as u32, stored u32 @60.
  A slot holds a record iff magic, version, length and both crcs verify;
  never-written space is zeros; a torn write fails a crc.
* Parts (``parts=P > 1``, one per tensor-parallel rank): block_bytes splits
  into P equal parts; a slot is P parts of
  ``part_stride = round_up(64 + block_bytes / P, 4096)`` bytes, part ``p`` at
  slot offset ``p * part_stride``, each a 64-byte part header (the header
  above with payload length ``block_bytes / P``, the part's own payload crc,
  and ``2 | p << 16 | P << 24`` instead of the version at @8), its payload
  bytes ``[p*B/P, (p+1)*B/P)``, zero padding. ``read_part(p)`` reads and
  verifies part ``p`` alone (one O_DIRECT read). The superblock of such a
  store has version 2, P u32 @80 and crc32c of [0, 84) u32 @84; a reopen
  with another P is refused. ``parts=1`` is the original format byte for
  byte. A whole-slot record (recovery, ``read``, scrub) needs every part
  valid with one key and sequence number: a torn multi-part write is no
  record at restart and a miss for every rank whose part is not the key's.
* Handles: ``handle = drive_base[d] + i`` with ``drive_base`` the running sum
  of the drives' slot counts in the order ``dirs`` lists them (< 2**32).
* Sequence numbers increase per store; a reopened store continues from one
  past the largest it finds.

Journal (``native/store/journal.h`` has the format): beside each data file a
checkpoint ``saria-ssd.ckpt`` and an append-only segment
``saria-ssd.journal`` list what recovery needs of every block (slot, key,
sequence number, header crc, 64 bytes each, with their own crc). ``write``
appends the entries of a call's blocks (O_DIRECT, one page rewrite or a few)
before it returns their handles, so every acknowledged block is in the
journal; when the segment holds ``journal_compact_entries`` entries it is
compacted into a new checkpoint (tmp file, fdatasync, rename). The slot
header stays the truth and the journal a hint: every read verifies header,
key and crc, so a stale entry (a slot rewritten by a write that died before
its entry landed) is a miss. A torn last entry is dropped; a journal that
does not verify (bad header or checkpoint crc, a bad entry before good ones,
another data file's) is not used and that drive is scanned. After a journal
open the sequence numbers resume 2**32 above the largest entry (above any
write the journal missed).

Recovery (``verify_on_open``): ``"journal"`` reads the journal (a few
megabytes: 64 bytes per block), ``"full"`` / ``"header"`` scan every slot
(4 MiB sequential O_DIRECT reads; ``"full"`` checks both crcs, ``"header"``
only the header crc, one page of each slot when slots are larger than 64 KiB,
leaving torn payloads to the check on read). Every open then writes a fresh
checkpoint of what it recovered. Every valid record is returned, one per key:
duplicates keep the highest sequence number and the rest are freed. A slot
that was freed but not yet reused still holds a valid record of its key, so
it can come back after a restart: its bytes are right for its key, and the
index can free it again. ``scrub`` re-reads the blocks in the background and
``check_drive`` (``saria store check``) scans a drive offline.
"""

from __future__ import annotations

import errno as _errno
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from saria.errors import ConfigError, SariaError

from saria import _store

__all__ = ["SsdStore", "RecoveredBlocks", "ScrubReport", "check_drive", "StoreClosedError", "ReadOnlyStoreError", "DATA_FILE_NAME", "crc32c"]

DATA_FILE_NAME: str = _store.DATA_FILE_NAME
HEADER_BYTES: int = int(_store.HEADER_BYTES)
DATA_OFFSET: int = int(_store.DATA_OFFSET)
ALIGN: int = int(_store.ALIGN)
crc32c = _store.crc32c


class StoreClosedError(SariaError, RuntimeError):
    """An operation on an SsdStore after close()."""


class ReadOnlyStoreError(SariaError, RuntimeError):
    """A write or free through a reader (``SsdStore.reader``)."""


class RecoveredBlocks(NamedTuple):
    """Blocks found on disk when the store opened: one per key, newest wins."""

    keys: np.ndarray  # (n, 32) uint8
    handles: np.ndarray  # (n,) int64
    seqs: np.ndarray  # (n,) uint64


class ScrubReport(NamedTuple):
    """One ``SsdStore.scrub`` call: the slots found bad and what it read."""

    handles: np.ndarray  # (n,) int64
    keys: np.ndarray  # (n, 32) uint8: the key each bad slot was written with
    checked: int
    bytes_read: int
    wrapped: bool  # the pass reached the end of the store and starts again


def check_drive(dir: str | os.PathLike, *, direct: bool = True) -> dict[str, Any]:
    """Scan one drive directory offline (``saria store check``): every slot
    read and classified, the journal compared with what the slots hold.

    Returns path, block_bytes, capacity_slots, records (newest record per
    key), empty_slots, bad_headers (a slot magic whose header does not
    verify: torn or corrupt), bad_payloads (header fine, payload crc not),
    superseded (older records of a key that has a newer one), bytes_read,
    read_errors, journal ("ok", "missing" or "unusable: why"),
    journal_entries, journal_stale (entries whose slot holds something else:
    a miss when loaded) and journal_missing (records the journal does not
    list: written when a crash cut their entry, never acknowledged).
    Raises ConfigError("dir", ...) when the directory holds no data file
    saria can read."""
    try:
        return dict(_store.check_drive(os.fspath(dir), bool(direct)))
    except ValueError as e:
        key, sep, msg = str(e).partition(": ")
        raise ConfigError(key if sep else "dir", msg if sep else str(e)) from None
    except OSError as e:
        raise ConfigError("dir", e.strerror or str(e)) from None


def slot_bytes_for(block_bytes: int, parts: int = 1) -> int:
    """Bytes one block occupies on disk: 64-byte header + payload, rounded up to 4096."""
    return int(parts) * (-(-(HEADER_BYTES + int(block_bytes) // int(parts)) // ALIGN) * ALIGN)


def _native_call(fn, *args, **kw):
    """Call the engine, turning its "arg: message" ValueErrors into ConfigError."""
    try:
        return fn(*args, **kw)
    except ValueError as e:
        if isinstance(e, SariaError):
            raise
        key, sep, msg = str(e).partition(": ")
        if sep and key.isidentifier():
            raise ConfigError(key, msg) from None
        raise ConfigError("argument", str(e)) from None
    except RuntimeError as e:
        if "closed" in str(e):
            raise StoreClosedError(str(e)) from None
        raise


def _as_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(name, f"must be an integer, got {value!r}")
    if int(value) < minimum:
        raise ConfigError(name, f"must be >= {minimum}, got {value}")
    return int(value)


class SsdStore:
    """A tiered-cache SSD store over one or more drive directories.

    Parameters
    ----------
    dirs: one directory per drive (created if missing; its parent must exist).
    capacity_bytes: the size of each drive's data file (an int for all, or one
        per drive); the slot count is ``(capacity_bytes - 4096) // slot_bytes``.
    block_bytes: payload bytes of every block (fixed per store).
    parts: parts per slot (fixed per store; one per tensor-parallel rank, so
        that rank r reads only its part with ``read_part``); block_bytes must
        be a multiple of it.
    threads: I/O threads (0: 4 per drive).
    unit_bytes: the largest single pwrite/pread (default 4 MiB).
    durable: fdatasync after every write call.
    preallocate: fallocate the data file at creation (else a sparse file;
        useful to test ENOSPC on a small filesystem).
    direct: open with O_DIRECT (the default; turn off only on a filesystem
        without O_DIRECT support).
    verify_on_open: "journal" (the default: read each drive's journal and
        adopt what it lists; a drive whose journal is missing or unusable is
        scanned in full), or a scan of every slot even when the journal is
        usable: "full" (every crc) or "header" (header crcs only, one page
        per slot).
    journal: keep a per-drive journal (``saria-ssd.ckpt`` and
        ``saria-ssd.journal`` beside the data file). Without one, an open
        removes the journal files (they would go stale) and the next open scans.
    journal_compact_entries: segment entries after which the journal is
        compacted into a new checkpoint (0: max(16384, blocks on the drive)).
    allow_degraded: a drive that cannot be opened is marked failed instead of
        failing the whole open (at least one drive must open).
    read_only: a reader (see ``SsdStore.reader``): the files must exist, their
        size comes from the superblock (``capacity_bytes`` is ignored), no
        owner lock, no recovery scan; only ``read``.

    One writer per drive: the owner takes an exclusive lock on the drive's
    ``saria-ssd.owner`` (and writes its pid there); a second owner of the
    same directory, in this process or another, gets an ``OSError`` (EBUSY)
    naming the directory and the holder's pid. The kernel releases the lock
    when the owner closes the store or dies.
    """

    def __init__(
        self,
        dirs: str | os.PathLike | Sequence[str | os.PathLike],
        capacity_bytes: int | Sequence[int],
        block_bytes: int,
        *,
        threads: int = 0,
        unit_bytes: int = 4 << 20,
        durable: bool = False,
        preallocate: bool = True,
        direct: bool = True,
        verify_on_open: str = "journal",
        allow_degraded: bool = False,
        read_only: bool = False,
        journal: bool = True,
        journal_compact_entries: int = 0,
        parts: int = 1,
    ) -> None:
        if isinstance(dirs, (str, os.PathLike)):
            dirs = [dirs]
        try:
            dir_list = [os.fspath(d) for d in dirs]
        except TypeError:
            raise ConfigError("dirs", f"must be a path or a list of paths, got {dirs!r}") from None
        if not dir_list:
            raise ConfigError("dirs", "at least one drive directory is needed")
        for d in dir_list:
            if not d:
                raise ConfigError("dirs", "an empty path was given")
        if read_only:
            caps = [0] * len(dir_list)  # taken from each file's superblock
        elif isinstance(capacity_bytes, (int, np.integer)) and not isinstance(capacity_bytes, bool):
            caps = [int(capacity_bytes)] * len(dir_list)
        else:
            try:
                caps = list(capacity_bytes)  # type: ignore[arg-type]
            except TypeError:
                raise ConfigError("capacity_bytes", f"must be an int or one int per drive, got {capacity_bytes!r}") from None
            if len(caps) != len(dir_list):
                raise ConfigError(
                    "capacity_bytes", f"{len(caps)} capacities for {len(dir_list)} drives (give one per drive or one int)"
                )
        if not read_only:
            caps = [_as_int("capacity_bytes", c, 1) for c in caps]
        block_bytes = _as_int("block_bytes", block_bytes, 1)
        if block_bytes > 1 << 30:
            raise ConfigError("block_bytes", f"must be at most 2**30, got {block_bytes}")
        parts = _as_int("parts", parts, 1)
        if parts > 255:
            raise ConfigError("parts", f"must be at most 255, got {parts}")
        if block_bytes % parts:
            raise ConfigError("parts", f"block_bytes={block_bytes} does not split into {parts} equal parts")
        threads = _as_int("threads", threads, 0)
        unit_bytes = _as_int("unit_bytes", unit_bytes, ALIGN)
        if verify_on_open not in ("journal", "full", "header"):
            raise ConfigError("verify_on_open", f"must be 'journal', 'full' or 'header', got {verify_on_open!r}")
        if verify_on_open == "journal" and not journal:
            raise ConfigError("verify_on_open", "'journal' needs journal=True (use 'full' or 'header')")
        journal_compact_entries = _as_int("journal_compact_entries", journal_compact_entries, 0)
        self._dirs = dir_list
        self._s = _native_call(
            _store.SsdStore,
            dir_list,
            caps,
            block_bytes,
            threads=threads,
            unit_bytes=unit_bytes,
            durable=bool(durable),
            preallocate=bool(preallocate),
            direct=bool(direct),
            full_scan=verify_on_open != "header",
            allow_degraded=bool(allow_degraded),
            read_only=bool(read_only),
            journal=bool(journal),
            open_from_journal=verify_on_open == "journal",
            journal_compact_entries=journal_compact_entries,
            parts=parts,
        )
        self.block_bytes: int = block_bytes
        self.slot_bytes: int = int(self._s.slot_bytes)
        self.parts: int = parts
        self.part_bytes: int = block_bytes // parts
        bases = [0]
        for st in self._s.stats()["drives"]:
            bases.append(bases[-1] + int(st["capacity_slots"]))
        self._bases = np.asarray(bases, dtype=np.int64)
        self._recovered: RecoveredBlocks | None = RecoveredBlocks(*self._s.take_recovered())

    # -- construction helpers ------------------------------------------------
    @classmethod
    def open(cls, *args: Any, **kw: Any) -> "SsdStore":
        """Open (or create) a store; same arguments as the constructor."""
        return cls(*args, **kw)

    @classmethod
    def reader(cls, dirs: str | os.PathLike | Sequence[str | os.PathLike], block_bytes: int, *,
               threads: int = 0, direct: bool = True, parts: int = 1) -> "SsdStore":
        """A read-only view of an existing store (the drives of another
        process's store, say): O_DIRECT reads verified like the owner's."""
        return cls(dirs, 0, block_bytes, threads=threads, direct=direct, read_only=True, parts=parts)

    @property
    def read_only(self) -> bool:
        return bool(self._s.read_only)

    # -- properties ------------------------------------------------------------
    @property
    def dirs(self) -> list[str]:
        return list(self._dirs)

    @property
    def n_drives(self) -> int:
        return len(self._dirs)

    @property
    def capacity_slots(self) -> int:
        """Slots on all drives together (failed ones included)."""
        return int(self._s.capacity_slots)

    @property
    def free_slots(self) -> int:
        """Free slots on drives that are not failed."""
        self._check()
        return int(self._s.free_slots)

    @property
    def closed(self) -> bool:
        return bool(self._s.closed)

    @property
    def recovered(self) -> RecoveredBlocks:
        """What the open found on disk (empty after take_recovered())."""
        if self._recovered is None:
            z = np.zeros((0,), dtype=np.int64)
            return RecoveredBlocks(np.zeros((0, 32), dtype=np.uint8), z, z.astype(np.uint64))
        return self._recovered

    def take_recovered(self) -> RecoveredBlocks:
        """Hand the recovered (keys, handles, seqs) to the caller and drop the store's copy."""
        r = self.recovered
        self._recovered = None
        return r

    def drive_of(self, handles: Any) -> np.ndarray:
        """Drive index of each handle (-1 for handles out of range)."""
        h = np.asarray(handles, dtype=np.int64)
        d = np.searchsorted(self._bases, h, side="right") - 1
        bad = (h < 0) | (h >= self._bases[-1])
        return np.where(bad, -1, d)

    # -- I/O -------------------------------------------------------------------
    def _check(self) -> None:
        if self._s.closed:
            raise StoreClosedError("the SSD store is closed")

    def _keys(self, keys: Any, name: str = "keys") -> np.ndarray:
        if isinstance(keys, (list, tuple)) and not keys:
            return np.zeros((0, 32), dtype=np.uint8)
        if isinstance(keys, (list, tuple)) and keys and isinstance(keys[0], (bytes, bytearray, memoryview)):
            if any(len(k) != 32 for k in keys):
                raise ConfigError(name, "every key must be 32 bytes")
            return np.frombuffer(b"".join(bytes(k) for k in keys), dtype=np.uint8).reshape(-1, 32)
        a = np.asarray(keys)
        if a.dtype != np.uint8:
            raise ConfigError(name, f"must be uint8 of shape (k, 32), got dtype {a.dtype}")
        if a.ndim == 1 and a.shape[0] == 32:
            a = a.reshape(1, 32)
        if a.ndim != 2 or a.shape[1] != 32:
            raise ConfigError(name, f"must have shape (k, 32), got {a.shape}")
        return np.ascontiguousarray(a)

    def _handles(self, handles: Any) -> np.ndarray:
        h = np.asarray(handles)
        if h.ndim == 0:
            h = h.reshape(1)
        if h.ndim != 1:
            raise ConfigError("handles", f"must be one-dimensional, got shape {h.shape}")
        if h.size and not np.issubdtype(h.dtype, np.integer):
            raise ConfigError("handles", f"must be integers, got dtype {h.dtype}")
        return np.ascontiguousarray(h, dtype=np.int64)

    def _check_owner(self) -> None:
        if self.read_only:
            raise ReadOnlyStoreError("this SSD store is a read-only reader: only its owner writes "
                                     "and frees")

    def write(self, keys: Any, data: Any) -> np.ndarray:
        """Write k blocks; returns (k,) int64 handles, -1 where a block was not stored.

        ``data``: (k, block_bytes) uint8, or any C-contiguous array whose rows are
        block_bytes bytes long.
        """
        self._check()
        self._check_owner()
        kk = self._keys(keys)
        d = np.asarray(data)
        if d.dtype != np.uint8:
            d = np.ascontiguousarray(d).reshape(d.shape[0] if d.ndim else 1, -1).view(np.uint8)
        if d.ndim == 1 and kk.shape[0] == 1:
            d = d.reshape(1, -1)
        if d.ndim != 2 or d.shape[0] != kk.shape[0] or d.shape[1] != self.block_bytes:
            raise ConfigError(
                "data", f"must be ({kk.shape[0]}, {self.block_bytes}) bytes for {kk.shape[0]} keys, got shape {d.shape}"
            )
        return _native_call(self._s.write, kk, np.ascontiguousarray(d))

    def read(self, handles: Any, keys: Any, out: np.ndarray) -> np.ndarray:
        """Read blocks into ``out`` ((k, block_bytes) uint8, C-contiguous, writable).

        Returns (k,) bool: True where the block verified (header, crc32c, key).
        Rows that fail are zero-filled, never left with unverified bytes.
        """
        h, kk = self._read_args(handles, keys, out, self.block_bytes)
        return _native_call(self._s.read, h, kk, out)

    def _read_args(self, handles: Any, keys: Any, out: np.ndarray, row_bytes: int) -> tuple[np.ndarray, np.ndarray]:
        self._check()
        h = self._handles(handles)
        kk = self._keys(keys)
        if not isinstance(out, np.ndarray) or out.dtype != np.uint8 or not out.flags.c_contiguous:
            raise ConfigError("out", "must be a C-contiguous uint8 numpy array")
        if not out.flags.writeable:
            raise ConfigError("out", "must be writable")
        if out.shape != (h.shape[0], row_bytes):
            raise ConfigError("out", f"must have shape ({h.shape[0]}, {row_bytes}), got {out.shape}")
        if kk.shape[0] != h.shape[0]:
            raise ConfigError("keys", f"{kk.shape[0]} keys for {h.shape[0]} handles")
        return h, kk

    def read_part(self, handles: Any, keys: Any, part: int, out: np.ndarray) -> np.ndarray:
        """Read part `part` of each block into ``out`` ((k, part_bytes) uint8,
        C-contiguous, writable): one O_DIRECT read of that part per block,
        its header, crc and key verified. Returns the per-block ok mask; a
        row that fails is zero-filled."""
        part = _as_int("part", part, 0)
        if part >= self.parts:
            raise ConfigError("part", f"must be in [0, {self.parts}), got {part}")
        h, kk = self._read_args(handles, keys, out, self.part_bytes)
        return _native_call(self._s.read_part, h, kk, part, out)

    def load(self, handles: Any, keys: Any) -> tuple[np.ndarray, np.ndarray]:
        """Like read() into a new array: returns (data, ok)."""
        h = self._handles(handles)
        out = np.empty((h.shape[0], self.block_bytes), dtype=np.uint8)
        ok = self.read(h, keys, out)
        return out, ok

    def free(self, handles: Any) -> int:
        """Return slots to the allocator (nothing is written). Returns how many were freed;
        handles out of range or already free are skipped and counted as ``bad_frees``."""
        self._check()
        self._check_owner()
        return int(_native_call(self._s.free, self._handles(handles)))

    def sync(self) -> None:
        """fdatasync every healthy drive."""
        self._check()
        _native_call(self._s.sync)

    # -- health ------------------------------------------------------------------
    def inject_failure(self, drive: int, op: str, errno: int | str, count: int = 1, skip: int = 0) -> None:
        """Make the next ``count`` (after ``skip``) ``op`` I/O calls on ``drive`` fail with
        ``errno`` (an int or a name such as "ENOSPC"). ``op``: "write" / "read" (the data
        file), "journal" (journal appends and checkpoint writes). Test hook."""
        self._check()
        if isinstance(errno, str):
            code = getattr(_errno, errno, None)
            if not isinstance(code, int):
                raise ConfigError("errno", f"unknown errno name {errno!r}")
            errno = code
        drive = _as_int("drive", drive, 0)
        if drive >= self.n_drives:
            raise ConfigError("drive", f"no drive {drive} (the store has {self.n_drives})")
        if op not in ("write", "read", "journal"):
            raise ConfigError("op", f"must be 'write', 'read' or 'journal', got {op!r}")
        _native_call(self._s.inject_failure, drive, op, _as_int("errno", errno, 1), _as_int("count", count, 0),
                     _as_int("skip", skip, 0))

    def revive(self, drive: int) -> None:
        """Clear a drive's failed flag (after the operator fixed it); refused silently
        (stays failed) if its data file is no longer at its path."""
        self._check()
        drive = _as_int("drive", drive, 0)
        if drive >= self.n_drives:
            raise ConfigError("drive", f"no drive {drive} (the store has {self.n_drives})")
        _native_call(self._s.revive, drive)

    def scrub(self, max_slots: int) -> ScrubReport:
        """Reads and verifies up to ``max_slots`` slots that hold a block, going
        on from where the last call stopped (round robin over the drives'
        slots; a call stops at the end of the store, ``wrapped``). Returns the slots whose record no longer verifies (payload or
        header crc, key, sequence number): the caller drops them from its
        index, which frees them. The store frees nothing itself. Rate limiting
        is the caller's (``saria.runtime``'s scrub thread)."""
        self._check()
        self._check_owner()
        h, k, checked, nbytes, wrapped = _native_call(self._s.scrub, _as_int("max_slots", max_slots, 0))
        return ScrubReport(h, k, int(checked), int(nbytes), bool(wrapped))

    def check_drives(self) -> None:
        """Mark failed every drive whose data file is no longer at its path."""
        self._check()
        self._s.check_drives()

    def stats(self) -> dict[str, Any]:
        """Per-drive and total counters.

        ``drives``: one dict per drive (path, capacity_slots, free_slots,
        handle_base, bytes_written, bytes_read, payload_bytes_written,
        payload_bytes_read, blocks_written, blocks_read, write_errors,
        read_errors, checksum_failures, key_mismatches, injected_failures,
        recovered_blocks, recovery_invalid_slots, recovery_bytes_read,
        recovery_seconds, recovery_source ("created", "journal", "full scan",
        "header scan", or a scan with the reason the journal was not used),
        journal_bytes_written, journal_entries, journal_generation,
        checkpoints, journal_dropped_tail, scrub_bytes_read,
        scrub_slots_checked, scrub_bad_slots, failed, last_errno, last_error);
        totals of the counters (recovery_seconds: the slowest drive's);
        no_space, bad_handles, bad_frees.

        ``bytes_read`` / ``bytes_written`` are the data path's (block reads and
        writes, the superblock at creation); what the open read
        (``recovery_bytes_read``), the scrub read (``scrub_bytes_read``) and the
        journal wrote (``journal_bytes_written``) are counted apart.
        """
        if not self._s.closed:
            self._s.check_drives()
        s = self._s.stats()
        drives = s["drives"]
        total: dict[str, Any] = {}
        for key in (
            "capacity_slots", "free_slots", "bytes_written", "bytes_read", "payload_bytes_written",
            "payload_bytes_read", "blocks_written", "blocks_read", "write_errors", "read_errors",
            "checksum_failures", "key_mismatches", "injected_failures", "recovered_blocks",
            "recovery_invalid_slots", "recovery_bytes_read", "journal_bytes_written", "checkpoints",
            "journal_dropped_tail", "scrub_bytes_read", "scrub_slots_checked", "scrub_bad_slots",
        ):
            total[key] = sum(int(d[key]) for d in drives)
        total["failed_drives"] = sum(1 for d in drives if d["failed"])
        total["recovery_seconds"] = max((float(d["recovery_seconds"]) for d in drives), default=0.0)
        total["free_slots"] = sum(int(d["free_slots"]) for d in drives if not d["failed"])
        return {
            "drives": drives,
            "total": total,
            "no_space": int(s["no_space"]),
            "bad_handles": int(s["bad_handles"]),
            "bad_frees": int(s["bad_frees"]),
            "next_seq": int(s["next_seq"]),
            "block_bytes": self.block_bytes,
            "slot_bytes": self.slot_bytes,
            "parts": self.parts,
            "part_bytes": self.part_bytes,
        }

    # -- lifetime -----------------------------------------------------------------
    def close(self) -> None:
        """Close the files (fdatasync first when durable). Idempotent. Must not race
        with I/O calls from other threads (it waits for calls already running)."""
        self._s.close()

    def __enter__(self) -> "SsdStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.capacity_slots} slots"
        return f"SsdStore({self._dirs!r}, block_bytes={self.block_bytes}, {state})"
