"""The cluster tier: saria's blocks in a Mooncake Store shared by the fleet.

``RemoteTier`` is one node's client of the cluster (a
``MooncakeDistributedStore``): it contributes ``segment_bytes`` of this
node's memory to the cluster and moves blocks to and from it as saria's
self-describing rows (``rows.py``), under saria's own deadline, lane and
breaker (``guard.py``). It decides nothing: the cache core says what to
publish, look up, load and drop.

Use::

    tier = RemoteTier(settings, namespace=geometry.namespace(...), block_bytes=slot_bytes)
    tier.register(pool_rows)                       # zero copy from and into these rows
    found = tier.exists(keys)                      # (n,) bool, one bounded call
    put = tier.put(keys, pool_rows, slots)         # stored / skipped / failed per block
    got = tier.get(keys, pool_rows, slots)         # got.ok: verified, byte-exact
    got.then(lambda: free(slots[~got.ok]))         # the rows are the caller's again

Behaviour
---------
* **Zero copy.** ``register(rows)`` registers a caller's buffer (the DRAM
  pool) with Mooncake; a put from or a get into registered rows moves the
  payload straight between them and the cluster (scatter-gather: the 64-byte
  header comes from the tier's own registered header rows, so the store holds
  one contiguous row). Rows that are not registered go through the tier's
  registered staging rows and one copy.
* **Every byte verified, every row signed.** A get is a hit only where
  Mooncake returned a whole row and the row verifies: a version 2 row signed
  with a key of the fleet's ring (``rows.SignedRowCodec``: HMAC-SHA256 over
  header, block key and payload) under a name only key holders can derive.
  Another model's or version's object, a forged or corrupted one is a miss
  (``verify_failures``); it is removed from the cluster (``verify_removed``)
  and its name is *distrusted*: until this node's own put lands there, a
  lookup says absent and a put replaces the object instead of skipping it
  (Mooncake keeps the old value on a put of an existing key, and an
  attacker's pre-put row must not block the honest one).
* **Rotation.** Names are derived with the write key; with older keys in the
  ring (``codec.read_ids``) a lookup also asks their names (in the same
  call) and a get tries them for blocks the write key's name lacks.
* **Deadline.** No call holds the caller longer than ``deadline_s``; a late
  call is a miss (or a failed put) and its buffers stay in use until it
  really ends: ``PutResult.then`` / ``GetResult.then`` run the caller's
  release at that point. A registered destination row of a late get may
  still be written: it must not be read or reused before ``then``.
* **Put skips what the cluster holds.** ``put`` asks ``batch_is_exist`` first
  and sends only the absent blocks (``skipped``: one copy per cluster) --
  distrusted names excepted, which it removes and puts; the headers and MACs
  are computed while that lookup is out.
* **Lookup answers are reused** for ``exist_cache_s`` (a put or remove of
  this node updates them); a failed lookup is all misses and is not cached;
  while the breaker is open every lookup is all misses and the cached
  answers are dropped (a master back without HA has lost every key).

Mooncake's return codes (``mooncake-store/include/types.h``) mapped here:
``-704`` not found and ``-707`` lease expired: a miss; ``-706`` leased: not
removed now; ``-705`` exists: skipped; ``-200`` no space: a failed put;
``-600`` invalid parameters (an object of another size): a miss; ``-800``
transfer failed, ``-900`` RPC failed, ``-1`` internal: the cluster is
unavailable (the breaker counts it) when every key of a call gets one.
"""

from __future__ import annotations

import mmap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from saria.errors import ConfigError, SariaError
from saria.tiers.copy import byte_rows, copy_rows
from saria.tiers.remote.guard import Guard, Outcome, RemoteUnavailable, Ticket
from saria.tiers.remote.rows import HEADER_BYTES, RowCodec, SignedRowCodec
from saria.tiers.remote.settings import RemoteSettings
from saria.tiers.remote.stats import RemoteStats

