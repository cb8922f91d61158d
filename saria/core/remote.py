"""The cache core's side of the cluster tier (``Tier.REMOTE``).

``RemoteResidency`` is the part of ``CacheManager`` that decides about the
cluster tier; the manager calls it from small hooks (``lookup``, ``touch``,
``prepare_load``, the DRAM eviction path, SSD admission of victims). It moves
no byte: the backend asks the cluster (``remote_exists``), fetches
(``TieredCache`` through ``TierBackend.fetch_remote``) and publishes
(``Backend.publish``, on the backend's own thread).

What it decides:

* **Lookup past the local prefix.** Where the local tiers end
  (``plan.num_available``), one bounded ``remote_exists`` for the next
  ``lookup_blocks`` blocks -- together with the plan's blocks only the cluster
  holds, to re-check them (the backend caches answers briefly) -- and, while
  the cluster holds every block asked, one more for twice as many past them:
  a long prefix costs a few round trips, not a recomputation past 64 blocks. The leading
  run of hits becomes ready REMOTE copies in the index (slot 0: a copy is
  addressed by its key), so history and reload plans record them. A REMOTE
  copy the cluster no longer holds leaves the index. While the backend says
  the cluster is down (its breaker is open) every REMOTE copy leaves the
  index: a master back without HA has lost every key. At most
  ``max_blocks`` REMOTE copies are indexed (the least recently used leave).
  NOTE: in ``TieredCache`` the lookup's calls run under the cache's lock; each
  is bounded by the tier's deadline (a failed one ends the lookup) and their
  answers are cached briefly.
* **Loads.** ``prepare_load`` turns the spec's REMOTE positions into *filling*
  DRAM copies in fresh slots (``LoadSpec.remote``); the prefix ends where no
  DRAM room is left. ``complete_fetch`` makes the verified ones ready DRAM
  copies and removes the others -- their DRAM copy and their REMOTE residency
  -- and the prefix ends before the first of them. The backend keeps a slot
  whose get was late from reuse until that get really ended (a registered
  destination row may still be written), so no reader ever sees wrong KV.
* **Publishing.** A ``PublishPolicy`` is asked from one place
  (``_publish``) for reused DRAM residents a request referenced, for DRAM
  victims with history and (write-through only) for the blocks a request
  computed once they are ready in DRAM; blocks the index knows the cluster holds, or that
  are on their way there, are not sent again (the backend's put also skips
  what the cluster holds). The bytes are copied out of DRAM when the put is
  submitted (the victim's slot is freed right after), the put runs off the
  request path, and a held block (stored or skipped) gains REMOTE residency
  when it completes; a failed put drops nothing local.
* **SSD admission.** A DRAM victim the index knows the cluster holds gets no
  local SSD copy unless the policy keeps one (hot blocks); the blocks saved
  are counted (``CacheStats.ssd_writes_skipped_remote``).

It drives the manager through its public verbs only (``reserve_filling``,
``shorten_load``): the load invariant -- a spec never names a slot it does
not hold locked -- is kept in ``saria.core.manager``.

A hybrid model's state checkpoints are not published: a cluster tier under a
hybrid index is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from saria.core.specs import LoadSpec
from saria.index import Tier
from saria.policy.publish import PublishPolicy

DRAM, SSD, REMOTE = Tier.DRAM, Tier.SSD, Tier.REMOTE


@dataclass(slots=True)
class RemotePut:
    """One batch of blocks the core asked a backend to publish: ``keys[i]``'s
    bytes are ``rows[i]`` (copied out of DRAM at submission; None where the
    backend needs no bytes). The backend answers through the core's
    ``complete_publish`` with one bool per key: the cluster holds it now."""

    keys: np.ndarray
    rows: np.ndarray | None


class RemoteResidency:
    """See the module docstring; `manager` is the ``CacheManager`` it serves."""

    def __init__(self, manager, policy: PublishPolicy | None = None, *,
                 lookup_blocks: int = 64, max_blocks: int = 1 << 20) -> None:
        if manager.hybrid:
            raise ValueError("a cluster tier under a hybrid model's index is not supported "
                             "(state checkpoints are not published)")
        if lookup_blocks < 1 or max_blocks < 1:
            raise ValueError(f"remote lookup_blocks and max_blocks must be >= 1, got "
                             f"{lookup_blocks}, {max_blocks}")
        self.m = manager
        self.policy = policy or PublishPolicy()
        self.lookup_blocks = int(lookup_blocks)
        self.max_blocks = int(max_blocks)
        self._held: set[bytes] = set()        # blocks with REMOTE residency in the index
        self._publishing: set[bytes] = set()  # puts submitted, not completed
        self.lookup_rounds = 0                 # cluster calls the last lookup made
        manager.backend.bind_remote(self.complete_publish)

    # ------------------------------------------------------------ lookup

    def lookup(self, keys: np.ndarray, plan):
        """`plan` (the local match of `keys`) extended by what the cluster holds.

        The first call asks about the plan's REMOTE copies (re-checked) and
        the ``lookup_blocks`` blocks past the local prefix; while every block
        asked is held, the next call asks about twice as many past them, so a
        prefix of n blocks costs about log2(n / lookup_blocks) + 1 round trips
        and a miss or a failed call (all misses) ends it. ``lookup_rounds``
        says how many calls the last lookup made."""
        index, backend = self.m.index, self.m.backend
        self.lookup_rounds = 0
        if backend.remote_down():
            if self._held:
                self.drop_all()
                return index.match(keys)
            return plan
        n = keys.shape[0]
        mine = np.flatnonzero(plan.tiers == REMOTE)[:self.lookup_blocks]  # re-checked
        pos = plan.num_available
        ahead = np.arange(pos, min(n, pos + self.lookup_blocks))
        if mine.size + ahead.size == 0:
            return plan
        found = backend.remote_exists(keys[np.concatenate([mine, ahead])])
        self.lookup_rounds = 1
        gone = mine[~found[:mine.size]]
        if gone.size:  # the prefix now ends at the first of them: nothing past it is reachable
            self.drop(keys[gone])
            return index.match(keys)
        found = found[mine.size:]
        runs = []
        while True:
            run = found.size if found.all() else int(np.argmin(found))
            runs.append(ahead[:run])
            if run < ahead.size or pos + run >= n:
                break
            pos += run
            ahead = np.arange(pos, min(n, pos + min(2 * ahead.size, self.max_blocks)))
            found = backend.remote_exists(keys[ahead])
            self.lookup_rounds += 1
        held = np.concatenate(runs)
        if held.size and self._add(keys, held):
            return index.match(keys)
        return plan

    def _add(self, keys: np.ndarray, positions: np.ndarray) -> bool:
        index = self.m.index
        self._room_for(positions.size)
        try:
            index.add(keys[: int(positions[-1]) + 1], REMOTE, np.zeros(positions.size, np.int64),
                      where=positions)
        except ValueError:  # a block indexed under another prefix, or a copy there already
            return False
        self._held.update(map(bytes, keys[positions]))
        self.m.stats.remote_found_blocks += int(positions.size)
        return True

    def drop(self, keys: np.ndarray) -> None:
        """REMOTE copies the cluster no longer holds leave the index."""
        index = self.m.index
        here = [i for i, k in enumerate(keys) if index.slot_of(bytes(k), REMOTE) is not None]
        if here:
            index.remove(keys[here], REMOTE)
            self.m.stats.remote_dropped_blocks += len(here)
        self._forget(keys)
        self.m.backend.remote_forget(keys)

    def drop_all(self) -> None:
        """The cluster is down: every REMOTE copy leaves the index."""
        if self._held:
            keys = np.frombuffer(b"".join(self._held), np.uint8).reshape(-1, 32)
            self.drop(keys)

    def _forget(self, keys: np.ndarray) -> None:
        self._held.difference_update(map(bytes, keys))

    def _room_for(self, n: int) -> None:
        """At most ``max_blocks`` REMOTE copies: the least recently used leave."""
        over = len(self._held) + n - self.max_blocks
        if over > 0:
            self._forget(self.m.index.evict(REMOTE, over).keys)

    # ------------------------------------------------------------- loads

    def prepare(self, spec: LoadSpec) -> LoadSpec:
        """DRAM slots, filling, for the spec's blocks only the cluster holds
        (see the module docstring); the prefix ends where none is left."""
        pos = spec.positions(REMOTE)
        if pos.size == 0:
            return spec
        m = self.m
        fill = m.index.filling(spec.path)[0]
        busy = np.flatnonzero((fill[pos] & DRAM.bit) != 0)  # another request is storing it
        if busy.size:
            spec = m.shorten_load(spec, int(pos[busy[0]]))
            pos = pos[:busy[0]]
        slots = m.reserve_filling(spec.path, pos)
        if slots.size < pos.size:
            spec = m.shorten_load(spec, int(pos[slots.size]))
            pos = pos[:slots.size]
        if pos.size == 0:
            return spec
        spec.slots = spec.slots.copy()
        spec.slots[pos] = slots
        spec.remote = pos
        return spec

    def complete_fetch(self, spec: LoadSpec, ok: np.ndarray) -> LoadSpec:
        """The mover fetched the spec's REMOTE blocks into their DRAM slots:
        `ok` (one per ``spec.remote``) says which arrived whole and verified.
        Returns the spec the mover reads: the verified blocks are DRAM
        blocks now, and it ends before the first failed one."""
        m = self.m
        pos = spec.remote
        ok = np.asarray(ok, bool)
        good, bad = pos[ok], pos[~ok]
        if good.size:
            m.index.set_ready(spec.path[good], DRAM)
            if m.events is not None:
                m.events.stored(DRAM, spec.path, good)
        spec.tiers = spec.tiers.copy()
        spec.tiers[good] = DRAM
        spec.remote = good
        if bad.size == 0:
            return spec
        m.stats.remote_load_failures += int(bad.size)
        path = spec.path
        spec = m.shorten_load(spec, int(bad[0]))  # releases the failed ones (and past them)
        self.fail(path, bad)
        return spec

    def fail(self, path: np.ndarray, bad: np.ndarray) -> None:
        """Failed fetches of ``path[bad]`` (unlocked): their filling DRAM
        copies and their REMOTE residency leave the index (the backend keeps
        a slot a late get may still write until the get ends)."""
        m = self.m
        keys = path[bad]
        m.backend.free(DRAM, m.index.remove(keys, DRAM))
        self.drop(keys)

    # -------------------------------------------------------- publishing

    def publish_accessed(self, path: np.ndarray, h: dict | None = None) -> None:
        """Reused DRAM residents a request referenced (history counts it;
        `h`, the touch's own history when it walked for one)."""
        if h is None:
            h = self.m.index.history(path)
        masks = h["tiers"]
        cand = np.flatnonzero(((masks & DRAM.bit) != 0) & ((masks & REMOTE.bit) == 0))
        if cand.size:
            want = self.policy.on_access(h["reuse"][cand], h["hits"][cand])
            self._publish(path[cand[want]], self.m.index.slots_in(path, DRAM)[0][cand[want]])

    def publish_stored(self, keys: np.ndarray, slots: np.ndarray) -> None:
        """Blocks a request computed, just made ready in DRAM (write-through)."""
        want = self.policy.on_store(keys.shape[0])
        if want.any():
            held = np.array([bytes(k) in self._held for k in keys], bool)
            want &= ~held
            self._publish(keys[want], slots[want])

    def publish_victims(self, ev) -> None:
        """DRAM victims with history, before their slots are freed."""
        cand = np.flatnonzero((ev.tiers_after & REMOTE.bit) == 0)
        if cand.size:
            want = self.policy.on_evict(ev.reuse[cand], ev.hits[cand], ev.dram_evictions[cand])
            self._publish(ev.keys[cand[want]], ev.slots[cand[want]])

    def _publish(self, keys: np.ndarray, sources: np.ndarray) -> None:
        """The one place blocks are sent to the cluster."""
        if keys.shape[0] == 0:
            return
        if self._publishing:
            new = np.array([bytes(k) not in self._publishing for k in keys], bool)
            keys, sources = keys[new], sources[new]
            if keys.shape[0] == 0:
                return
        job = RemotePut(keys.copy(), self.m.backend.copy_rows(sources))
        self._publishing.update(map(bytes, job.keys))
        if not self.m.backend.publish(job):
            self._publishing.difference_update(map(bytes, job.keys))
            self.m.stats.remote_publish_dropped += int(keys.shape[0])

    def complete_publish(self, job: RemotePut, held: np.ndarray) -> None:
        """A put finished (the backend holds the cache's lock): held blocks
        still indexed gain REMOTE residency."""
        m = self.m
        self._publishing.difference_update(map(bytes, job.keys))
        held = np.asarray(held, bool)
        m.stats.remote_published_blocks += int(held.sum())
        m.stats.remote_publish_failures += int((~held).sum())
        keys = job.keys[held]
        if self._held and keys.shape[0]:
            keys = keys[np.array([bytes(k) not in self._held for k in keys], bool)]
        if keys.shape[0] == 0:
            return
        self._room_for(keys.shape[0])
        try:  # one call (it checks every key before it changes anything)
            m.index.add_existing(keys, REMOTE, np.zeros(keys.shape[0], np.int64))
            self._held.update(map(bytes, keys))
            return
        except ValueError:  # a block left the index meanwhile: one at a time
            pass
        for k in keys:
            try:
                m.index.add_existing(k[None], REMOTE, np.zeros(1, np.int64))
                self._held.add(bytes(k))
            except ValueError:
                pass

    # -------------------------------------------------------- SSD admission

    def skip_ssd(self, ev, blocks: np.ndarray) -> np.ndarray:
        """SSD admission's choice of victims (`blocks`) less the ones the
        cluster holds that the policy does not keep locally."""
        held = blocks & ((ev.tiers_after & REMOTE.bit) != 0)
        if held.any():
            skip = held & ~self.policy.keep_local(ev.hits)
            self.m.stats.ssd_writes_skipped_remote += int(skip.sum())
            blocks = blocks & ~skip
        return blocks


__all__ = ["RemotePut", "RemoteResidency"]
