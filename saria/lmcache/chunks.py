"""LMCache chunks in saria's tiers: the store behind the LMCache adapters.

``ChunkStore`` is a ``TieredCache`` (the one cache core over saria's DRAM
pool and O_DIRECT SSD store) whose blocks are LMCache chunks, named by a
32-byte digest of the whole LMCache key. LMCache knows nothing of it: the
adapters (``l2_adapter.py``, ``storage_plugin.py``) translate calls.

How LMCache's calls become the core's block history:

=======================  ====================================================
LMCache                  saria
=======================  ====================================================
store (a chunk written    ``store``: the chunk enters saria's DRAM buffer (a
to L1 is mirrored to      chunk saria holds or is writing is not taken again);
every L2 at once)         admission decides on an SSD write when the buffer
                          evicts it, from the chunk's history
lookup (LMCache 0.5.6's   ``lookup`` + ``touch``: an access -- a reuse of the
prefetch asks every L2    chunk, a return gap -- hit or miss; a hit is locked
for all of a request's    until unlock
chunks, L1 hits too)
load                      ``read`` of the locked copy (DRAM, or the SSD with
                          crc32c and key checked)
unlock / delete           the lock is released / the chunk leaves saria
=======================  ====================================================

What saria cannot see from here: LMCache's L1 evictions (no L2 adapter is
told), so when a chunk left L1 shows only as a later lookup that L1 cannot
serve, or as a store of it again after it was recomputed. Admission judges a
chunk by the requests that asked for it and by its evictions from saria's
own buffer -- SARIA's ``E2`` means: written on the second time the buffer
drops it, i.e. once LMCache stored it again after saria first let it go.
(LMCache's in-engine mode asks the plugin only for chunks its CPU backend
misses, so there reuse counts only those.) Each chunk is its own path in the
radix index: LMCache's chunk hashes chain the prefix already, and a batch of
keys does not say which chunk is the parent of which.

Rows: a chunk of ``n`` bytes is stored as a 64-byte header (magic, ``n``,
the first 16 bytes of its digest, 40 bytes of the caller's meta) and the
bytes, in a block of ``chunk_bytes + 64``; a smaller chunk is padded. A load
for a buffer of another size, a header that is not this chunk's, or an SSD
copy whose crc32c or key fails is a miss -- never wrong bytes; a failed SSD
copy leaves the tier. A store fills its slot under the cache's lock, and the
core shows no reader a copy before it is complete (readiness), so no lookup,
load or admission sees a slot half written.

Nothing stored is lost on its way to the SSD: a buffer victim admission
writes stays readable in its DRAM slot until the write lands (the core's
write-behind, ``write_behind`` slots beside the buffer). With
``backpressure`` (the MP adapter, whose stores run on a thread of their own)
a store waits for a write-behind slot rather than let a victim go unread;
without it (the in-engine plugin, on LMCache's store path) a victim past the
reserve is written from a copy and is a miss until it lands.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from saria.core import LoadSpec
from saria.errors import ConfigError
from saria.index import Tier
from saria.lmcache.params import AdapterParams
from saria.policy import make_admission
from saria.runtime.cache import CacheConfig, TieredCache

log = logging.getLogger(__name__)

DRAM, SSD = Tier.DRAM, Tier.SSD
HEADER = 64            # magic (4), length (4), digest[:16] (16), caller's meta (40)
META_BYTES = 40
_IN_FLIGHT = 0x80      # a pseudo-tier bit: an SSD write of the chunk is queued
_MAGIC = b"SLMC"
_META = "saria-lmcache.json"
_FORMAT = 2
_MIN_BUFFER_CHUNKS = 4
_BACKPRESSURE_S = 10.0  # the longest a store waits for a write-behind slot


@dataclass(slots=True)
class Changes:
    """Chunks that entered saria (their first tier) and left it (their last)."""

    added: list[bytes] = field(default_factory=list)
    removed: list[bytes] = field(default_factory=list)


class ChunkStore:
    """Thread-safe; every method takes digests (32 bytes each) and buffers
    (anything with the buffer protocol, one per digest)."""

    def __init__(self, params: AdapterParams, *, backpressure: bool = False) -> None:
        self.params = params
        self.backpressure = backpressure
        self.counters: Counter[str] = Counter()
        self._lock = threading.Lock()          # _cache creation, _held, _where
        self._cache: TieredCache | None = None
        self._held: dict[bytes, list[list]] = {}  # digest -> [spec, failed, deadline] per lock
        self._next_expiry = float("inf")       # the earliest deadline in _held
        self._where: dict[bytes, int] = {}     # digest -> tier bits while resident
        self._busy: Counter[bytes] = Counter()  # digest -> loads reading it now
        self._in_flight: set[bytes] = set()    # resident only as a queued SSD write
        self._changes = Changes()
        chunk = params.chunk_bytes
        saved = _read_meta(params.dirs[0])
        if saved is not None and chunk is not None and saved != chunk:
            raise ConfigError("chunk_bytes", f"{chunk} differs from the {saved} B chunks stored in "
                              f"{params.dirs[0]}; remove that directory to start afresh")
        chunk = chunk or saved
        if chunk is not None:
            self._open(chunk)

    # ---------------------------------------------------------------- API

    @property
    def chunk_bytes(self) -> int | None:
        return None if self._cache is None else self._cache.cfg.block_bytes - HEADER

    @property
    def cache(self) -> TieredCache | None:
        return self._cache

    def put(self, digests: list[bytes], bufs: list, metas: list[bytes] | None = None) -> list[int]:
        """Chunks into saria's DRAM buffer (admission may write them to the
        SSD later), each with up to 40 bytes of the caller's `metas` kept in
        its header (``fetch`` returns them). A digest names one content
        (LMCache's keys are content hashes): a chunk saria holds, or is
        writing to the SSD, is not taken again. Returns the bytes taken per
        chunk (0: held already, or larger than a chunk)."""
        views = [_u8(b) for b in bufs]
        metas = metas or [b""] * len(views)
        self._expire_locks()
        if self._cache is None and views:
            with self._lock:
                if self._cache is None:
                    self._open(max(v.size for v in views))
        cache = self._cache
        out = []
        for d, v, meta in zip(digests, views, metas, strict=True):
            if len(meta) > META_BYTES:
                raise ValueError(f"a chunk's meta is at most {META_BYTES} bytes, got {len(meta)}")
            if v.size > cache.cfg.block_bytes - HEADER:
                if self._count(too_large=1) == 1:
                    log.warning("saria: a %d B chunk is larger than the store's %d B chunks; not "
                                "stored (set adapter param chunk_bytes)", v.size,
                                cache.cfg.block_bytes - HEADER)
                out.append(0)
                continue
            key = _key(d)
            taken = 0
            if self.backpressure and not cache.backend.write_behind_room():
                if not cache.wait_write_behind(_BACKPRESSURE_S):
                    self._count(backpressure_timeouts=1)
            with cache.holding():  # filled before any other thread can see the slot
                if not cache.lookup(key).num_available and not cache.writing(d):
                    spec = cache.prepare_store(key, 0, direct=True)
                    rows = None
                    if spec.num_blocks:
                        _fill(cache.backend.pool.view(int(spec.slots[0])), d, v, meta)
                    elif spec.direct.size:  # DRAM is all locked: write-through admission decides
                        rows = np.zeros((1, cache.cfg.block_bytes), np.uint8)
                        _fill(rows[0], d, v, meta)
                    taken = spec.num_blocks + spec.direct.size
                    cache.complete_store(spec, direct_rows=rows)
            out.append(v.size if taken else 0)
        self._count(offered_chunks=len(views), stored_chunks=sum(1 for n in out if n),
                    stored_bytes=sum(out))
        self._drain()
        return out

    def lookup_lock(self, digests: list[bytes]) -> list[bool]:
        """A request wants these chunks: records the access and locks the ones
        saria holds until ``unlock``. Raises only after releasing what it
        locked."""
        cache = self._cache
        out: list[bool] = []
        self._count(lookups=len(digests))
        if cache is None:
            return [False] * len(digests)
        self._expire_locks()
        deadline = time.monotonic() + self.params.lock_ttl_s
        taken = []
        try:
            for d in digests:
                key = _key(d)
                with self._lock:  # locked and registered in one step, as remove() looks
                    hit = cache.lookup(key).num_available > 0
                    cache.touch(key, hits=int(hit))
                    spec = cache.prepare_load(key, 1) if hit else None
                    if spec is not None and spec.num_blocks:
                        self._held.setdefault(d, []).append([spec, False, deadline])
                        self._next_expiry = min(self._next_expiry, deadline)
                        taken.append(d)
                out.append(bool(spec is not None and spec.num_blocks))
        except BaseException:
            self.unlock(taken)
            raise
        self._count(lookup_hits=len(taken))
        self._drain()
        return out

    def contains(self, digest: bytes) -> bool:
        """Whether saria holds the chunk (no access recorded, nothing locked)."""
        return self._cache is not None and self._cache.lookup(_key(digest)).num_available > 0

    def get(self, digests: list[bytes], bufs: list) -> list[bool]:
        """Copies each chunk into its buffer, through the lock ``lookup_lock``
        took when there is one; False where it could not (a miss)."""
        cache = self._cache
        out = []
        for d, b in zip(digests, bufs, strict=True):
            dst = _u8(b)
            if cache is None:
                out.append(False)
                continue
            with self._reading(d) as entry:
                ok = self._get_one(d, dst, entry)
            self._count(load_hits=int(ok), load_misses=int(not ok), loaded_bytes=dst.size if ok else 0)
            out.append(ok)
        self._drain()
        return out

    def fetch(self, digest: bytes) -> tuple[bytes, np.ndarray] | None:
        """One chunk's meta (40 bytes, zero-padded) and a copy of its bytes,
        through a ``lookup_lock`` lock when there is one; None on a miss."""
        if self._cache is None:
            return None
        with self._reading(digest) as entry:
            out = self._get_one(digest, None, entry)
        self._count(load_hits=int(bool(out)), load_misses=int(not out),
                    loaded_bytes=out[1].size if out else 0)
        self._drain()
        return out

    def unlock(self, digests: list[bytes]) -> None:
        """Releases one lookup lock per digest (a lock that already expired,
        or was never taken, is nothing to release)."""
        for d in digests:
            with self._lock:
                held = self._held.get(d)
                if not held:
                    continue
                spec, failed, _ = held.pop()
                if not held:
                    del self._held[d]
            self._cache.complete_load(spec, np.zeros(1, np.int64) if failed else None)
        self._expire_locks()
        self._drain()

    def remove(self, digests: list[bytes]) -> list[bytes]:
        """Chunks leave saria, except ones a lookup holds locked or a load is
        reading (a store in progress holds the cache's lock, so it is never
        cut in half). A chunk on its way to the SSD gets no SSD copy when its
        write lands (the core sees to it). Returns the digests removed."""
        cache = self._cache
        gone = []
        if cache is None:
            return gone
        with self._lock:  # no lookup or get can take these meanwhile
            for d in digests:
                if d in self._held or d in self._busy:
                    continue
                writing = cache.writing(d)
                if cache.remove(_key(d)) or writing:
                    gone.append(d)
        self._drain()
        return gone

    def take_changes(self) -> Changes:
        with self._lock:
            out, self._changes = self._changes, Changes()
        return out

    def status(self) -> dict:
        with self._lock:
            counters = dict(self.counters)
        out = {"chunk_bytes": self.chunk_bytes, "admission": self.params.admission,
               "dirs": list(self.params.dirs), **counters}
        if self._cache is not None:
            g = self._cache.gauges()
            out.update({k: g[k] for k in ("dram_slots", "dram_used_slots", "ssd_slots",
                                          "ssd_free_slots", "ssd_failed_drives",
                                          "ssd_bytes_written", "ssd_bytes_read",
                                          "ssd_recovery_bytes_read", "ssd_recovery_seconds",
                                          "ssd_journal_bytes_written", "ssd_scrub_bytes_read",
                                          "ssd_recovered_unadopted") if k in g})
            st = self._cache.stats
            out.update(ssd_writes=st.ssd_write_blocks, ssd_writes_dropped=st.writes_dropped,
                       ssd_write_failures=st.ssd_write_failures, dram_evictions=st.dram_evictions,
                       ssd_evictions=st.ssd_evictions)
        return out

    def flush(self) -> None:
        if self._cache is not None:
            self._cache.flush()
            self._drain()

    def close(self) -> None:
        with self._lock:
            cache, self._cache = self._cache, None
            held, self._held = self._held, {}
        if cache is not None:
            for entries in held.values():
                for spec, _, _ in entries:
                    cache.complete_load(spec)
            cache.flush()
            cache.close()

    # ------------------------------------------------------------ helpers

    def _expire_locks(self) -> None:
        """Lookup locks past their lease (``lock_ttl``: LMCache never
        unlocked them, e.g. its request was aborted) are released, as the
        engine's op deadlines release a copy nobody acked; a chunk a load is
        reading right now keeps its lock until the next call."""
        now = time.monotonic()
        if now < self._next_expiry:
            return
        gone = []
        with self._lock:
            nxt = float("inf")
            for d in list(self._held):
                keep = []
                for entry in self._held[d]:
                    if entry[2] <= now and d not in self._busy:
                        gone.append(entry)
                    else:
                        keep.append(entry)
                        nxt = min(nxt, entry[2])
                if keep:
                    self._held[d] = keep
                else:
                    del self._held[d]
            self._next_expiry = nxt
        for spec, failed, _ in gone:
            self._cache.complete_load(spec, np.zeros(1, np.int64) if failed else None)
        if gone:
            self._count(expired_locks=len(gone))
            log.warning("saria: released %d chunk locks LMCache held past lock_ttl (%.0f s)",
                        len(gone), self.params.lock_ttl_s)

    def _count(self, **by: int) -> int:
        """Adds to the counters (tasks run on several threads); returns the
        last one's new value."""
        with self._lock:
            for k, v in by.items():
                self.counters[k] += v
            return self.counters[k]

    def _open(self, chunk: int) -> None:
        """Opens the tiers for `chunk`-byte chunks (recovering what a previous
        store left on the drives). Caller holds the lock or is __init__."""
        p = self.params
        block = chunk + HEADER
        dram = max(p.dram_bytes, _MIN_BUFFER_CHUNKS * block)
        if dram > p.dram_bytes:
            log.warning("saria: dram %d B holds fewer than %d chunks of %d B; using %d B",
                        p.dram_bytes, _MIN_BUFFER_CHUNKS, chunk, dram)
        for d in p.dirs:
            os.makedirs(d, exist_ok=True)
        # victims stay readable in slots beside the buffer until their write lands
        writes = not make_admission(p.admission, dwpd=p.dwpd).writes_nothing
        behind = max(_MIN_BUFFER_CHUNKS, min(64, dram // block // 16)) if writes else 0
        self._cache = TieredCache(CacheConfig(
            block_bytes=block, dram_bytes=dram + behind * block, ssd_dirs=p.dirs,
            ssd_bytes=p.bytes_per_drive, admission=p.admission, promotion="none", dwpd=p.dwpd,
            write_queue=p.write_queue, write_behind=behind, events=True))
        _write_meta(p.dirs[0], chunk)

    @contextlib.contextmanager
    def _reading(self, d: bytes):
        """Marks chunk `d` busy (``remove`` leaves it alone) and yields the
        newest ``lookup_lock`` entry holding it, or None."""
        with self._lock:
            held = self._held.get(d)
            self._busy[d] += 1
        try:
            yield held[-1] if held else None
        finally:
            with self._lock:
                self._busy[d] -= 1
                if not self._busy[d]:
                    del self._busy[d]

    def _get_one(self, d: bytes, dst: np.ndarray | None, entry: list | None):
        """Reads chunk `d` through `entry`'s lock or a lock of its own: into
        `dst` (returns True/False), or, with no `dst`, returns ``(meta,
        payload copy)`` or None."""
        cache = self._cache
        if entry:
            spec = entry[0]
        else:  # lookup() first: it adopts a copy a previous store left on the drive
            spec = cache.prepare_load(_key(d), 1) if cache.lookup(_key(d)).num_available else None
            if spec is None or spec.num_blocks == 0:
                return None if dst is None else False
        got, out = "miss", (None if dst is None else False)
        try:
            got, row = self._row(spec)
            n = _check(row, d) if got == "ok" else -1
            if got == "ok" and n < 0:
                got = "bad" if spec.tiers[0] == SSD else "miss"
            if got == "ok" and dst is not None and n != dst.size:
                self._count(size_mismatches=1)
                got = "miss"
            if got == "ok":
                if dst is None:
                    out = (row[24:HEADER].tobytes(), row[HEADER:HEADER + n].copy())
                else:
                    dst[:] = row[HEADER:HEADER + n]
                    out = True
        finally:
            failed = got == "bad"
            if entry:
                entry[1] = entry[1] or failed  # the SSD copy is dropped at unlock
            else:
                cache.complete_load(spec, np.zeros(1, np.int64) if failed else None)
        return out

    def _row(self, spec: LoadSpec) -> tuple[str, np.ndarray | None]:
        """("ok", the locked block's row) or ("bad", None): the SSD copy
        failed its checks and must leave the tier."""
        cache = self._cache
        if spec.tiers[0] == DRAM:
            return "ok", cache.backend.pool.view(int(spec.slots[0]))
        rows = np.empty((1, cache.cfg.block_bytes), np.uint8)
        if not cache.backend.read_ssd(spec.slots[:1], spec.path[:1], rows)[0]:
            self._count(ssd_read_failures=1)
            return "bad", None
        return "ok", rows[0]

    def _drain(self) -> None:
        """Turns the core's residency events into chunks added / removed, net
        per chunk: a DRAM victim on its way to the SSD stays (an SSD write in
        flight counts as a tier until it lands or fails)."""
        cache = self._cache
        if cache is None:
            return
        with self._lock:
            events = cache.take_events()
            if not events and not self._in_flight:
                return
            before: dict[bytes, int] = {}
            for ev in events:
                for k in ev.keys:
                    was = self._where.get(k, 0)
                    before.setdefault(k, was)
                    now = was | ev.tier.bit if ev.kind == "stored" else was & ~ev.tier.bit
                    if ev.kind == "stored":
                        now &= ~_IN_FLIGHT
                    self._where[k] = now
            for k in list(self._in_flight):  # writes that landed, failed or were dropped
                if not cache.writing(k):
                    self._in_flight.discard(k)
                    before.setdefault(k, self._where.get(k, 0))
                    self._where[k] = self._where.get(k, 0) & ~_IN_FLIGHT
            for k, was in before.items():
                now = self._where.get(k, 0)
                if not now and cache.writing(k):
                    now = self._where[k] = _IN_FLIGHT
                    self._in_flight.add(k)
                if not now:
                    self._where.pop(k, None)
                if not was and now:
                    self._changes.added.append(k)
                elif was and not now:
                    self._changes.removed.append(k)


def _key(digest: bytes) -> np.ndarray:
    if len(digest) != 32:
        raise ValueError(f"a chunk digest is 32 bytes, got {len(digest)}")
    return np.frombuffer(digest, np.uint8).reshape(1, 32)


def _u8(buf) -> np.ndarray:
    return np.frombuffer(buf, np.uint8) if not isinstance(buf, np.ndarray) else buf.reshape(-1).view(np.uint8)


def _fill(row: np.ndarray, digest: bytes, payload: np.ndarray, meta: bytes) -> None:
    row[:4] = np.frombuffer(_MAGIC, np.uint8)
    row[4:8] = np.frombuffer(np.uint32(payload.size).tobytes(), np.uint8)
    row[8:24] = np.frombuffer(digest[:16], np.uint8)
    row[24:HEADER] = 0
    row[24:24 + len(meta)] = np.frombuffer(meta, np.uint8)
    row[HEADER:HEADER + payload.size] = payload


def _check(row: np.ndarray, digest: bytes) -> int:
    """The payload length a row's header states, or -1 if it is not chunk
    `digest`'s row."""
    if row[:4].tobytes() != _MAGIC or row[8:24].tobytes() != digest[:16]:
        return -1
    n = int(np.frombuffer(row[4:8].tobytes(), np.uint32)[0])
    return n if n <= row.size - HEADER else -1


def _read_meta(d: str) -> int | None:
    try:
        with open(os.path.join(d, _META)) as f:
            meta = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ConfigError("path", f"{os.path.join(d, _META)}: unreadable ({e})") from None
    if meta.get("format") != _FORMAT or not isinstance(meta.get("chunk_bytes"), int):
        raise ConfigError("path", f"{os.path.join(d, _META)}: not a saria-lmcache store of "
                          f"format {_FORMAT}")
    return meta["chunk_bytes"]


def _write_meta(d: str, chunk: int) -> None:
    path = os.path.join(d, _META)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"format": _FORMAT, "chunk_bytes": chunk}, f)
    os.replace(tmp, path)