__all__ = ["RemoteTier", "PutResult", "GetResult", "RemoteSetupError", "ErrorCode"]


class ErrorCode:
    """Mooncake Store's return codes that saria tells apart."""

    INTERNAL = -1
    NO_SPACE = -200
    INVALID_PARAMS = -600
    NOT_FOUND = -704
    EXISTS = -705
    LEASED = -706
    LEASE_EXPIRED = -707
    TRANSFER_FAILED = -800
    RPC_FAILED = -900

    UNAVAILABLE = frozenset({INTERNAL, TRANSFER_FAILED, RPC_FAILED})


class RemoteSetupError(SariaError, RuntimeError):
    """The Mooncake client could not be set up (master unreachable, bad settings)."""


class _Settle:
    """The real end of several tickets: ``then(fn)`` runs once all have ended."""

    def __init__(self, tickets: list[Ticket]) -> None:
        self._tickets = tickets

    @property
    def settled(self) -> bool:
        return all(t.done for t in self._tickets)

    def then(self, fn: Callable[[], None]) -> None:
        left = [len(self._tickets)]
        lock = threading.Lock()
        if not left[0]:
            fn()
            return

        def one() -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                fn()

        for t in self._tickets:
            t.then(one)

    def wait_settled(self, timeout: float | None = None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        for t in self._tickets:
            if not t.wait_settled(None if end is None else max(0.0, end - time.monotonic())):
                return False
        return True


@dataclass
class PutResult:
    stored: np.ndarray       # (n,) bool: sent to the cluster now
    skipped: np.ndarray      # (n,) bool: the cluster held it already
    failed: np.ndarray       # (n,) bool: not in the cluster (refused, late, no space, error)
    _settle: _Settle = field(repr=False, default_factory=lambda: _Settle([]))

    @property
    def held(self) -> np.ndarray:
        """Where the cluster holds the block now (stored or skipped)."""
        return self.stored | self.skipped

    def then(self, fn: Callable[[], None]) -> None:
        """Runs ``fn`` once every call of this put has ended (its source rows are free)."""
        self._settle.then(fn)

    def wait_settled(self, timeout: float | None = None) -> bool:
        return self._settle.wait_settled(timeout)


@dataclass
class GetResult:
    ok: np.ndarray           # (n,) bool: verified bytes in the destination row
    _settle: _Settle = field(repr=False, default_factory=lambda: _Settle([]))

    def then(self, fn: Callable[[], None]) -> None:
        """Runs ``fn`` once every call of this get has ended (its destination rows are free)."""
        self._settle.then(fn)

    def wait_settled(self, timeout: float | None = None) -> bool:
        return self._settle.wait_settled(timeout)


def _anon_rows(n: int, width: int) -> tuple[mmap.mmap, np.ndarray]:
    """Page-aligned anonymous memory as (n, width) uint8 rows."""
    mm = mmap.mmap(-1, max(1, n * width))
    return mm, np.frombuffer(mm, np.uint8, count=n * width).reshape(n, width)


def _keys(keys: Any) -> np.ndarray:
    arr = np.ascontiguousarray(keys, dtype=np.uint8)
    if arr.ndim == 1 and arr.size % 32 == 0:
        arr = arr.reshape(-1, 32)
    if arr.ndim != 2 or arr.shape[1] != 32:
        raise ValueError(f"keys must be (n, 32) uint8, got shape {arr.shape}")
    return arr


class RemoteTier:
    """One node's client of the cluster tier (see the module docstring)."""

    def __init__(self, settings: RemoteSettings, namespace: str, block_bytes: int, *,
                 client: Any = None, signed: bool = True) -> None:
        """``signed=False`` writes and reads unsigned version 1 rows under
        public names: for measuring what signing costs (``saria bench remote
        --no-row-mac``) only -- anyone who reaches the master can forge them."""
        self.settings = settings
        if signed and settings.fleet_keys is None:
            raise ConfigError("remote.fleet_key_file", "a cluster tier needs the fleet's key "
                              "(fleet_key_file or fleet_key_env); rows are signed with it")
        self.codec: RowCodec = (SignedRowCodec(namespace, block_bytes, settings.fleet_keys)
                                if signed else RowCodec(namespace, block_bytes))
        self._old_ids: list[int] = list(getattr(self.codec, "read_ids", ()))
        self._distrusted: set[bytes] = set()  # block keys whose row failed to verify
        self.block_bytes = self.codec.block_bytes
        self.stats = RemoteStats()
        self._lock = threading.Lock()
        n = settings.staging_rows
        self._heads_mm, self._heads = _anon_rows(n, HEADER_BYTES)
        self._stage_mm, self._stage = _anon_rows(n, self.block_bytes)
        self._free_rows = list(range(n - 1, -1, -1))
        self._regions: list[tuple[int, int]] = []
        self._exist: dict[bytes, tuple[bool, float]] = {}
        self._closed = False
        self._store = client if client is not None else self._connect(settings)
        for arr in (self._heads, self._stage):
            self._register_span(arr.ctypes.data, arr.nbytes)
        self.guard = Guard(deadline_s=settings.deadline_s, lane=settings.lane,
                           breaker_failures=settings.breaker_failures,
                           breaker_cooldown_s=settings.breaker_cooldown_s,
                           on_outcome=self._observe)

    # ------------------------------------------------------------ set-up

    @staticmethod
    def _connect(s: RemoteSettings) -> Any:
        try:
            from mooncake.store import MooncakeDistributedStore
        except ImportError as e:
            raise RemoteSetupError(f"remote: mooncake.store does not import ({e}); "
                                   "pip install 'saria[mooncake]' (needs libibverbs1)") from None
        store = MooncakeDistributedStore()
        rc = store.setup(s.hostname, s.metadata_server, s.segment_bytes, s.local_buffer_bytes,
                         s.protocol, s.rdma_devices, s.master_address)
        if rc != 0:
            raise RemoteSetupError(f"remote: Mooncake client setup failed (rc {rc}) for master "
                                   f"{s.master} and metadata server {s.metadata_server}")
        return store

    def _register_span(self, addr: int, nbytes: int) -> None:
        rc = self._store.register_buffer(addr, nbytes)
        if rc != 0:
            raise RemoteSetupError(f"remote: register_buffer of {nbytes} B failed (rc {rc})")
        with self._lock:
            self._regions.append((addr, addr + nbytes))

    def register(self, rows: Any) -> None:
        """Registers a caller's 2-D rows (numpy or CPU torch, ``block_bytes``
        per row) so puts from and gets into them are zero copy. They must
        outlive the tier."""
        addr, n, stride, width = byte_rows(rows, "rows")
        if width != self.block_bytes:
            raise ValueError(f"rows are {width} B, blocks {self.block_bytes} B")
        if n and not self._registered(addr, n, stride):
            self._register_span(addr, (n - 1) * stride + width)

    def _registered(self, addr: int, n: int, stride: int) -> bool:
        end = addr + (n - 1) * stride + self.block_bytes
        with self._lock:
            return any(a <= addr and end <= b for a, b in self._regions)

    # ------------------------------------------------------------ rows

    def _take_rows(self, n: int) -> np.ndarray | None:
        with self._lock:
            if len(self._free_rows) < n:
                return None
            rows = [self._free_rows.pop() for _ in range(n)]
        return np.array(rows, np.int64)

    def _give_rows(self, rows: np.ndarray) -> None:
        with self._lock:
            self._free_rows.extend(int(r) for r in rows)

    def _chunks(self, n: int) -> range:
        return range(0, n, self.settings.staging_rows)

    def _rows_arg(self, keys: Any, rows: Any, rows_idx: Any, name: str):
        """(keys, row indices, address, stride, registered) of a put's source
        or a get's destination, checked."""
        keys = _keys(keys)
        n = len(keys)
        addr, n_rows, stride, width = byte_rows(rows, name)
        if width != self.block_bytes:
            raise ValueError(f"{name} rows are {width} B, blocks {self.block_bytes} B")
        idx = (np.arange(n, dtype=np.int64) if rows_idx is None
               else np.asarray(rows_idx, np.int64).reshape(-1))
        if idx.size != n:
            raise ValueError(f"{n} keys for {idx.size} rows of {name}")
        if n and (idx.min() < 0 or idx.max() >= n_rows):
            raise IndexError(f"{name}_idx holds a row outside [0, {n_rows})")
        return keys, idx, addr, stride, bool(n) and self._registered(addr, n_rows, stride)

    def _names(self, keys: np.ndarray) -> list[str]:
        return self.codec.keys(keys)

    # ------------------------------------------------------------ lookup

    def exists(self, keys: Any) -> np.ndarray:
        """(n,) bool: the cluster holds the block (one bounded call for the keys
        without a fresh cached answer; a failure is all misses)."""
        keys = _keys(keys)
        out = np.zeros(len(keys), bool)
        if self.guard.down:  # what it held may be gone when it comes back (no HA)
            with self._lock:
                self._exist.clear()
            self.stats.add(lookup_keys=len(keys), lookup_down=1, call_failures=1)
            return out
        now = time.monotonic()
        ttl = self.settings.exist_cache_s
        ask: list[int] | np.ndarray = np.arange(len(keys))
        if ttl > 0:
            flat = keys.tobytes()
            ask = []
            with self._lock:
                for i in range(len(keys)):
                    hit = self._exist.get(flat[32 * i:32 * i + 32])
                    if hit is not None and now - hit[1] < ttl:
                        out[i] = hit[0]
                    else:
                        ask.append(i)
        self.stats.add(lookup_keys=len(keys), lookup_cached=len(keys) - len(ask))
        if len(ask):
            sub = keys[ask]
            names = self._names(sub)
            for kid in self._old_ids:  # a rotation: rows older keys signed count too
                names += self.codec.names(sub, kid)

            def call() -> list[int]:
                rcs = self._store.batch_is_exist(names)
                if rcs and all(r < 0 for r in rcs):
                    raise RemoteUnavailable(f"batch_is_exist: rc {rcs[0]}")
                return rcs

            t = self.guard.submit("lookup", call)
            if t.outcome.ok:
                found = (np.array(t.outcome.value, np.int64) == 1).reshape(-1, len(sub)).any(axis=0)
                found &= ~self._distrust_mask(sub)
                out[ask] = found
                self._remember(sub, found)
        self.stats.add(lookup_hits=int(out.sum()))
        return out

    def _remember(self, keys: np.ndarray, present: np.ndarray | bool) -> None:
        if self.settings.exist_cache_s <= 0:
            return
        now = time.monotonic()
        flags = np.broadcast_to(np.asarray(present, bool), (len(keys),)).tolist()
        flat = np.ascontiguousarray(keys).tobytes()
        with self._lock:
            if len(self._exist) > 1 << 16:
                self._exist = {k: v for k, v in self._exist.items() if now - v[1] < self.settings.exist_cache_s}
            for i, f in enumerate(flags):
                self._exist[flat[32 * i:32 * i + 32]] = (f, now)

    def _distrust_mask(self, keys: np.ndarray) -> np.ndarray:
        """(n,) bool: the block's row failed to verify and no put of ours replaced it."""
        with self._lock:
            if not self._distrusted:
                return np.zeros(len(keys), bool)
            flat = np.ascontiguousarray(keys).tobytes()
            return np.array([flat[i:i + 32] in self._distrusted for i in range(0, len(flat), 32)], bool)

    def _distrust(self, keys: np.ndarray, on: bool) -> None:
        with self._lock:
            if on and len(self._distrusted) > 1 << 16:  # bounded: an old entry costs one extra put
                self._distrusted.clear()
            for k in np.ascontiguousarray(keys):
                (self._distrusted.add if on else self._distrusted.discard)(k.tobytes())

    def forget(self, keys: Any) -> None:
        """Drops cached lookup answers (e.g. a load found the block gone)."""
        with self._lock:
            for k in _keys(keys):
                self._exist.pop(k.tobytes(), None)

    # ------------------------------------------------------------ put

    def put(self, keys: Any, src: Any, src_idx: Any = None, *, skip_existing: bool = True) -> PutResult:
        """Publishes ``src[src_idx[i]]`` as ``keys[i]``; blocks the cluster holds
        already are skipped (one ``batch_is_exist`` first) unless
        ``skip_existing`` is False (Mooncake keeps an existing value either way)."""
        keys, idx, s_addr, s_stride, zero_copy = self._rows_arg(keys, src, src_idx, "src")
        n = len(keys)
        stored, skipped, failed = (np.zeros(n, bool) for _ in range(3))
        tickets: list[Ticket] = []
        for lo in self._chunks(n):
            hi = min(n, lo + self.settings.staging_rows)
            t = self._put_chunk(keys[lo:hi], src, idx[lo:hi], s_addr, s_stride, zero_copy,
                                skip_existing, stored[lo:hi], skipped[lo:hi], failed[lo:hi])
            if t is not None:
                tickets.append(t)
        self.stats.add(put_blocks=n, put_stored=int(stored.sum()), put_skipped=int(skipped.sum()),
                       put_failed=int(failed.sum()),
                       put_bytes=int(stored.sum()) * self.codec.row_bytes)
        held = stored | skipped
        if held.any():
            self._remember(keys[held], True)
        return PutResult(stored, skipped, failed, _Settle(tickets))

    def _buffers(self, rows, zero_copy: bool, user, idx, addr: int, stride: int):
        """Where a chunk's payloads and headers live: the caller's registered
        rows `user[idx]` (zero copy) or this tier's staging rows `rows`; the
        headers are always this tier's. Returns (payload array, its row
        indices, payload addresses, header addresses)."""
        if zero_copy:
            payload, p_idx = user, idx
            p_addrs = [addr + int(i) * stride for i in idx]
        else:
            payload, p_idx = self._stage, rows
            p_addrs = [self._stage.ctypes.data + int(r) * self.block_bytes for r in rows]
        h_addrs = [self._heads.ctypes.data + int(r) * HEADER_BYTES for r in rows]
        return payload, p_idx, p_addrs, h_addrs

    def _put_chunk(self, keys, src, idx, s_addr, s_stride, zero_copy, skip_existing,
                   stored, skipped, failed) -> Ticket | None:
        m = len(keys)
        rows = self._take_rows(m)
        if rows is None:
            failed[:] = True
            self.stats.add(no_rows=m)
            return None
        payload, p_idx, p_addrs, h_addrs = self._buffers(rows, zero_copy, src, idx, s_addr,
                                                         s_stride)
        names = self._names(keys)
        sizes = [HEADER_BYTES, self.block_bytes]
        store = self._store
        encoded = threading.Event()
        sound = [False]
        doubt = self._distrust_mask(keys)

        def encode() -> None:  # on the caller's thread, while the lookup is out
            try:
                if not zero_copy:
                    copy_rows(self._stage, rows, src, idx)
                heads = np.empty((m, HEADER_BYTES), np.uint8)
                self.codec.encode(heads, payload, p_idx, keys)
                self._heads[rows] = heads
                sound[0] = True
            finally:
                encoded.set()

        def call() -> np.ndarray:
            status = np.zeros(m, np.int64)       # 0 stored, 1 skipped, <0 rc of a failure
            todo = list(range(m))
            if skip_existing:
                ex = store.batch_is_exist(names)
                if ex and all(r < 0 for r in ex):
                    raise RemoteUnavailable(f"batch_is_exist: rc {ex[0]}")
                todo = [i for i in range(m) if ex[i] != 1 or doubt[i]]
                status[[i for i in range(m) if ex[i] == 1 and not doubt[i]]] = 1
            if doubt.any():  # an object that failed to verify is replaced, never skipped
                store.batch_remove([names[i] for i in np.flatnonzero(doubt)], True)
            encoded.wait()
            if not sound[0]:
                raise RuntimeError("the rows could not be encoded")
            if todo:
                rcs = store.batch_put_from_multi_buffers(
                    [names[i] for i in todo], [[h_addrs[i], p_addrs[i]] for i in todo],
                    [sizes] * len(todo))
                if all(r in ErrorCode.UNAVAILABLE for r in rcs):
                    raise RemoteUnavailable(f"batch_put: rc {rcs[0]}")
                for i, rc in zip(todo, rcs):
                    status[i] = 1 if rc == ErrorCode.EXISTS else (0 if rc == 0 else rc)
            return status

        t = self.guard.submit("put", call, meanwhile=encode)
        t.then(lambda: self._give_rows(rows))
        if t.outcome.ok:
            st = t.outcome.value
            stored[:] = st == 0
            skipped[:] = st == 1
            failed[:] = st < 0
            self.stats.add(put_no_space=int((st == ErrorCode.NO_SPACE).sum()),
                           put_replaced=int((doubt & (st == 0)).sum()))
            if doubt.any():
                self._distrust(keys[doubt & (st == 0)], False)
        else:
            failed[:] = True
        return t

    # ------------------------------------------------------------ get

    def get(self, keys: Any, dst: Any, dst_idx: Any = None) -> GetResult:
        """Loads ``keys[i]`` into ``dst[dst_idx[i]]``; ``ok[i]`` where the row
        arrived whole and verified. With registered ``dst`` the bytes land in
        place (a row with ok False may hold anything); otherwise only verified
        rows are copied in."""
        keys, idx, d_addr, d_stride, zero_copy = self._rows_arg(keys, dst, dst_idx, "dst")
        n = len(keys)
        ok = np.zeros(n, bool)
        tickets: list[Ticket] = []
        for lo in self._chunks(n):
            hi = min(n, lo + self.settings.staging_rows)
            t = self._get_chunk(keys[lo:hi], dst, idx[lo:hi], d_addr, d_stride, zero_copy, ok[lo:hi])
            if t is not None:
                tickets.append(t)
        hits = int(ok.sum())
        self.stats.add(get_blocks=n, get_hits=hits, get_misses=n - hits,
                       get_bytes=hits * self.codec.row_bytes)
        return GetResult(ok, _Settle(tickets))

    def _get_chunk(self, keys, dst, idx, d_addr, d_stride, zero_copy, ok) -> Ticket | None:
        m = len(keys)
        rows = self._take_rows(m)
        if rows is None:
            self.stats.add(no_rows=m)
            return None
        payload, p_idx, p_addrs, h_addrs = self._buffers(rows, zero_copy, dst, idx, d_addr,
                                                         d_stride)
        names = self._names(keys)
        sizes = [HEADER_BYTES, self.block_bytes]
        store = self._store
        old_ids = self._old_ids

        def call() -> list[int]:
            rcs = list(store.batch_get_into_multi_buffers(
                names, [[h, p] for h, p in zip(h_addrs, p_addrs)], [sizes] * m))
            if all(r in ErrorCode.UNAVAILABLE for r in rcs):
                raise RemoteUnavailable(f"batch_get: rc {rcs[0]}")
            for kid in old_ids:  # a rotation: what the write key's name lacks, older keys' names
                miss = [i for i in range(m) if rcs[i] == ErrorCode.NOT_FOUND]
                if not miss:
                    break
                old = self.codec.names(keys[miss], kid)
                again = store.batch_get_into_multi_buffers(
                    old, [[h_addrs[i], p_addrs[i]] for i in miss], [sizes] * len(miss))
                for j, i in enumerate(miss):
                    rcs[i], names[i] = again[j], old[j]
            return rcs

        t = self.guard.submit("get", call)
        try:
            if t.outcome.ok:
                rcs = np.array(t.outcome.value, np.int64)
                whole = rcs == self.codec.row_bytes
                good = np.zeros(m, bool)
                if whole.any():
                    sel = np.flatnonzero(whole)
                    good[sel] = self.codec.verify(self._heads[rows[sel]], payload, p_idx[sel], keys[sel])
                bad = whole & ~good
                gone = rcs == ErrorCode.NOT_FOUND
                self.stats.add(verify_failures=int(bad.sum()), get_not_found=int(gone.sum()),
                               get_errors=int(((rcs < 0) & ~gone).sum()))
                if not zero_copy and good.any():
                    copy_rows(dst, idx[good], self._stage, rows[good])
                ok[:] = good
                if gone.any():
                    self._remember(keys[gone], False)
                if bad.any():  # forged or corrupted: drop it; our next put replaces it
                    self._distrust(keys[bad], True)
                    gone_now = self._remove_names([names[i] for i in np.flatnonzero(bad)], True)
                    self.stats.add(verify_removed=int(gone_now.sum()))
                    self.forget(keys[bad])
        finally:
            t.then(lambda: self._give_rows(rows))
        return t

    # ------------------------------------------------------------ remove

    def remove(self, keys: Any, *, force: bool = False) -> np.ndarray:
        """(n,) bool: removed now (or absent already). A block another reader
        holds a lease on stays (``force`` overrides the lease)."""
        keys = _keys(keys)
        out = self._remove_names(self._names(keys), force)
        self.forget(keys[out])
        return out

    def _remove_names(self, names: list[str], force: bool) -> np.ndarray:
        out = np.zeros(len(names), bool)
        if not names:
            return out

        def call() -> list[int]:
            rcs = self._store.batch_remove(names, force)
            if all(r in ErrorCode.UNAVAILABLE for r in rcs):
                raise RemoteUnavailable(f"batch_remove: rc {rcs[0]}")
            return rcs

        t = self.guard.submit("remove", call)
        if t.outcome.ok:
            rcs = np.array(t.outcome.value, np.int64)
            out[:] = (rcs == 0) | (rcs == ErrorCode.NOT_FOUND)
            self.stats.add(removed=int(out.sum()), remove_leased=int((rcs == ErrorCode.LEASED).sum()))
        return out

    # ------------------------------------------------------------ status

    def _observe(self, op: str, outcome: Outcome) -> None:
        if outcome.ok:
            self.stats.observe(op, outcome.seconds)
        else:
            self.stats.add(**{f"{op}_{outcome.reason}": 1, "call_failures": 1})

    def snapshot(self) -> dict:
        """Counters, latencies, breaker state: what ``saria status`` shows."""
        d = self.stats.snapshot()
        d["breaker"] = self.guard.state.name.lower()
        d["breaker_transitions"] = self.guard.transitions
        d["in_flight"] = self.guard.in_flight
        d["namespace"] = self.codec.namespace
        d["master"] = self.settings.master
        return d

    def close(self, timeout: float = 10.0) -> None:
        """Waits up to ``timeout`` for late calls, then closes the client."""
        if self._closed:
            return
        self._closed = True
        end = time.monotonic() + timeout
        while self.guard.in_flight and time.monotonic() < end:
            time.sleep(0.01)
        self.guard.close(wait=False)
        if not self.guard.in_flight:
            try:
                self._store.close()
            except Exception:  # noqa: BLE001 -- closing a client whose master died
                pass

    def __enter__(self) -> "RemoteTier":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
