"""The cache core: every residency decision, for the replay and the engine alike.

``CacheManager`` holds the radix index, the admission and promotion policies
and the event log. It decides placement, eviction (and which victims
admission sends to the SSD), write-through, early persistence, promotion,
hybrid checkpoints and locking -- and moves no byte. A ``Backend`` below it
allocates slots and performs SSD writes; a mover beside it (the replay's
timing model, ``TieredCache``'s byte copies, a vLLM worker) reads and fills
the slots a spec names. Admission is asked from exactly one place per moment
(``_admit_accessed``, ``_admit_victims``, ``_admit_created``), as in
CacheLib Navy.

One request, in the order the engine and the replay both follow::

    plan = core.lookup(keys)                    # longest prefix in any tier
    core.touch(keys, hits=h)                    # history; early persistence
    load = core.prepare_load(keys, h)           # lock; where each block is
    ...                                         # mover reads the blocks
    core.complete_load(load, failed)            # unlock; bad SSD copies go
    store = core.prepare_store(keys, start=h)   # DRAM slots for new blocks
    ...                                         # mover fills them
    core.complete_store(store)                  # admission may write SSD
    promo = core.prepare_promotion(keys, load.positions(SSD), dram_blocks)
    ...                                         # mover copies SSD hits in
    core.complete_store(promo)

Invariants:

* a reader sees only ready copies. ``prepare_store`` / ``prepare_promotion``
  / ``prepare_checkpoint`` make *filling* copies (the index keeps the state:
  ``RadixIndex`` answers every read with ready copies only); the matching
  ``complete_*(success=True)`` makes them ready, a failure removes them. So
  ``lookup``, ``prepare_load`` (which falls back to a ready copy in another
  tier, else ends the prefix there), admission's SSD writes, promotion and
  another engine through the node server never read a slot before its
  bytes are in it;
* nothing on its way to the SSD is lost (asynchronous backends): a DRAM
  victim whose SSD write is queued keeps its slot and stays readable until
  the write lands, then it is an SSD block (write-behind: the shallowest
  ``Backend.write_behind`` victims at a time; past that a victim is written
  from a copy and is a miss until it lands, counted in
  ``stats.write_behind_full``); a failed write ends in a clean miss;
* the index is the only authority on residency: a slot is used only while
  the index maps a key to it and freed only after the index dropped it;
* a ``prepare_*`` call locks the blocks it hands out until its
  ``complete_*`` call; while the core makes room it also locks the request's
  known path, so a request never evicts its own prefix;
* a spec never names a slot it does not hold locked: a load that ends early
  (a failed cluster fetch, no DRAM room for one) is cut by ``shorten_load``,
  which releases only the blocks past the new end -- never unlock-then-relock,
  which would let a written write-behind victim leave DRAM (its slot reused)
  while the spec still names it;
* modules outside the core (the cluster residency, the runtime, the node
  server, the connector) use its public verbs only, so every invariant here
  is kept in this file;
* every SSD write goes through ``_write_blocks`` / ``_write_state``, which
  make room first (SSD victims are evicted leaf-first LRU) and never write a
  block that is on the SSD or on its way there;
* a DRAM victim's bytes are handed to the SSD writer before its slot is
  freed; a victim's checkpoint leaves the tier with it.

Not thread-safe: ``TieredCache`` serialises calls with its lock. In the
replay every fill and every SSD write completes inside the call that asked
for it (``CountingBackend`` is synchronous, the replay's mover fills before
it completes), so no reader ever meets a filling copy or a write in flight
there: readiness changes what a lookup sees in the engine only, and the
replay's decisions are the engine's.
"""

from __future__ import annotations

import contextlib

import numpy as np

from saria.core.backend import Backend
from saria.core.events import CacheEvent, EventLog
from saria.core.remote import RemoteResidency
from saria.core.specs import CacheStats, LoadSpec, SsdWrite, StateSpec, StoreSpec
from saria.index import NO_SLOT, RadixIndex, ReloadPlan, Tier
from saria.policy import AdmissionPolicy, PromotionPolicy
from saria.policy.publish import PublishPolicy
from saria.policy.returns import ReturnGaps

GPU, DRAM, SSD = Tier.GPU, Tier.DRAM, Tier.SSD


