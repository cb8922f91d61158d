"""The unified radix-tree index: where every prefix block lives, and its history.

One tree over block keys (32-byte chained hashes; see ``saria.keys``) records for
every block which tiers hold it (GPU, DRAM, SSD and REMOTE -- the cluster's
store, as far as this node knows -- possibly several) with a slot handle in each
(a REMOTE copy is addressed by its key; its slot is whatever the caller keeps), and its history: reuse count, hit count, DRAM evictions, last
access time, creating session. History outlives residency: a block evicted from
every tier stays as a metadata-only node until the metadata budget
(``max_blocks``) needs the room; those nodes leave in their own LRU order,
childless first, so the tree never breaks.

Readiness. A copy in a tier is *ready* once its bytes are in place, *filling*
while a slot is taken and the bytes are on their way (``add(filling=True)``
until ``set_ready``). What a reader may see is the structure's own rule, not
its callers': ``match``, ``history``, ``slots_in``, ``slot_of`` and
``checkpoint_slot`` answer with ready copies only, so a filling copy is no
copy for a lookup, a load or an SSD write that reads a slot; it is never an
eviction victim either. ``residency`` answers which slots are *taken* (ready
or filling): what placement needs so that a block never gets a second slot.

The tree and its recency lists live in the native core (``saria._native``);
this class validates every argument before it reaches the core (a bad call
raises and leaves the index unchanged), converts keys, and serialises access
with a lock, so one index can be shared by threads. The core keeps the last
path it walked (a path handle, see ``native/index/radix_core.h``): the verbs
of one request, which all name prefixes of its keys, cost one walk between
them, with the answers of fresh walks.

Memory: each tracked block costs ``node_bytes`` (256 B: four tiers, four cache
lines) in the node array plus 16-32 B in the key table (8 B entries at load
factor 0.25-0.5): about 277 B per block on the WEKA trace, measured by ``saria
bench index``. The node array reserves the budget's address space up front
(pages are backed as nodes are created), so it never grows by copying. A
budget of 4 M blocks is ~1.2 GB.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from saria import _native
from saria.index.clock import Clock, wall_clock
from saria.index.types import (
    CheckpointRef,
    Evicted,
    IndexStats,
    ReloadPlan,
    Tier,
)

KEY_BYTES = int(_native.KEY_BYTES)
# The fastest tier (lowest set bit) of every residency mask; 0 for an empty mask.
_FASTEST = np.array([next((t for t in Tier if m & t.bit), 0) for m in range(1 << len(Tier))],
                    dtype=np.uint8)
NO_SLOT = int(_native.NO_SLOT)
_MAX_U32 = 0xFFFFFFFF

KeysLike = Any  # np.ndarray (n, 32) uint8 | Sequence[bytes]


class RadixIndex:
    """Unified metadata over GPU, DRAM and SSD tiers.

    Requests name their prefix as the list of its block keys, block 0 first.
    Typical use per request::

        plan = index.match(keys)                 # read-only
        index.touch(keys, hits=plan.num_blocks)  # record the access
        ...                                      # load plan, compute the rest
        index.add(keys, Tier.DRAM, slots, where=new_positions)

    Parameters
    ----------
    max_blocks:
        metadata budget: the most blocks tracked at once. Only metadata-only
        blocks are dropped to honour it; resident blocks are always tracked
        (so the bound is soft when the tiers alone hold more).
    hybrid:
        hybrid models (attention + recurrent layers): a hit is usable only up
        to a block boundary that has a state checkpoint.
    clock:
        time source for access times and recency cutoffs; ``wall_clock`` at
        run time, a ``VirtualClock`` in the simulator. Times never go backwards
        inside the index (a smaller reading counts as the last one).
    """

    def __init__(self, max_blocks: int = 4_000_000, *, hybrid: bool = False,
                 clock: Clock | None = None) -> None:
        max_blocks = _count("max_blocks", max_blocks)
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be at least 1, got {max_blocks}")
        self._core = _native.RadixCore(max_blocks, bool(hybrid))
        self._hybrid = bool(hybrid)
        self._max_blocks = max_blocks
        self._clock: Clock = clock if clock is not None else wall_clock
        self._lock = threading.Lock()

    # ------------------------------------------------------------ queries

    @property
    def hybrid(self) -> bool:
        return self._hybrid

    def __len__(self) -> int:
        return int(self._core.num_nodes())

    def match(self, keys: KeysLike, *, lock: bool = False) -> ReloadPlan:
        """Longest prefix of `keys` available in any tier, as a reload plan.

        Read-only: call ``touch`` to record the access. Blocks are taken from
        the fastest tier holding them, so a prefix interleaved across tiers
        (DRAM[0:40] SSD[40:90] DRAM[90:120]) is recovered whole. With `lock`
        the plan's blocks (its first ``num_blocks``) are also locked, as
        ``lock(keys[:plan.num_blocks])`` would: a lookup that pins what it
        found, in one walk.
        """
        arr = as_keys(keys)
        with self._lock:
            (n_known, n_avail, n_tbt, _first, n_usable, ckpt_tier, ckpt_slot,
             masks, slots, ckpt_masks, _fill) = self._core.match(arr, bool(lock))
        n = int(n_usable)
        tiers = _FASTEST[masks[:n]]
        checkpoint = None
        if ckpt_tier >= 0:
            checkpoint = CheckpointRef(boundary=n, tier=Tier(ckpt_tier), slot=int(ckpt_slot))
        return ReloadPlan(
            num_blocks=n,
            tiers=tiers,
            slots=slots[:n].astype(np.int64),
            num_known=int(n_known),
            num_available=int(n_avail),
            tier_by_tier_blocks=int(n_tbt),
            checkpoint=checkpoint,
            masks=masks,
            checkpoint_masks=ckpt_masks,
        )

    def residency(self, keys: KeysLike) -> tuple[int, np.ndarray, np.ndarray]:
        """``(num_known, masks, checkpoint_masks)`` of `keys`: the tiers in
        which each known block's KV and checkpoint hold a slot, ready *or
        filling* -- what placement needs, never what a reader may use (that
        is ``match``). Read-only."""
        arr = as_keys(keys)
        with self._lock:
            n_known, masks, ckpt_masks = self._core.residency(arr)
        return int(n_known), masks, ckpt_masks

    def filling(self, keys: KeysLike) -> tuple[np.ndarray, np.ndarray]:
        """``(masks, checkpoint_masks)`` of the known leading blocks of
        `keys`: the tiers in which each holds a filling copy. Read-only."""
        arr = as_keys(keys)
        with self._lock:
            n_known, *_, fill = self._core.match(arr)
        fill = fill[:int(n_known)]
        return fill & 0x0F, fill >> 4

    def history(self, keys: KeysLike) -> dict[str, np.ndarray]:
        """History of the known leading blocks of `keys` as parallel arrays:
        ``reuse``, ``hits``, ``dram_evictions``, ``last_access``, and their
        ready copies: ``tiers`` and ``checkpoints`` masks (``filling``: the
        tiers of their filling KV copies). Read-only."""
        arr = as_keys(keys)
        with self._lock:
            return dict(self._core.history(arr))

    def slot_of(self, key: bytes, tier: Tier | int | str, *, ready: bool = True) -> int | None:
        """Slot of one block's ready copy in one tier, or None if it has
        none there; with ``ready=False`` a filling copy's slot too."""
        t = Tier.parse(tier)
        with self._lock:
            slot = int(self._core.slot_of(_one_key(key), int(t), bool(ready)))
        return None if slot == NO_SLOT else slot

    def slots_in(self, keys: KeysLike, *tiers: Tier | int | str) -> tuple[np.ndarray, np.ndarray]:
        """For each known leading block of `keys`: its slot in the fastest of
        `tiers` holding a ready copy, and that tier (``NO_SLOT`` and -1 where
        none of them does). Read-only."""
        arr = as_keys(keys)
        mask = 0
        for t in tiers:
            mask |= Tier.parse(t).bit
        with self._lock:
            slots, which = self._core.path_slots(arr, mask)
        return slots.astype(np.int64), which

    def path_to(self, key: bytes) -> np.ndarray:
        """The keys of the prefix ending at block `key`, block 0 first
        (``(depth + 1, 32)`` uint8). Raises ValueError for an unknown block."""
        with self._lock:
            return self._core.path_to(_one_key(key))

    def checkpoint_slot(self, key: bytes, tier: Tier | int | str, *,
                        ready: bool = True) -> int | None:
        """Slot of the ready checkpoint after block `key` in `tier`, or None;
        with ``ready=False`` a filling one's too."""
        t = Tier.parse(tier)
        with self._lock:
            slot = int(self._core.ckpt_slot_of(_one_key(key), int(t), bool(ready)))
        return None if slot == NO_SLOT else slot

    def now(self) -> float:
        """The index's clock reading (what an operation without `now` uses)."""
        return self._now(None)

    def stats(self) -> IndexStats:
        with self._lock:
            c = self._core
            return IndexStats(
                nodes=int(c.num_nodes()),
                ghosts=int(c.num_ghosts()),
                resident={t.name: int(c.num_resident(int(t))) for t in Tier},
                checkpoints=int(c.num_checkpoints()),
                ghosts_dropped=int(c.ghosts_dropped()),
                max_blocks=self._max_blocks,
                memory_bytes=int(c.memory_bytes()),
                node_bytes=int(c.node_bytes()),
            )

    def dump(self) -> dict[str, np.ndarray]:
        """Every tracked block as parallel arrays (keys, parent, tiers, slots,
        history...). ``index``/``parent`` are internal node ids (parent 0 is the
        root); for tests, dumps and drawing the tree."""
        with self._lock:
            return dict(self._core.dump())

    def check(self) -> None:
        """Verifies the core's invariants (O(blocks)); raises on the first broken one."""
        with self._lock:
            self._core.check_invariants()

    # ---------------------------------------------------------- mutations

    def touch(self, keys: KeysLike, *, hits: int = 0, checkpoint_at: int = 0,
              now: float | None = None) -> int:
        """Records one access by a new request to the known prefix of `keys`.

        Every known leading block gets reuse += 1 and last_access = now and
        moves to the recent end of its lists (deepest first); the first `hits`
        also count a cache hit. `checkpoint_at` > 0 refreshes the checkpoint at
        that boundary. Returns the number of blocks touched.
        """
        arr = as_keys(keys)
        hits = _count("hits", hits)
        checkpoint_at = _count("checkpoint_at", checkpoint_at)
        with self._lock:
            return int(self._core.touch(arr, hits, checkpoint_at, self._now(now)))

    def touch_history(self, keys: KeysLike, *, hits: int = 0, checkpoint_at: int = 0,
                      now: float | None = None) -> tuple[int, dict[str, np.ndarray]]:
        """``touch`` and the ``history`` of the blocks it touched, in one walk:
        ``(blocks touched, history)`` where the history is what ``history``
        answers right after the touch, plus ``previous_access``: each block's
        ``last_access`` before it (how long it had been idle)."""
        arr = as_keys(keys)
        hits = _count("hits", hits)
        checkpoint_at = _count("checkpoint_at", checkpoint_at)
        with self._lock:
            m, h = self._core.touch_history(arr, hits, checkpoint_at, self._now(now))
        return int(m), dict(h)

    def add(self, keys: KeysLike, tier: Tier | int | str, slots: Any, *,
            where: Any = None, session: int = 0, filling: bool = False,
            lock: bool = False, now: float | None = None) -> int:
        """Makes blocks resident in `tier`, creating nodes as needed.

        `where` lists the positions (ascending) in `keys` that become resident,
        with `slots` their slot handles; by default every position. Missing
        nodes on the path are created (as metadata-only nodes if not in
        `where`) with `session` as creator. Raises if a block already holds
        `tier` or a key is indexed under a different prefix. With `filling`
        the new copies are filling until ``set_ready``. With `lock` the path
        up to the last position in `where` is then locked, as ``lock`` would
        (one walk for a store and its pin). Returns the number of nodes
        created.
        """
        arr = as_keys(keys)
        t = Tier.parse(tier)
        slot_arr = _u32_array("slots", slots)
        if where is None:
            where_arr = np.arange(arr.shape[0], dtype=np.int64)
        else:
            where_arr = _int_array("where", where)
        if where_arr.shape[0] != slot_arr.shape[0]:
            raise ValueError(
                f"add: {slot_arr.shape[0]} slots for {where_arr.shape[0]} positions")
        session = _u32("session", session)
        with self._lock:
            return int(self._core.add(arr, int(t), where_arr, slot_arr, session, self._now(now),
                                      bool(filling), bool(lock)))

    def set_ready(self, keys: KeysLike, tier: Tier | int | str, *,
                  now: float | None = None) -> None:
        """The filling copies in `tier` of the listed blocks (any order, no
        repeats) hold their bytes now: readers see them from here on. Raises
        if a block has no filling copy there."""
        arr = as_keys(keys)
        t = Tier.parse(tier)
        with self._lock:
            self._core.set_ready(arr, int(t), self._now(now))

    def add_existing(self, keys: KeysLike, tier: Tier | int | str, slots: Any, *,
                     now: float | None = None) -> None:
        """Gives already-indexed blocks (any order, no repeats) residency in
        `tier`, e.g. DRAM victims admitted to the SSD. Raises if a block is
        unknown or already holds `tier`."""
        arr = as_keys(keys)
        t = Tier.parse(tier)
        slot_arr = _u32_array("slots", slots)
        if slot_arr.shape[0] != arr.shape[0]:
            raise ValueError(f"add_existing: {slot_arr.shape[0]} slots for {arr.shape[0]} keys")
        with self._lock:
            self._core.add_existing(arr, int(t), slot_arr, self._now(now))

    def remove(self, keys: KeysLike, tier: Tier | int | str, *,
               now: float | None = None) -> np.ndarray:
        """Drops `tier` residency of the listed blocks (any order, no repeats);
        returns their slots. History is kept."""
        arr = as_keys(keys)
        t = Tier.parse(tier)
        with self._lock:
            return self._core.remove(arr, int(t), self._now(now)).astype(np.int64)

    def evict(self, tier: Tier | int | str, count: int, *, older_than: float | None = None,
              now: float | None = None, pin: KeysLike | None = None,
              unpin: bool = False) -> Evicted:
        """Pops up to `count` victims from `tier`: least recently used first,
        only blocks with no child in that tier (leaf-first), never locked ones,
        and with `older_than` only blocks not touched in the last `older_than`
        seconds. Their residency in `tier` is dropped; slots come back.

        Pinned eviction: with `pin` (a request's own path, every block
        indexed) the call first locks `pin` as ``lock`` does, so none of it
        is a victim, and with `unpin` unlocks it afterwards as ``unlock``
        does -- ``lock``, ``evict``, ``unlock`` in one call. Without `unpin`
        the pin stays locked for the caller to ``unlock``."""
        if pin is None:
            if unpin:
                raise ValueError("evict: unpin without a pin")
            return self._evict(self._core.evict, tier, count, older_than, now)
        arr = as_keys(pin)
        return self._evict(
            lambda t, c, cut, n: self._core.evict_pinned(t, c, cut, n, arr, bool(unpin)),
            tier, count, older_than, now)

    def place(self, keys: KeysLike, tier: Tier | int | str, *, free: int, session: int = 0,
              now: float | None = None) -> tuple[int, int]:
        """Placement in a tier whose slots carry nothing (the replay's GPU
        prefix cache; not for hybrid indexes), in one call: every block of
        `keys` holding no slot in `tier` becomes resident there with slot 0,
        the shallowest first, as far as `free` units plus the victims this
        call evicts allow. Exactly ``residency``, then -- when ``want`` such
        blocks exceed `free` -- ``evict(tier, want - free, pin=known prefix,
        unpin=True)`` (no pin when nothing is known), then ``add`` of the
        first ``min(want, free + victims)`` of them with `session`. Returns
        ``(blocks added, victims)``."""
        arr = as_keys(keys)
        t = Tier.parse(tier)
        free = _count("free", free)
        session = _u32("session", session)
        with self._lock:
            added, evicted = self._core.place(arr, int(t), free, session, self._now(now))
        return int(added), int(evicted)

    def lock(self, keys: KeysLike) -> None:
        """Pins the leading blocks of `keys` (all must be indexed): a locked
        block is never evicted. Locks nest."""
        arr = as_keys(keys)
        with self._lock:
            self._core.lock(arr)

    def unlock(self, keys: KeysLike, *, now: float | None = None) -> None:
        """Releases one lock on each block; unlocking counts as a use."""
        arr = as_keys(keys)
        with self._lock:
            self._core.unlock(arr, self._now(now))

    def hold(self, keys: KeysLike) -> None:
        """Locks independent blocks (any order, no repeats, all indexed),
        not their paths: e.g. the DRAM copies an SSD write is reading."""
        arr = as_keys(keys)
        with self._lock:
            self._core.hold(arr)

    def release(self, keys: KeysLike, *, now: float | None = None) -> np.ndarray:
        """Drops one ``hold`` (or lock) of each listed block; returns, per
        block, whether no lock is left on it. Counts as a use."""
        arr = as_keys(keys)
        with self._lock:
            return self._core.release(arr, self._now(now)).astype(bool)

    # -------------------------------------------------------- checkpoints

    def add_checkpoint(self, key: bytes, tier: Tier | int | str, slot: int, *,
                       filling: bool = False, now: float | None = None) -> None:
        """Records a state checkpoint at the boundary after the block `key`
        (hybrid indexes only), filling until ``set_checkpoint_ready`` when
        `filling`. It shares that block's history."""
        t = Tier.parse(tier)
        slot = _u32("slot", slot)
        with self._lock:
            self._core.ckpt_add(_one_key(key), int(t), slot, self._now(now), bool(filling))

    def set_checkpoint_ready(self, key: bytes, tier: Tier | int | str, *,
                             now: float | None = None) -> None:
        """A filling checkpoint's bytes are in place: readers see it."""
        t = Tier.parse(tier)
        with self._lock:
            self._core.ckpt_set_ready(_one_key(key), int(t), self._now(now))

    def remove_checkpoint(self, key: bytes, tier: Tier | int | str, *,
                          now: float | None = None) -> int:
        t = Tier.parse(tier)
        with self._lock:
            return int(self._core.ckpt_remove(_one_key(key), int(t), self._now(now)))

    def evict_checkpoints(self, tier: Tier | int | str, count: int, *,
                          older_than: float | None = None,
                          now: float | None = None) -> Evicted:
        """Pops up to `count` checkpoints from `tier`, least recently used
        first, skipping locked blocks."""
        return self._evict(self._core.ckpt_evict, tier, count, older_than, now)

    # ------------------------------------------------------------ helpers

    def _evict(self, core_call, tier, count, older_than, now) -> Evicted:
        t = Tier.parse(tier)
        count = _count("count", count)
        age = None if older_than is None else _seconds(older_than)
        with self._lock:
            now_v = self._now(now)
            cutoff = float("inf") if age is None else now_v - age
            d = core_call(int(t), count, cutoff, now_v)
        return _evicted(t, d)

    def _now(self, now: float | None) -> float:
        value = self._clock() if now is None else now
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise TypeError(f"now must be a number of seconds, not {type(value).__name__}") from None
        if value != value:  # NaN would break the time order
            raise ValueError("now is NaN")
        return value


