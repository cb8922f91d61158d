"""Brute-force reference model of the radix index, for property tests.

It implements the index's *semantics* as stated in native/index/radix_core.h
with plain dicts and linear scans, no lists, no parking, no hash table:

* eviction from tier t picks, among blocks resident in t, unlocked, with no
  child resident in t and tier_time[t] <= cutoff, the smallest seq[t];
* seq values come from one counter, assigned when a block is touched (deepest
  block of a path first), gains residency, is unlocked, or becomes
  metadata-only (its ghost seq);
* the metadata budget drops, while over budget, the unlocked childless
  metadata-only block with the smallest ghost seq;
* readiness: a copy added with ``filling`` is in its tier (it takes a slot,
  it makes its parent a non-leaf there) but no reader sees it -- match,
  history masks and eviction skip it -- until ``set_ready``, which gives it
  a fresh seq (when unlocked) and tier_time; the same for checkpoints.

Errors: every operation validates first and raises ValueError without
changing anything, as the index does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TIERS = (0, 1, 2, 3)  # GPU, DRAM, SSD, REMOTE: as many as the native core
DRAM = 1
GHOST = "ghost"  # the metadata-only list (not a tier number)


@dataclass
class RefNode:
    key: bytes
    parent: bytes | None
    depth: int
    session: int
    last_access: float
    tiers: dict[int, int] = field(default_factory=dict)  # tier -> slot
    ckpt: dict[int, int] = field(default_factory=dict)   # tier -> slot
    reuse: int = 0
    hits: int = 0
    dram_evictions: int = 0
    lock: int = 0
    tier_time: dict[int, float] = field(default_factory=dict)
    seq: dict[int, int] = field(default_factory=dict)
    ckpt_time: dict[int, float] = field(default_factory=dict)
    ckpt_seq: dict[int, int] = field(default_factory=dict)
    filling: set[int] = field(default_factory=set)        # tiers whose copy is not ready
    ckpt_filling: set[int] = field(default_factory=set)

    @property
    def ghost(self) -> bool:
        return not self.tiers and not self.ckpt

    @property
    def ready(self) -> list[int]:
        return [t for t in self.tiers if t not in self.filling]

    @property
    def ready_ckpt(self) -> list[int]:
        return [t for t in self.ckpt if t not in self.ckpt_filling]


class RefIndex:
    def __init__(self, max_blocks: int, hybrid: bool = False) -> None:
        self.max_blocks = max_blocks
        self.hybrid = hybrid
        self.nodes: dict[bytes, RefNode] = {}
        self.counter = 0
        self.last_now = float("-inf")

    # helpers
    def _seq(self) -> int:
        self.counter += 1
        return self.counter

    def _now(self, now: float) -> float:
        self.last_now = max(self.last_now, now)
        return self.last_now

    def _walk(self, keys: list[bytes]) -> list[RefNode]:
        path: list[RefNode] = []
        prev = None
        for k in keys:
            nd = self.nodes.get(k)
            if nd is None or nd.parent != prev:
                break
            path.append(nd)
            prev = k
        return path

    def _children(self, key: bytes) -> list[RefNode]:
        return [n for n in self.nodes.values() if n.parent == key]

    def _ghost_seq(self, nd: RefNode) -> None:
        if nd.ghost and nd.lock == 0:
            nd.seq[GHOST] = self._seq()

    def _budget(self) -> None:
        while len(self.nodes) > self.max_blocks:
            parents = {n.parent for n in self.nodes.values()}
            cands = [n for n in self.nodes.values()
                     if n.ghost and n.lock == 0 and n.key not in parents]
            if not cands:
                return
            victim = min(cands, key=lambda n: n.seq[GHOST])
            del self.nodes[victim.key]

    # queries
    def match(self, keys: list[bytes]) -> dict:
        path = self._walk(keys)
        n_known = len(path)
        n_avail = 0
        while n_avail < n_known and path[n_avail].ready:
            n_avail += 1
        first = min(path[0].ready) if path and path[0].ready else -1
        tbt = 0
        if first >= 0:
            while tbt < n_known and first in path[tbt].ready:
                tbt += 1
        usable, ckpt_tier, ckpt_slot = n_avail, -1, None
        if self.hybrid:
            usable = 0
            for b in range(n_avail, 0, -1):
                if path[b - 1].ready_ckpt:
                    usable = b
                    ckpt_tier = min(path[b - 1].ready_ckpt)
                    ckpt_slot = path[b - 1].ckpt[ckpt_tier]
                    break
        tiers = [min(path[i].ready) for i in range(usable)]
        slots = [path[i].tiers[tiers[i]] for i in range(usable)]
        return dict(n_known=n_known, n_avail=n_avail, tbt=tbt, usable=usable,
                    ckpt_tier=ckpt_tier, ckpt_slot=ckpt_slot, tiers=tiers, slots=slots,
                    masks=[sum(1 << t for t in n.ready) for n in path],
                    ckpt_masks=[sum(1 << t for t in n.ready_ckpt) for n in path],
                    held=[sum(1 << t for t in n.tiers) for n in path],
                    held_ckpt=[sum(1 << t for t in n.ckpt) for n in path])

    # mutations
    def touch(self, keys: list[bytes], hits: int, ckpt_at: int, now: float) -> int:
        path = self._walk(keys)
        m = len(path)
        if hits > m or ckpt_at > m or (ckpt_at > 0 and not path[ckpt_at - 1].ckpt):
            raise ValueError("bad touch")
        now = self._now(now)
        for i in range(m - 1, -1, -1):
            nd = path[i]
            nd.reuse += 1
            if i < hits:
                nd.hits += 1
            nd.last_access = now
            for t in TIERS:
                if t in nd.ready:
                    nd.tier_time[t] = now
                    if nd.lock == 0:
                        nd.seq[t] = self._seq()
            self._ghost_seq(nd)
        if ckpt_at > 0:
            nd = path[ckpt_at - 1]
            for t in TIERS:
                if t in nd.ready_ckpt:
                    nd.ckpt_seq[t] = self._seq()
                    nd.ckpt_time[t] = now
        return m

    def touch_history(self, keys: list[bytes], hits: int, ckpt_at: int,
                      now: float) -> tuple[int, list[tuple]]:
        """touch, then each touched block's (reuse, hits, dram_evictions,
        last_access, last_access before the touch, ready mask, ready
        checkpoint mask, filling mask)."""
        before = [n.last_access for n in self._walk(keys)]
        m = self.touch(keys, hits, ckpt_at, now)
        rows = [(n.reuse, n.hits, n.dram_evictions, n.last_access, before[i],
                 sum(1 << t for t in n.ready), sum(1 << t for t in n.ready_ckpt),
                 sum(1 << t for t in n.filling)) for i, n in enumerate(self._walk(keys))]
        return m, rows

    def match_lock(self, keys: list[bytes]) -> dict:
        """match, then lock of the blocks the plan uses."""
        r = self.match(keys)
        self.lock(keys[:r["usable"]])
        return r

    def add(self, keys: list[bytes], tier: int, where: list[int], slots: list[int],
            session: int, now: float, filling: bool = False, lock: bool = False) -> int:
        if not where:
            return 0
        if any(p < 0 or p >= len(keys) for p in where) or sorted(set(where)) != list(where):
            raise ValueError("bad positions")
        last = where[-1] + 1
        path = self._walk(keys[:last])
        m = len(path)
        fresh = keys[m:last]
        if any(k in self.nodes for k in fresh) or len(set(fresh)) != len(fresh):
            raise ValueError("key conflict")
        if any(p < m and tier in path[p].tiers for p in where):
            raise ValueError("already resident")
        now = self._now(now)
        for i in range(m, last):
            nd = RefNode(key=keys[i], parent=keys[i - 1] if i else None, depth=i,
                         session=session, last_access=now)
            self.nodes[nd.key] = nd
            path.append(nd)
        slot_of = dict(zip(where, slots))
        for i in range(last - 1, -1, -1):
            nd = path[i]
            if i in slot_of:
                nd.tiers[tier] = slot_of[i]
                nd.tier_time[tier] = now
                nd.seq.pop(GHOST, None)
                if filling:
                    nd.filling.add(tier)
                elif nd.lock == 0:
                    nd.seq[tier] = self._seq()
            elif i >= m:
                self._ghost_seq(nd)
        self._budget()
        if lock:  # then locks the path up to the last position
            self.lock(keys[:last])
        return last - m

    def add_existing(self, keys: list[bytes], tier: int, slots: list[int], now: float) -> None:
        if len(set(keys)) != len(keys) or any(
                k not in self.nodes or tier in self.nodes[k].tiers for k in keys):
            raise ValueError("bad add_existing")
        now = self._now(now)
        for k, slot in zip(keys, slots):
            nd = self.nodes[k]
            nd.tiers[tier] = slot
            nd.tier_time[tier] = now
            nd.seq.pop(GHOST, None)
            if nd.lock == 0:
                nd.seq[tier] = self._seq()

    def set_ready(self, keys: list[bytes], tier: int, now: float) -> None:
        if len(set(keys)) != len(keys) or any(
                k not in self.nodes or tier not in self.nodes[k].filling for k in keys):
            raise ValueError("bad set_ready")
        now = self._now(now)
        for k in keys:
            nd = self.nodes[k]
            nd.filling.discard(tier)
            nd.tier_time[tier] = now
            if nd.lock == 0:
                nd.seq[tier] = self._seq()

    def hold(self, keys: list[bytes]) -> None:
        if len(set(keys)) != len(keys) or any(k not in self.nodes for k in keys):
            raise ValueError("bad hold")
        for k in keys:
            self.nodes[k].lock += 1

    def release(self, keys: list[bytes], now: float) -> list[bool]:
        if len(set(keys)) != len(keys) or any(
                k not in self.nodes or self.nodes[k].lock == 0 for k in keys):
            raise ValueError("bad release")
        now = self._now(now)
        out = []
        for k in keys:
            out.append(self._unlock_one(self.nodes[k], now))
        self._budget()
        return out

    def _unlock_one(self, nd: RefNode, now: float) -> bool:
        nd.lock -= 1
        if nd.lock:
            return False
        for t in TIERS:
            if t in nd.ready:
                nd.tier_time[t] = now
                nd.seq[t] = self._seq()
        self._ghost_seq(nd)
        return True

    def history(self, keys: list[bytes]) -> list[tuple]:
        return [(n.reuse, n.hits, n.dram_evictions, n.last_access) for n in self._walk(keys)]

    def remove(self, keys: list[bytes], tier: int, now: float) -> list[int]:
        if len(set(keys)) != len(keys) or any(
                k not in self.nodes or tier not in self.nodes[k].tiers for k in keys):
            raise ValueError("bad remove")
        now = self._now(now)
        out = []
        for k in keys:
            nd = self.nodes[k]
            out.append(nd.tiers.pop(tier))
            nd.filling.discard(tier)
            self._ghost_seq(nd)
        self._budget()
        return out

    def evict(self, tier: int, count: int, cutoff: float, now: float) -> list[dict]:
        now = self._now(now)
        out = []
        while len(out) < count:
            busy = {n.parent for n in self.nodes.values() if tier in n.tiers}
            cands = [n for n in self.nodes.values()
                     if tier in n.ready and n.lock == 0 and n.key not in busy
                     and n.tier_time[tier] <= cutoff]
            if not cands:
                break
            nd = min(cands, key=lambda n: n.seq[tier])
            if tier == DRAM:
                nd.dram_evictions += 1
            slot = nd.tiers.pop(tier)
            self._ghost_seq(nd)
            child_tiers = 0
            for c in self._children(nd.key):
                for t in c.tiers:
                    child_tiers |= 1 << t
            out.append(dict(key=nd.key, slot=slot, reuse=nd.reuse, hits=nd.hits,
                            dram_evictions=nd.dram_evictions, depth=nd.depth,
                            tiers_after=sum(1 << t for t in nd.tiers),
                            child_tiers=child_tiers,
                            ckpt=sum(1 << t for t in nd.ckpt)))
        return out

    def evict_pinned(self, tier: int, count: int, cutoff: float, now: float,
                     pin: list[bytes], unpin: bool) -> list[dict]:
        """lock(pin), evict, and with `unpin` unlock(pin)."""
        self.lock(pin)
        out = self.evict(tier, count, cutoff, now)
        if unpin:
            self.unlock(pin, now)
        return out

    def place(self, keys: list[bytes], tier: int, free: int, session: int,
              now: float) -> tuple[int, int]:
        """A slotless tier's placement: the blocks holding no slot in `tier`
        (ready or filling), evict_pinned of the known prefix with unpin (a
        plain evict when nothing is known) when `free` is short, then add of
        as many as there is room for, slot 0 each."""
        if self.hybrid:
            raise ValueError("place on a hybrid index")
        path = self._walk(keys)
        m = len(path)
        pos = [i for i in range(len(keys)) if i >= m or tier not in path[i].tiers]
        if not pos:
            return 0, 0
        room, victims = len(pos), 0
        if free < len(pos):
            count = len(pos) - max(free, 0)
            inf = float("inf")
            out = (self.evict_pinned(tier, count, inf, now, keys[:m], True) if m
                   else self.evict(tier, count, inf, now))
            victims = len(out)
            room = max(0, min(len(pos), free + victims))
        if room:
            self.add(keys[:pos[room - 1] + 1], tier, pos[:room], [0] * room, session, now)
        return room, victims

    def lock(self, keys: list[bytes]) -> None:
        path = self._walk(keys)
        if len(path) < len(keys):
            raise ValueError("lock of unknown block")
        for nd in path:
            nd.lock += 1

    def unlock(self, keys: list[bytes], now: float) -> None:
        path = self._walk(keys)
        if len(path) < len(keys) or any(nd.lock == 0 for nd in path):
            raise ValueError("bad unlock")
        now = self._now(now)
        for nd in reversed(path):
            self._unlock_one(nd, now)
        self._budget()

    def ckpt_add(self, key: bytes, tier: int, slot: int, now: float,
                 filling: bool = False) -> None:
        nd = self.nodes.get(key)
        if not self.hybrid or nd is None or tier in nd.ckpt:
            raise ValueError("bad ckpt_add")
        now = self._now(now)
        nd.seq.pop(GHOST, None)
        nd.ckpt[tier] = slot
        nd.ckpt_time[tier] = now
        nd.ckpt_seq[tier] = self._seq()
        if filling:
            nd.ckpt_filling.add(tier)

    def ckpt_set_ready(self, key: bytes, tier: int, now: float) -> None:
        nd = self.nodes.get(key)
        if nd is None or tier not in nd.ckpt_filling:
            raise ValueError("bad ckpt_set_ready")
        now = self._now(now)
        nd.ckpt_filling.discard(tier)
        nd.ckpt_seq[tier] = self._seq()
        nd.ckpt_time[tier] = now

    def ckpt_remove(self, key: bytes, tier: int, now: float) -> int:
        nd = self.nodes.get(key)
        if nd is None or tier not in nd.ckpt:
            raise ValueError("bad ckpt_remove")
        now = self._now(now)
        slot = nd.ckpt.pop(tier)
        nd.ckpt_filling.discard(tier)
        self._ghost_seq(nd)
        self._budget()
        return slot

    def ckpt_evict(self, tier: int, count: int, cutoff: float, now: float) -> list[dict]:
        now = self._now(now)
        order = sorted((n for n in self.nodes.values() if tier in n.ready_ckpt),
                       key=lambda n: n.ckpt_seq[tier])
        out = []
        for nd in order:
            if len(out) >= count or nd.ckpt_time[tier] > cutoff:
                break
            if nd.lock:
                continue
            out.append(dict(key=nd.key, slot=self.ckpt_remove(nd.key, tier, now)))
        return out

    # state
    def snapshot(self) -> dict[bytes, tuple]:
        return {k: (n.parent, n.depth, tuple(sorted(n.tiers.items())),
                    tuple(sorted(n.ckpt.items())), n.reuse, n.hits, n.dram_evictions,
                    n.session, n.lock, n.last_access,
                    sum(1 << t for t in n.filling), sum(1 << t for t in n.ckpt_filling))
                for k, n in self.nodes.items()}