class CacheManager:
    """Decides what lives in which tier; see the module docstring."""

    def __init__(self, index: RadixIndex, admission: AdmissionPolicy,
                 promotion: PromotionPolicy, backend: Backend, *, events: bool = False,
                 record_writes: bool = False, publish: PublishPolicy | None = None,
                 remote_lookup_blocks: int = 64, remote_max_blocks: int = 1 << 20) -> None:
        self.index = index
        self.admission = admission
        self.promotion = promotion
        self.backend = backend
        self.hybrid = index.hybrid
        self.events = EventLog() if events else None
        self.stats = CacheStats()
        #: the SSD tier exists and the policy can write to it
        self.ssd_on = backend.capacity(SSD) > 0 and not admission.writes_nothing
        self._pending: set[bytes] = set()  # block SSD writes in flight (asynchronous backends)
        self._pending_states: set[bytes] = set()  # checkpoint writes in flight, by block key
        # Checkpoints a load spec names, (tier, handle) -> loads holding it: one
        # removed from the index meanwhile (superseded) keeps its slots until the
        # last of them lets go, so a load never reads a freed or reused handle.
        self._ckpt_readers: dict[tuple[int, int], int] = {}
        self._ckpt_parked: set[tuple[int, int]] = set()
        self._doomed: set[bytes] = set()   # removed by their owner while in flight
        self._behind: set[bytes] = set()   # victims kept in DRAM until their write lands
        self._linger: set[bytes] = set()   # landed victims a reader still holds
        # Blocks a request touched while their DRAM copy was filling: early
        # persistence asks about them once they are ready.
        self._deferred: set[bytes] = set()
        self._written: list[tuple[np.ndarray, bool]] | None = [] if record_writes else None
        backend.bind(self.complete_ssd_write)
        #: how long blocks sat idle before requests came back (kept only for
        #: policies that ask: the budget's value, promotion's learned cutoff)
        self.returns = ReturnGaps()
        self._observe = (admission.wants_returns or admission.wants_evicted_returns
                         or promotion.wants_returns)
        admission.bind(ssd_units=backend.capacity(SSD), state_units=backend.state_units,
                       returns=self.returns)
        #: the cluster tier's decisions (``saria.core.remote``), when the backend has one
        self.remote = (RemoteResidency(self, publish, lookup_blocks=remote_lookup_blocks,
                                       max_blocks=remote_max_blocks) if backend.remote else None)

    # ------------------------------------------------------------- queries

    def lookup(self, keys: np.ndarray) -> ReloadPlan:
        """The reload plan of the longest prefix of `keys` cached in any tier."""
        self.stats.lookups += 1
        plan = self.index.match(keys)
        if self.remote is not None:  # past the local prefix: what the cluster holds
            plan = self.remote.lookup(keys, plan)
        return plan

    def now(self) -> float:
        return self.index.now()

    # -------------------------------------------------------------- access

    def touch(self, keys: np.ndarray, *, hits: int, checkpoint_at: int = 0) -> int:
        """Records that a request referenced `keys`, the first `hits` served
        from cache, and lets admission persist its DRAM residents early.
        Returns the number of known blocks touched."""
        if not (self._observe or self.ssd_on):
            known = self.index.touch(keys, hits=hits, checkpoint_at=checkpoint_at)
            self.admission.tick(self.now())
            h = None
        else:
            # One walk: the touch, the idle times before it and the history after it.
            known, h = self.index.touch_history(keys, hits=hits, checkpoint_at=checkpoint_at)
            if self._observe:
                if known:
                    self.returns.observe(self.now() - h["previous_access"], self.now())
                if self.admission.wants_evicted_returns:  # back to blocks that left DRAM
                    gone = (h["dram_evictions"] > 0) & ((h["tiers"] & Tier.DRAM.bit) == 0)
                    if gone.any():
                        self.admission.on_returns(h["dram_evictions"][gone], self.now())
            self.admission.tick(self.now())
            if self.ssd_on and known:
                self._admit_accessed(keys[:known], h)
        if self.remote is not None and known:
            self.remote.publish_accessed(keys[:known], h)
        return known

    # --------------------------------------------------------------- loads

    def prepare_load(self, keys: np.ndarray, blocks: int, *, start: int = 0) -> LoadSpec:
        """Locks the longest cached prefix of ``keys[:blocks]`` and says where
        each of its blocks is read from (blocks before `start` are locked,
        not read). The prefix can be shorter than `blocks` when blocks left
        the cache since the caller's lookup."""
        plan = self.index.match(keys[:max(0, blocks)], lock=True)  # locks what it finds
        n = plan.num_blocks
        path = keys[:n].copy()
        if n == 0:
            return LoadSpec(path, 0, np.zeros(0, np.int8), np.zeros(0, np.int64))
        start = min(start, n)
        tiers, slots = plan.tiers.astype(np.int8), plan.slots
        if np.any(tiers[start:] == GPU):  # only the replay has a GPU tier
            slots, tiers = self.index.slots_in(path, DRAM, SSD)
        spec = LoadSpec(path, start, tiers, slots, plan.checkpoint)
        if plan.checkpoint is not None:
            self._hold_checkpoint(plan.checkpoint)
        if self.remote is not None:  # cluster-only blocks: fetched into filling DRAM slots
            spec = self.remote.prepare(spec)
        return spec

    def shorten_load(self, spec: LoadSpec, n: int) -> LoadSpec:
        """The spec's first `n` blocks only: the blocks past them are
        released (one lock each, as ``complete_load`` would), the first `n`
        keep the lock they had all along.

        This is where the load invariant is kept: *a spec never names a slot
        it does not hold locked*. A block is never unlocked and locked again
        while a spec still hands it out -- in between, a write-behind victim
        whose SSD write landed (kept in DRAM only for its readers) would
        leave DRAM and its slot go back to the pool while the spec still
        names it as a DRAM read."""
        n = max(0, min(int(n), spec.num_blocks))
        if n < spec.num_blocks:
            self._release_tail(spec.path[n:])
            self._release_checkpoint(spec.checkpoint)
        return LoadSpec(spec.path[:n], min(spec.start, n), spec.tiers[:n], spec.slots[:n],
                        spec.checkpoint if n == spec.num_blocks else None,
                        remote=spec.remote[spec.remote < n])

    def reserve_filling(self, path: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """DRAM slots for the blocks ``path[positions]`` (ascending, indexed,
        with no DRAM copy), for a mover to fill: room is made by evicting
        anything but `path`, the leading positions win, and each gets a
        *filling* DRAM copy (no reader sees it until ``complete_fetch``
        makes it ready). The caller holds `path` locked (a load spec).
        Returns the slots, one per leading position that got one."""
        pos = np.asarray(positions, np.int64)
        room = self._make_room(DRAM, pos.size, None, pin=path) if pos.size else 0
        pos = pos[:room]
        if pos.size == 0:
            return np.zeros(0, np.int64)
        slots = self.backend.alloc(DRAM, pos.size)
        self.index.add(path[: int(pos[-1]) + 1], DRAM, slots, where=pos, filling=True)
        return slots

    def complete_fetch(self, spec: LoadSpec, ok: np.ndarray) -> LoadSpec:
        """The mover fetched ``spec.remote``'s blocks from the cluster into
        their DRAM slots, `ok` where verified: they become ready DRAM copies;
        the returned spec ends before the first failed one (which leaves the
        index). See ``saria.core.remote``."""
        return self.remote.complete_fetch(spec, ok)

    def complete_load(self, spec: LoadSpec, failed: np.ndarray | None = None, *,
                      state_failed: bool = False) -> int:
        """The mover is done with `spec`: unlocks it. `failed` lists positions
        whose SSD read failed (I/O, checksum, wrong key): their SSD copies
        leave the tier, so no later plan relies on them. `state_failed`: the
        SSD read of its checkpoint failed -- that copy leaves too, and the
        hit served nothing past its start (a hybrid hit needs its state).
        Returns the blocks served, the prefix before the first failure."""
        n = spec.num_blocks
        if n:
            self._unlock(spec.path)
        self._release_checkpoint(spec.checkpoint)
        served = n
        if failed is not None and len(failed):
            failed = np.unique(np.asarray(failed, np.int64))
            served = int(failed[0])
            self._drop_failed(spec, failed)
        if state_failed and spec.checkpoint is not None:
            served = min(served, spec.start)
            self._drop_failed_checkpoint(spec.checkpoint, spec.path[spec.checkpoint.boundary - 1])
        dram, ssd = spec.hits(served)
        if spec.remote.size:  # fetched from the cluster: DRAM copies now, counted apart
            remote = spec.remote_hits(served)
            self.stats.remote_hit_blocks += remote
            dram -= remote
        self.stats.hit_blocks["DRAM"] += dram
        self.stats.hit_blocks["SSD"] += ssd
        return served

    def cancel_load(self, spec: LoadSpec) -> None:
        """Releases a prepared load that will not be read (the engine did
        not schedule it, or its copy failed for a reason of its own): unlocks
        it; no hit is counted and every copy stays."""
        if spec.num_blocks:
            self._unlock(spec.path)
        self._release_checkpoint(spec.checkpoint)

    def _drop_failed(self, spec: LoadSpec, failed: np.ndarray) -> None:
        self.stats.ssd_read_failures += int(failed.size)
        # Only copies still in the slot that failed: the block may have left
        # the SSD, or been written again elsewhere, meanwhile.
        still, _ = self.index.slots_in(spec.path, SSD)
        failed = failed[failed < still.shape[0]]
        lost = failed[still[failed] == spec.slots[failed]]
        if lost.size:
            self.drop_ssd(spec.path[lost])

    def _drop_failed_checkpoint(self, ck, key: np.ndarray) -> None:
        """A checkpoint whose SSD read failed leaves the tier, if the index
        still holds that copy (it may have been replaced meanwhile)."""
        self.stats.ssd_read_failures += 1
        if ck.tier == SSD and self.index.checkpoint_slot(bytes(key), SSD) == ck.slot:
            self._free_checkpoint(key, SSD)

    def drop_ssd(self, keys: np.ndarray) -> None:
        """Drops SSD copies that proved unusable (a failed read)."""
        handles = self.index.remove(keys, SSD)
        self.backend.free(SSD, handles)
        if self.events is not None:
            self.events.removed(SSD, keys)

    def writing(self, key: bytes) -> bool:
        """Whether an SSD write of block `key` is in flight (an asynchronous
        backend has it queued; the block is in no tier meanwhile unless DRAM
        still holds it)."""
        return key in self._pending

    def remove(self, keys: np.ndarray) -> int:
        """An owner's delete: every ready DRAM and SSD copy of the listed
        blocks (independent keys, any order, none locked by a reader) leaves
        the cache; their history stays. A block on its way to the SSD gets no
        SSD copy when its write lands, and a victim kept readable meanwhile
        leaves DRAM then. Returns the copies dropped, a deferred one counting
        as one."""
        dropped = 0
        if self._pending:
            later = np.array([bytes(k) in self._pending for k in keys], bool)
            self._doomed.update(map(bytes, keys[later]))
            behind = np.array([bytes(k) in self._behind for k in keys], bool)
            dropped += int(np.count_nonzero(behind))
            keys = keys[~behind]
        for tier in (DRAM, SSD):
            here = np.array([self.index.slot_of(bytes(k), tier) is not None for k in keys], bool)
            if here.any():
                self.backend.free(tier, self.index.remove(keys[here], tier))
                if self.events is not None:
                    self.events.removed(tier, keys[here])
                dropped += int(here.sum())
        return dropped

    # -------------------------------------------------------------- stores

    def prepare_store(self, keys: np.ndarray, start: int = 0, *, session: int = 0,
                      direct: bool = False) -> StoreSpec:
        """DRAM slots for the blocks ``keys[start:]`` not yet in DRAM (new KV
        lands in DRAM), evicting LRU blocks as needed. When DRAM cannot hold
        them all the leading ones win (they are the shared prefix). With
        `direct` the caller can also hand over the bytes of the others: the
        ones write-through admission takes go straight to the SSD
        (``spec.direct``), as a write-through cache writes every block it
        creates."""
        known, masks = self._masks(keys)
        pos = np.arange(start, keys.shape[0])
        pos = pos[(masks[pos] & DRAM.bit) == 0]
        spec = self._allocate(keys[:known], keys, pos, masks, None, session, False)
        rest = pos[spec.num_blocks:]
        if direct and self.ssd_on and rest.size:
            want = self.admission.on_create(keys[rest], self.now())
            rest = rest[want & ((masks[rest] & SSD.bit) == 0)]
            if rest.size:
                spec.direct = rest
                spec.chain = keys[: int(rest[-1]) + 1].copy()
        return spec

    def prepare_promotion(self, keys: np.ndarray, ssd_positions: np.ndarray,
                          dram_blocks: int) -> StoreSpec:
        """After a prefill that read `ssd_positions` from the SSD (and
        `dram_blocks` blocks from DRAM): DRAM slots for the SSD hits the
        promotion policy picks, taking only the slots of DRAM blocks idle for
        its recency cutoff. The mover copies those blocks from the engine's KV
        pages (or the bytes it read) into the slots; nothing else of an SSD
        hit enters DRAM."""
        pick = self.promotion.select(np.asarray(ssd_positions, np.int64), dram_blocks)
        if pick.size == 0:
            return _empty_store(keys, True)
        known, masks = self._masks(keys)
        pick = pick[(masks[pick] & DRAM.bit) == 0]
        return self._allocate(keys[:known], keys, pick, masks,
                              self.promotion.victim_age(self.returns), 0, True)

    def complete_store(self, spec: StoreSpec, *, success: bool = True,
                       direct_rows: np.ndarray | None = None) -> int:
        """The mover filled (`success`) or failed to fill a store's slots.
        Filled new blocks go through write-through admission, the direct ones
        (bytes `direct_rows`, one per ``spec.direct``) go to the SSD, then
        the path is unlocked; failed ones leave DRAM. Returns the blocks kept
        in DRAM."""
        n = spec.num_blocks
        keys = spec.keys
        if not success:
            if n:  # filling copies: no reader saw them, no event announced them
                self._unlock(spec.path)
                self.backend.free(DRAM, self.index.remove(keys, DRAM))
                if self._deferred:
                    self._deferred.difference_update(map(bytes, keys))
            return 0
        if n:
            self.index.set_ready(keys, DRAM)
            if self.events is not None:
                self.events.stored(DRAM, spec.path, spec.positions)
            if self._deferred and self.ssd_on:
                self._admit_deferred(spec, keys)
        if spec.promotion:
            self.stats.promoted_blocks += n
        else:
            self.stats.stored_blocks += n
            if self.ssd_on and n:
                self._admit_created(spec, keys)
            if self.remote is not None and n:  # write-through publishing (the policy's choice)
                self.remote.publish_stored(keys, spec.slots)
            if spec.direct.size:
                self._write_direct(spec, direct_rows)
        if n:
            self._unlock(spec.path)
        return n

    def place(self, keys: np.ndarray, tier: Tier, *, session: int = 0) -> int:
        """Makes every block of `keys` resident in `tier` with no admission:
        the replay's model of the GPU prefix cache (after prefill the whole
        prompt is in HBM). Returns the blocks added."""
        if tier == GPU and self.backend.slotless and not self.hybrid:
            # A GPU victim's release touches no index state (see _make_room):
            # masks, pinned eviction and the add are one index call.
            if self.backend.capacity(tier) == 0:
                return 0
            added, freed = self.index.place(keys, tier, free=self.backend.free_units(tier),
                                            session=session)
            self.backend.recount(tier, added, freed)
            return added
        known, masks = self._masks(keys)
        pos = np.flatnonzero((masks & tier.bit) == 0)
        if pos.size == 0 or self.backend.capacity(tier) == 0:
            return 0
        pos = pos[:self._make_room(tier, pos.size, None, pin=keys[:known])]
        if pos.size:
            self.index.add(keys[:int(pos[-1]) + 1], tier, self.backend.alloc(tier, pos.size),
                           where=pos, session=session)
        return int(pos.size)

    # ------------------------------------------------- hybrid checkpoints

    def prepare_checkpoint(self, keys: np.ndarray, *, keep: int = 0) -> StateSpec | None:
        """After prefill a hybrid model's state at the prompt's last full block
        is kept in HBM and DRAM; it supersedes the path's shallower
        checkpoints there (a session's earlier turns), which would only hold
        memory -- a superseded DRAM checkpoint is a DRAM victim, so admission
        decides on it as for an evicted block. Room is made from any block
        but the request's reused prefix (its first `keep` blocks): the
        request's own new, deepest blocks may give way to its checkpoint,
        which they are useless without. Returns the state to fill (None when
        the prompt's last block is not cached); the path stays locked until
        ``complete_checkpoint``."""
        n = keys.shape[0]
        known, masks, ck = self.index.residency(keys)
        if n == 0 or known < n or not masks[n - 1]:
            return None
        path = keys.copy()
        ck = ck.copy()
        key = path[n - 1]
        fill = None
        if self.hybrid:  # another request's checkpoint still filling is not superseded
            ck_fill = self.index.filling(keys)[1]
        with self._pinned(path[:min(keep, n)]):
            for tier in (GPU, DRAM):
                older = np.flatnonzero(((ck[:n - 1] & ~ck_fill[:n - 1]) & tier.bit) != 0)
                if tier == DRAM and older.size and self.ssd_on:
                    self._admit_superseded(path, older, ck)
                for p in older:
                    self._free_checkpoint(path[p], tier)
                    ck[p] &= 0xFF ^ tier.bit
                if ck[n - 1] & tier.bit or self.backend.capacity(tier) == 0:
                    continue
                units = self.backend.state_units
                if self._make_room(tier, units, None) >= units:
                    handle = self.backend.alloc_state(tier)
                    # the DRAM copy is filling until the mover copied the state in
                    self.index.add_checkpoint(bytes(key), tier, handle, filling=tier == DRAM)
                    ck[n - 1] |= tier.bit
                    if tier == DRAM:
                        fill = handle
            self.index.lock(path)  # a node with a checkpoint is never dropped: all n known
        return StateSpec(path, fill)

    def complete_checkpoint(self, spec: StateSpec, *, success: bool = True) -> None:
        """The mover copied (or failed to copy) the state into DRAM; the
        checkpoint then shares its block's write-through admission."""
        key = spec.path[-1]
        if not success and spec.dram_handle is not None:
            self._free_checkpoint(key, DRAM)
        else:
            if spec.dram_handle is not None:
                self.index.set_checkpoint_ready(bytes(key), DRAM)
            if self.ssd_on and self.index.checkpoint_slot(bytes(key), SSD) is None:
                dram = self.index.checkpoint_slot(bytes(key), DRAM)
                if dram is not None and self.admission.on_create(spec.path[-1:], self.now())[0]:
                    self._write_state(key, dram)
        self._unlock(spec.path)

    # ------------------------------------------------------------- restart

    def adopt_ssd(self, keys: np.ndarray, positions: list[int], handles: list[int]) -> None:
        """Puts SSD blocks found after a restart back into the index, at
        `positions` of the key chain `keys` (the store does not record
        parents; a lookup's chain supplies them)."""
        if not positions:
            return
        self.index.add(keys[:positions[-1] + 1], SSD, handles, where=positions)
        self.stats.adopted_blocks += len(positions)
        if self.events is not None:
            self.events.stored(SSD, keys, np.asarray(positions))

    def adopt_ssd_state(self, key: np.ndarray, handle: int) -> bool:
        """Puts a state checkpoint found on the SSD after a restart back on
        its block (which must be in the index); False when it cannot be."""
        return self._adopt_state(key, handle)

    # --------------------------------------------------------------- events

    def take_events(self) -> list[CacheEvent]:
        """Residency events since the last call (with ``events=True``)."""
        return [] if self.events is None else self.events.take()

    def take_ssd_writes(self) -> list[tuple[np.ndarray, bool]]:
        """SSD writes completed since the last call, as (keys, is_state)
        batches (with ``record_writes=True``): the replay's byte accounting."""
        if self._written is None:
            return []
        out, self._written = self._written, []
        return out

    # ----------------------------------------------------- SSD completions

    def complete_ssd_write(self, job: SsdWrite, handles: np.ndarray) -> None:
        """A backend finished `job`: written blocks gain SSD residency. A
        block that left the index or reached the SSD meanwhile gives its new
        copy back. Called by the backend (inline or from its writer thread,
        under the cache's lock)."""
        keys = job.keys
        if self.backend.asynchronous:
            self._in_flight(job).difference_update(map(bytes, keys))
        handles = np.asarray(handles, np.int64)
        ok = handles >= 0
        self.stats.ssd_write_failures += int(np.count_nonzero(~ok))
        if self._doomed and not job.state:  # removed while in flight: the copy goes back at once
            doomed = np.array([bytes(k) in self._doomed for k in keys], bool)
            self._doomed.difference_update(map(bytes, keys[doomed]))
            self._free_ssd(job, handles[doomed & ok])
            ok &= ~doomed
        try:
            self._add_written(job, ok, handles)
        finally:
            if self._behind and not job.state:
                self._end_behind(keys)

    def _add_written(self, job: SsdWrite, ok: np.ndarray, handles: np.ndarray) -> None:
        keys, handles = job.keys[ok], handles[ok]
        if keys.shape[0] == 0:
            return
        if job.state:
            kept = [self._adopt_state(k, int(h)) for k, h in zip(keys, handles)]
            keys = keys[np.asarray(kept, bool)]
            self.stats.ssd_write_states += int(keys.shape[0])
        elif job.positions is not None:
            keys = self._add_ssd_path(job.path, job.positions[ok], handles)
            self.stats.ssd_write_blocks += int(keys.shape[0])
        else:
            keys = self._add_ssd_copies(keys, handles)
            self.stats.ssd_write_blocks += int(keys.shape[0])
            if self.events is not None:
                self.events.stored_loose(SSD, keys)
        if self._written is not None and keys.shape[0]:
            self._written.append((keys, job.state))

    def _free_ssd(self, job: SsdWrite, handles: np.ndarray) -> None:
        if handles.size:
            if job.state:
                for h in handles:
                    self.backend.free_state(SSD, int(h))
            else:
                self.backend.free(SSD, handles)

    def _end_behind(self, keys: np.ndarray) -> None:
        """A write completed (landed, failed or dropped): the victims among
        `keys` kept in DRAM for it leave DRAM -- now, or when the last reader
        of them lets go."""
        mine = np.array([bytes(k) in self._behind for k in keys], bool)
        if not mine.any():
            return
        keys = keys[mine]
        self._behind.difference_update(map(bytes, keys))
        free = self.index.release(keys)
        self._linger.update(map(bytes, keys[~free]))
        if free.any():
            self._leave_dram(keys[free], retained=int(free.sum()))

    def _leave_dram(self, keys: np.ndarray, retained: int) -> None:
        """Ready DRAM copies nobody holds leave; `retained` of them had
        write-behind slots."""
        self.backend.free(DRAM, self.index.remove(keys, DRAM))
        if retained:
            self.backend.unretain(retained)
        if self.events is not None:
            self.events.removed(DRAM, keys)

    # ------------------------------------------------- admission (one place)

    def _admit_accessed(self, path: np.ndarray, h: dict[str, np.ndarray]) -> None:
        """Early persistence: DRAM residents a request referenced (`h`: their
        history, which already counts the access). Every resident is shown
        to the policy -- a stateful one (KVBM's frequency filter) counts
        every sighting -- and the write skips those already on the SSD."""
        masks, ckpt = h["tiers"], h["checkpoints"]
        if h["filling"].any():  # no reader of an unfilled slot: asked again when it is ready
            self._deferred.update(map(bytes, path[(h["filling"] & DRAM.bit) != 0]))
        resident = np.flatnonzero((masks & DRAM.bit) != 0)
        if resident.size == 0:
            return
        want = self.admission.on_access(path[resident], h["reuse"][resident],
                                        h["hits"][resident], self.now(),
                                        last_access=h["last_access"][resident], depth=resident,
                                        on_ssd=(masks[resident] & SSD.bit) != 0)
        self._persist_path(path, resident[want], masks, ckpt, pin=path)

    def _admit_deferred(self, spec: StoreSpec, keys: np.ndarray) -> None:
        """Early persistence of blocks a request touched while they were
        filling (engine only: the replay never touches a filling block), now
        that their bytes are in place, with their history as it stands."""
        mine = np.array([bytes(k) in self._deferred for k in keys], bool)
        if not mine.any():
            return
        self._deferred.difference_update(map(bytes, keys[mine]))
        h = self.index.history(spec.path)
        pos = spec.positions[mine]
        masks = h["tiers"]
        want = self.admission.on_access(spec.path[pos], h["reuse"][pos], h["hits"][pos],
                                        self.now(), last_access=h["last_access"][pos], depth=pos,
                                        on_ssd=(masks[pos] & SSD.bit) != 0)
        self._persist_path(spec.path, pos[want], masks, h["checkpoints"], pin=spec.path)

    def _admit_created(self, spec: StoreSpec, keys: np.ndarray) -> None:
        """Write-through: blocks just stored in DRAM. Their residency is the
        spec's plus DRAM (the stored path is locked: nothing evicted it)."""
        want = self.admission.on_create(keys, self.now())
        if not want.any():
            return
        masks = np.zeros(spec.path.shape[0], np.uint8)
        masks[spec.positions] = spec.masks | DRAM.bit
        ckpt = self.index.residency(spec.path)[2] if self.hybrid else masks
        self._persist_path(spec.path, spec.positions[want], masks, ckpt)

    def _admit_victims(self, ev) -> np.ndarray | None:
        """DRAM victims (their ``dram_evictions`` counts this eviction); a
        victim's DRAM checkpoint shares its block's decision. Returns the
        victims that keep their slot until their write lands (write-behind),
        or None."""
        want = self.admission.on_evict(ev.keys, ev.reuse, ev.hits, ev.dram_evictions, self.now(),
                                       last_access=ev.last_access, depth=ev.depth,
                                       on_ssd=(ev.tiers_after & SSD.bit) != 0)
        blocks = want & ((ev.tiers_after & SSD.bit) == 0)
        if self.remote is not None:  # one copy per cluster: a victim it holds may skip the SSD
            blocks = self.remote.skip_ssd(ev, blocks)
        kept = np.zeros(len(ev), bool)
        if blocks.any() or self._pending:
            kept[self._write_victims(ev.keys, ev.slots, ev.depth, blocks)[1]] = True
        if self.hybrid:
            ck = ((ev.checkpoints & DRAM.bit) != 0) & ((ev.checkpoints & SSD.bit) == 0)
            for i in np.flatnonzero(ck):
                if want[i]:  # the checkpoint shares its block's decision
                    self._write_state(ev.keys[i], self.index.checkpoint_slot(bytes(ev.keys[i]), DRAM))
                else:
                    kept[i] |= self._admit_context(ev, i, bool(kept[i]))
        return kept if self.backend.asynchronous and kept.any() else None

    def _admit_context(self, ev, i: int, kept: bool) -> bool:
        """Session-level admission of a hybrid model's state: a checkpoint
        leaving DRAM whose block admission refused is persisted when its
        *context* (the path up to it) proved reuse -- the strongest history
        along the path, this eviction counted -- together with every KV block
        of the path not on the SSD yet, so an SSD hit ends at a usable
        boundary. A path with a block cached nowhere could never use it.
        `kept`: the victim is in DRAM already, its write queued. Returns
        whether the victim keeps its slot until its write lands."""
        key = ev.keys[i]
        path = self.index.path_to(bytes(key))
        h = self.index.history(path)
        masks = h["tiers"]
        if not (masks[:-1] != 0).all():
            return False
        evictions = max(int(ev.dram_evictions[i]), int(h["dram_evictions"][:-1].max(initial=0)) + 1)
        now = self.now()
        if not self.admission.on_context(int(h["reuse"].max()), int(h["hits"].max()), evictions,
                                         now, last_access=float(ev.last_access[i]),
                                         depth=path.shape[0] - 1):
            return False
        pos = np.flatnonzero(((masks[:-1] & DRAM.bit) != 0) & ((masks[:-1] & SSD.bit) == 0))
        written = self._write_blocks(path[pos], self.index.slots_in(path, DRAM)[0][pos]).size
        if not kept and not ev.tiers_after[i] & SSD.bit:  # the victim: its slot is freed after this
            done, behind = self._write_victims(key[None], ev.slots[i:i + 1], ev.depth[i:i + 1],
                                               np.ones(1, bool))
            written += done.size
            kept = bool(behind.size)
        self.admission.charge(written, now)
        self._write_state(key, self.index.checkpoint_slot(bytes(key), DRAM), decided=1)
        return kept

    def _admit_superseded(self, path: np.ndarray, older: np.ndarray, ck: np.ndarray) -> None:
        h = self.index.history(path[: int(older[-1]) + 1])
        want = self.admission.on_evict(path[older], h["reuse"][older], h["hits"][older],
                                       h["dram_evictions"][older], self.now(),
                                       last_access=h["last_access"][older], depth=older,
                                       on_ssd=(ck[older] & SSD.bit) != 0)
        for p in older[want & ((ck[older] & SSD.bit) == 0)]:
            if self._write_state(path[p], self.index.checkpoint_slot(bytes(path[p]), DRAM),
                                 decided=1):
                ck[p] |= SSD.bit

    # ----------------------------------------------------------- SSD writes

    def _persist_path(self, path: np.ndarray, positions: np.ndarray, masks: np.ndarray,
                      ckpt_masks: np.ndarray, pin: np.ndarray | None = None) -> None:
        """Writes DRAM-resident path blocks at `positions` that are not on
        the SSD yet, with the DRAM checkpoints they carry."""
        pos = positions[(masks[positions] & SSD.bit) == 0]
        if pos.size == 0:
            return
        sources = self.index.slots_in(path[: int(pos[-1]) + 1], DRAM)[0][pos]
        written = self._write_blocks(path[pos], sources, pin)
        if self.hybrid and written.size:
            pos = pos[written]
            ck = ckpt_masks[pos]
            for p in pos[((ck & DRAM.bit) != 0) & ((ck & SSD.bit) == 0)]:
                self._write_state(path[p], self.index.checkpoint_slot(bytes(path[p]), DRAM), pin)

    def _write_blocks(self, keys: np.ndarray, sources: np.ndarray,
                      pin: np.ndarray | None = None) -> np.ndarray:
        """Asks the backend to write `keys` (bytes in ready DRAM copies at
        `sources`, copied when the write is submitted) after making room;
        returns the indices (into `keys`) that were submitted."""
        return self._write(keys, sources, self._not_pending(keys), pin, retain=False)

    def _write_victims(self, keys: np.ndarray, sources: np.ndarray, depth: np.ndarray,
                       write: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """SSD writes of the DRAM victims `write` selects (their slots at
        `sources`, their `depth` in their prefix), as ``_write_blocks``. On
        an asynchronous backend the victims whose write is queued -- these
        ones or earlier ones -- go back into DRAM, held, until it lands:
        ``write_behind_room`` of them, the shallowest (a deeper block is no
        hit without its prefix). They stay readable, and a new write reads
        their slots when it runs. The others are written from a copy (a miss
        until they land; counted). Returns (submitted, kept) indices."""
        if not self.backend.asynchronous:
            return self._write(keys, sources, np.flatnonzero(write), None, retain=False), \
                np.zeros(0, np.int64)
        queued = np.zeros(keys.shape[0], bool)
        if self._pending:
            queued = np.array([bytes(k) in self._pending for k in keys], bool)
        write = write & ~queued
        going = np.flatnonzero(write | queued)
        keep = np.zeros(keys.shape[0], bool)
        keep[going[np.argsort(depth[going], kind="stable")[:self.backend.write_behind_room()]]] = True
        stay = np.flatnonzero(keep & queued)
        if stay.size:
            self._retain(keys[stay], sources[stay])
        kept = self._write(keys, sources, np.flatnonzero(keep & write), None, retain=True)
        self.stats.write_behind_full += int(np.count_nonzero((write | queued) & ~keep))
        rest = self._write(keys, sources, np.flatnonzero(write & ~keep), None, retain=False)
        return np.concatenate([kept, rest]), np.sort(np.concatenate([stay, kept]))

    def _not_pending(self, keys: np.ndarray) -> np.ndarray:
        idx = np.arange(keys.shape[0])
        if self._pending:
            idx = idx[[bytes(k) not in self._pending for k in keys]]
        return idx

    def _write(self, keys: np.ndarray, sources: np.ndarray, idx: np.ndarray,
               pin: np.ndarray | None, *, retain: bool) -> np.ndarray:
        """Submits ``keys[idx]``; with `retain`, victims kept in DRAM whose
        slots the backend reads when it writes (``SsdWrite.held``)."""
        if idx.size == 0:
            return idx
        if retain:  # before making SSD room: nothing may drop the victims' nodes meanwhile
            self._retain(keys[idx], sources[idx])
        room = self._make_room(SSD, idx.size, None, pin=pin)
        self.stats.writes_dropped += int(idx.size) - room
        if retain and room < idx.size:
            self._unretain(keys[idx[room:]])
        idx = idx[:room]
        if idx.size == 0:
            return idx
        job = SsdWrite(keys[idx], sources[idx], held=retain)
        if not self._submit(job):
            if retain:
                self._unretain(job.keys)
            return idx[:0]
        return idx

    def _retain(self, keys: np.ndarray, slots: np.ndarray) -> None:
        """Victims back into DRAM at their slots, held until their write
        completes (write-behind)."""
        self.index.add_existing(keys, DRAM, slots)
        self.backend.retain(keys.shape[0])
        self.index.hold(keys)
        self._behind.update(map(bytes, keys))

    def _unretain(self, keys: np.ndarray) -> None:
        """Undoes ``_retain`` for victims whose write was not submitted: they
        leave DRAM after all (their slots are freed with the other victims')."""
        self.index.release(keys)
        self.index.remove(keys, DRAM)
        self.backend.unretain(keys.shape[0])
        self._behind.difference_update(map(bytes, keys))

    def _write_direct(self, spec: StoreSpec, rows: np.ndarray | None) -> None:
        """Writes new blocks that DRAM could not take straight to the SSD."""
        pos = spec.direct
        idx = np.arange(pos.size)
        if self._pending:
            idx = idx[[bytes(k) not in self._pending for k in spec.chain[pos]]]
        room = self._make_room(SSD, idx.size, None, pin=spec.path) if idx.size else 0
        self.stats.writes_dropped += int(idx.size) - room
        idx = idx[:room]
        if idx.size:
            self._submit(SsdWrite(spec.chain[pos[idx]], None, rows=None if rows is None
                                  else rows[idx], path=spec.chain, positions=pos[idx]))

    def _write_state(self, key: np.ndarray, dram_handle: int | None,
                     pin: np.ndarray | None = None, decided: int = 0) -> bool:
        """Writes a checkpoint; admission is charged its units (less the
        `decided` ones its own decision already spent)."""
        units = self.backend.state_units
        if dram_handle is None or bytes(key) in self._pending_states:
            return False
        if self._make_room(SSD, units, None, pin=pin) < units:
            self.stats.writes_dropped += 1
            return False
        self.admission.charge(units - decided, self.now())
        return self._submit(SsdWrite(key[None, :].copy(), np.array([dram_handle], np.int64),
                                     state=True))

    def _submit(self, job: SsdWrite) -> bool:
        if self.backend.asynchronous:
            self._in_flight(job).update(map(bytes, job.keys))
        if self.backend.write_ssd(job):
            return True
        if self.backend.asynchronous:
            self._in_flight(job).difference_update(map(bytes, job.keys))
        self.stats.writes_dropped += int(job.keys.shape[0])
        return False

    def _in_flight(self, job: SsdWrite) -> set[bytes]:
        return self._pending_states if job.state else self._pending

    def _add_ssd_copies(self, keys: np.ndarray, handles: np.ndarray) -> np.ndarray:
        """Gives written blocks SSD residency; returns the keys that took it."""
        try:
            self.index.add_existing(keys, SSD, handles)
            return keys
        except ValueError:
            pass
        kept = np.zeros(keys.shape[0], bool)
        for i in range(keys.shape[0]):  # rare: some block left the index or got there first
            try:
                self.index.add_existing(keys[i:i + 1], SSD, handles[i:i + 1])
                kept[i] = True
            except ValueError:
                self.backend.free(SSD, handles[i:i + 1])
        return keys[kept]

    def _add_ssd_path(self, path: np.ndarray, positions: np.ndarray,
                      handles: np.ndarray) -> np.ndarray:
        """Gives written path blocks SSD residency, creating their nodes as
        needed; returns the keys that took it."""
        kept = np.ones(positions.size, bool)
        try:
            self.index.add(path[: int(positions[-1]) + 1], SSD, handles, where=positions)
        except ValueError:
            for i, p in enumerate(positions):  # rare: some block got there first
                try:
                    self.index.add(path[: int(p) + 1], SSD, handles[i:i + 1], where=[int(p)])
                except ValueError:
                    self.backend.free(SSD, handles[i:i + 1])
                    kept[i] = False
        if self.events is not None:
            self.events.stored(SSD, path, positions[kept])
        return path[positions[kept]]

    def _free_checkpoint(self, key: np.ndarray, tier: Tier) -> None:
        """A checkpoint leaves the index (no reader finds it from now on); its
        slots go back now, or when the last load that names it lets go."""
        ref = (int(tier), self.index.remove_checkpoint(bytes(key), tier))
        if ref in self._ckpt_readers:
            self._ckpt_parked.add(ref)
        else:
            self.backend.free_state(tier, ref[1])

    def _hold_checkpoint(self, ck) -> None:
        ref = (int(ck.tier), int(ck.slot))
        self._ckpt_readers[ref] = self._ckpt_readers.get(ref, 0) + 1

    def _release_checkpoint(self, ck) -> None:
        if ck is None:
            return
        ref = (int(ck.tier), int(ck.slot))
        left = self._ckpt_readers.pop(ref) - 1
        if left:
            self._ckpt_readers[ref] = left
        elif ref in self._ckpt_parked:
            self._ckpt_parked.discard(ref)
            self.backend.free_state(Tier(ref[0]), ref[1])

    def _adopt_state(self, key: np.ndarray, handle: int) -> bool:
        try:
            self.index.add_checkpoint(bytes(key), SSD, handle)
            return True
        except ValueError:
            self.backend.free_state(SSD, handle)
            return False

    # ------------------------------------------------------------- capacity

    def _allocate(self, pin: np.ndarray, keys: np.ndarray, pos: np.ndarray, masks: np.ndarray,
                  older_than: float | None, session: int, promotion: bool) -> StoreSpec:
        if pos.size == 0 or self.backend.capacity(DRAM) == 0:
            return _empty_store(keys, promotion)
        pos = pos[:self._make_room(DRAM, pos.size, older_than, pin=pin)]
        if pos.size == 0:
            return _empty_store(keys, promotion)
        slots = self.backend.alloc(DRAM, pos.size)
        path = keys[: int(pos[-1]) + 1].copy()
        # filling: no reader sees the slots before complete_store says they hold the bytes
        self.index.add(path, DRAM, slots, where=pos, session=session, filling=True, lock=True)
        return StoreSpec(path, pos, slots, masks[pos].copy(), promotion)

    def _make_room(self, tier: Tier, want: int, older_than: float | None,
                   pin: np.ndarray | None = None) -> int:
        """Frees units in `tier` for up to `want`, evicting leaf-first LRU
        victims (with `older_than`, only blocks idle that long) other than
        the request's own path `pin`; returns the free units, up to `want`."""
        free = self.backend.free_units(tier)
        if free < want and tier == SSD:
            self.backend.reclaim_ssd(want - free)
            free = self.backend.free_units(tier)
        if free >= want:
            return want
        pin = None if pin is None or pin.shape[0] == 0 else pin
        if pin is not None and tier == GPU and not self.hybrid:
            # Nothing a GPU victim's release does touches the index, so one
            # call locks the path, evicts and unlocks (a second evict would
            # find no more victims: the loop below would end there too).
            ev = self.index.evict(tier, want - free, older_than=older_than, pin=pin, unpin=True)
            if len(ev):
                self._evicted(tier, ev)
            return max(0, min(want, self.backend.free_units(tier)))
        lock_with = pin  # the first evict locks the path; unlocked after the last
        try:
            while free < want:
                ev = self.index.evict(tier, want - free, older_than=older_than, pin=lock_with)
                lock_with = None
                if len(ev) == 0:
                    break
                self._evicted(tier, ev)
                free = self.backend.free_units(tier)
        finally:
            if pin is not None and lock_with is None:
                self.index.unlock(pin)
        return max(0, min(want, free))

    def _evicted(self, tier: Tier, ev) -> None:
        kept = None
        if tier == DRAM:
            self.stats.dram_evictions += len(ev)
            if self.remote is not None:  # reads the victims' slots: before they are freed
                self.remote.publish_victims(ev)
            if self.ssd_on:
                kept = self._admit_victims(ev)  # reads the victims' slots: before they are freed
        elif tier == SSD:
            self.stats.ssd_evictions += len(ev)
        gone = ev.keys if kept is None else ev.keys[~kept]  # write-behind victims stay for now
        self.backend.free(tier, ev.slots if kept is None else ev.slots[~kept])
        if self.events is not None and tier != GPU:
            self.events.removed(tier, gone)
        if self.hybrid:
            for key in ev.keys[(ev.checkpoints & tier.bit) != 0]:
                self._free_checkpoint(key, tier)

    def _masks(self, keys: np.ndarray) -> tuple[int, np.ndarray]:
        """(known blocks, residency mask of every block of `keys`, 0 past the known)."""
        known, masks, _ = self.index.residency(keys)
        out = np.zeros(keys.shape[0], np.uint8)
        out[:known] = masks
        return known, out

    def _unlock(self, path: np.ndarray) -> None:
        """Unlocks a spec's path; written blocks a reader of it was still
        holding leave DRAM now (see ``_end_behind``)."""
        self.index.unlock(path)
        self._settle(path)

    def _release_tail(self, tail: np.ndarray) -> None:
        """``_unlock`` of a path's deepest blocks only (not a path from the
        root): one lock each, deepest first, as ``unlock`` orders them."""
        self.index.release(tail[::-1])
        self._settle(tail)

    def _settle(self, path: np.ndarray) -> None:
        """Written victims among `path` that nobody holds now leave DRAM."""
        if not self._linger:
            return
        keys = [k for k in dict.fromkeys(map(bytes, path)) if k in self._linger]
        if not keys:
            return
        arr = np.frombuffer(b"".join(keys), np.uint8).reshape(-1, 32)
        self.index.hold(arr)  # a hold and a release tell which ones nobody holds now
        free = self.index.release(arr)
        if free.any():
            self._linger.difference_update(k for k, f in zip(keys, free) if f)
            self._leave_dram(arr[free], int(free.sum()))

    @contextlib.contextmanager
    def _pinned(self, path: np.ndarray | None):
        """Locks `path` while the core evicts (unlocking counts as a use)."""
        if path is None or path.shape[0] == 0:
            yield
            return
        self.index.lock(path)
        try:
            yield
        finally:
            self.index.unlock(path)


def _empty_store(keys: np.ndarray, promotion: bool) -> StoreSpec:
    none = np.zeros(0, np.int64)
    return StoreSpec(keys[:0].copy(), none, none, np.zeros(0, np.uint8), promotion)


__all__ = ["CacheManager", "NO_SLOT"]