class KeySet:
    """A set of block keys filled batch by batch (the replay's record of the
    blocks it wrote to and read from the SSD): adding a batch costs one
    native call, and the distinct counts are there at any time, with no sort
    of everything added. Not thread-safe."""

    def __init__(self) -> None:
        self._set = _native.KeySet()

    def __len__(self) -> int:
        return len(self._set)

    def add(self, keys: KeysLike) -> int:
        """Adds `keys` (repeats allowed); returns how many were new."""
        return int(self._set.add(as_keys(keys)))

    def contains(self, keys: KeysLike) -> np.ndarray:
        """(n,) bool: which of `keys` are in the set."""
        return self._set.contains(as_keys(keys)).astype(bool)

    def count_absent_from(self, other: "KeySet") -> int:
        """How many keys of this set `other` lacks."""
        return int(self._set.count_absent_from(other._set))

    def keys(self) -> np.ndarray:
        """Every key, (n, 32) uint8, in the order first added."""
        return self._set.keys()


def as_keys(keys: KeysLike) -> np.ndarray:
    """Converts keys to a C-contiguous (n, 32) uint8 array, or raises a clear
    TypeError/ValueError naming the offending key."""
    if isinstance(keys, np.ndarray):
        if keys.dtype != np.uint8 or keys.ndim != 2 or keys.shape[1] != KEY_BYTES:
            raise ValueError(
                f"keys array must have dtype uint8 and shape (n, {KEY_BYTES}), "
                f"got dtype {keys.dtype} and shape {keys.shape}")
        return np.ascontiguousarray(keys)
    if isinstance(keys, (bytes, bytearray, str)):
        raise TypeError("keys must be a sequence of keys, not a single "
                        f"{type(keys).__name__}")
    if not isinstance(keys, Sequence):
        raise TypeError(f"keys must be an (n, {KEY_BYTES}) uint8 array or a sequence of "
                        f"bytes, not {type(keys).__name__}")
    out = np.empty((len(keys), KEY_BYTES), dtype=np.uint8)
    for i, k in enumerate(keys):
        out[i] = np.frombuffer(_check_key(k, i), dtype=np.uint8)
    return out


def _check_key(k: Any, i: int | None) -> bytes:
    where = "key" if i is None else f"key {i}"
    if not isinstance(k, (bytes, bytearray, memoryview)):
        raise TypeError(f"{where} must be bytes, not {type(k).__name__}")
    k = bytes(k)
    if len(k) != KEY_BYTES:
        raise ValueError(f"{where} has {len(k)} bytes; the index stores {KEY_BYTES}-byte "
                         "keys (saria.keys.keys_to_array pads shorter digests)")
    return k


def _one_key(key: Any) -> np.ndarray:
    if isinstance(key, np.ndarray):
        if key.dtype != np.uint8 or key.shape != (KEY_BYTES,):
            raise ValueError(f"key array must be uint8 of shape ({KEY_BYTES},), got "
                             f"{key.dtype} {key.shape}")
        return np.ascontiguousarray(key)
    return np.frombuffer(_check_key(key, None), dtype=np.uint8)


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    value = int(value)
    if value < 0:
        raise ValueError(f"{name} must not be negative, got {value}")
    return value


def _u32(name: str, value: Any) -> int:
    value = _count(name, value)
    if value >= _MAX_U32:
        raise ValueError(f"{name} must be below {_MAX_U32}, got {value}")
    return value


def _seconds(value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"older_than must be seconds, not {type(value).__name__}") from None
    if not v >= 0:
        raise ValueError(f"older_than must not be negative, got {value}")
    return v


def _int_array(name: str, value: Any) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise TypeError(f"{name} must be a 1-D sequence of ints")
    if arr.size and arr.min() < 0:
        raise ValueError(f"{name} must not hold negative values")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _u32_array(name: str, value: Any) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise TypeError(f"{name} must be a 1-D sequence of ints")
    # One reduction for both bounds: a negative value is a huge one as uint64.
    if arr.size and arr.astype(np.int64, copy=False).view(np.uint64).max() >= _MAX_U32:
        if arr.min() < 0 or arr.dtype == np.uint64 and arr.max() >= 1 << 63:
            raise ValueError(f"{name} must not hold negative values")
        raise ValueError(f"{name} values must be below {_MAX_U32}")
    return arr.astype(np.uint32)


def _evicted(tier: Tier, d: dict) -> Evicted:
    return Evicted(tier=tier, keys=d["keys"], slots=d["slots"].astype(np.int64),
                   reuse=d["reuse"], hits=d["hits"], dram_evictions=d["dram_evictions"],
                   session=d["session"], depth=d["depth"], tiers_after=d["tiers_after"],
                   child_tiers=d["child_tiers"], checkpoints=d["ckpt"], last_access=d["last_access"])
