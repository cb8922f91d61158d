"""Known bugs, put back on purpose: the simulation must find each one.

Each mutation is a monkeypatch that restores an old behaviour for the
duration of a ``with applied(name):`` block (nothing is written to disk).
The table (``python tests/sim.py --mutation-table``) says at which seed each
is found and in how many events.

* ``readiness-off``: ``CacheManager._allocate`` adds its DRAM slots as
  ready (``filling=False``), so a reader may see a slot before its store was
  acked (``tests/test_interleavings.py``'s mutation, issue 19).
* ``tp-store-first-failure``: the op tracker ends an op at its first failed
  ack, while the other ranks may still be copying into its slots (issue 31,
  failure 4: the behaviour of main at 84f5613).
* ``shorten-relock`` (failure 1, e010cf6): ``CacheManager.shorten_load``
  unlocks the whole path and locks its prefix again, as
  ``RemoteResidency._shorten`` did -- a write-behind victim whose write landed
  while the load was off the lock leaves DRAM while the spec still names it.
* ``reuse-moved-load`` (failure 2, d2c6d4d): ``get_num_new_matched_tokens``
  reuses a prepared load when vLLM's own hit shrank below the start it was
  prepared for (the cancel-and-prepare-again clause removed).
* ``no-cancel-owed`` (failure 3, 1459da7 in issue-31b): a prepare or batch
  that got no reply owes no ``cancel`` of its spec id (``RemoteCache._call``
  drops its ``undo``): what the server registered for it stays held.
* ``cluster-before-ssd`` (failure 5, c8a5cf1): ``TieredCache.lookup`` asks
  the cluster first and adopts recovered SSD blocks only past the available
  prefix (84f5613's ``lookup`` and ``_adopt``).
* ``no-breaker`` (failure 6, cc07f1b in issue-31b): the client's
  ``Breaker.refuse`` never refuses -- every call to a down server waits out
  its deadline.
* ``gone-pool-raises`` (N2, 3c8617b): a worker mapping a server pool file
  that is gone raises ``FileNotFoundError`` out of ``start_load_kv`` (the
  mapping without its ``try``) instead of failing the step's ops.
* ``no-unfilled`` (N5, d1792f4): ``SariaScheduler._mark_unfilled`` records
  nothing, so a KV block whose load failed is never reported invalid later.
* ``hold-empty-store`` (8bef907): the server holds a store spec of zero
  blocks (``CacheServer._store_reply`` without its zero-block branch).
* ``sync-hybrid-loads`` (this round): loads of a model with several KV-cache
  groups are synchronous, so a failed read is a block-level load error --
  on which vLLM raises with several groups.
* ``free-held-checkpoint`` (issue 40, 70d1d35): a checkpoint removed from the
  index frees its slots while a prepared load still names them.
* ``drain-waits-for-server`` (issue 41, server-up seed 118): a finished
  request whose write-through waves wait for staging slots keeps its KV
  pages until the server gives some -- forever while it is down (no drop
  while the breaker is open, no deadline).
* ``keep-preempted-waves`` (722edca): a preempted request's write-through
  waves not copied yet are kept (the drop in ``build_connector_meta`` undone
  before ``_drain_direct``) and later copied from pages vLLM freed.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np

from saria.connector.ops import OpTracker
from saria.connector.scheduler import SariaScheduler
from saria.connector.worker import SariaWorker
from saria.core.manager import CacheManager
from saria.core.specs import LoadSpec
from saria.index import Tier
from saria.serve.client import RemoteCache


def _patch(*changes):
    """Sets each ``(owner, name, value)``; returns what puts them back."""
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in changes]
    for owner, name, value in changes:
        setattr(owner, name, value)
    return lambda: [setattr(owner, name, value) for owner, name, value in saved]


def _readiness_off():
    orig = CacheManager._allocate

    def _allocate(self, *a, **k):
        index = self.index
        real = type(index).add

        class Ready(type(index)):
            def add(self, *x, **kw):
                return real(self, *x, **{**kw, "filling": False})

        index.__class__ = Ready
        try:
            return orig(self, *a, **k)
        finally:
            index.__class__ = Ready.__mro__[1]

    from saria.index.radix import RadixIndex

    orig_ready = RadixIndex.set_ready

    def set_ready(self, keys, tier, **kw):  # nothing is filling any more: nothing to mark
        try:
            orig_ready(self, keys, tier, **kw)
        except ValueError:
            pass

    CacheManager._allocate = _allocate
    RadixIndex.set_ready = set_ready

    def undo():
        CacheManager._allocate = orig
        RadixIndex.set_ready = orig_ready

    return undo


def _tp_store_first_failure():
    orig = OpTracker.ack

    def ack(self, op_id, *, ok, count=1, bad=()):
        if not ok and op_id in self._ops:
            return self._ops.pop(op_id)   # 84f5613: the first failed rank ends the op
        return orig(self, op_id, ok=ok, count=count, bad=bad)

    OpTracker.ack = ack
    return lambda: setattr(OpTracker, "ack", orig)


def _shorten_relock():
    """Fix 1 (e010cf6) reverted: ``shorten_load`` unlocks the whole path and
    locks its prefix again (``RemoteResidency._shorten`` on 84f5613)."""

    def shorten_load(self, spec, n):
        n = max(0, min(int(n), spec.num_blocks))
        self._unlock(spec.path)          # a landed write-behind victim leaves DRAM here
        if n:
            self.index.lock(spec.path[:n])
        return LoadSpec(spec.path[:n], min(spec.start, n), spec.tiers[:n], spec.slots[:n],
                        spec.checkpoint if n == spec.num_blocks else None,
                        remote=spec.remote[spec.remote < n])

    return _patch((CacheManager, "shorten_load", shorten_load))


def _reuse_moved_load():
    """Fix 2 (d2c6d4d) reverted: a prepared load is reused when vLLM's own
    hit shrank below the start it was prepared for (only its start moves):
    the ``_cancel`` of the fix's clause is skipped -- the only one the call
    makes then, as the spec's blocks reach past the old start."""
    orig = SariaScheduler.get_num_new_matched_tokens

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        st = self.reqs.get(request.request_id)
        load = st.load if st is not None else None
        if load is None or num_computed_tokens // self.block_size >= load.start:
            return orig(self, request, num_computed_tokens)
        self._cancel = lambda s: None       # d2c6d4d's `self._cancel(st)`, undone
        try:
            return orig(self, request, num_computed_tokens)
        finally:
            del self._cancel

    return _patch((SariaScheduler, "get_num_new_matched_tokens", get_num_new_matched_tokens))


def _no_cancel_owed():
    """Fix 3 (1459da7, issue-31b) reverted: a prepare (or a batch of them)
    that got no reply owes no ``cancel`` of its spec id -- what the server
    registered for it stays held."""
    orig = RemoteCache._call

    def _call(self, op, args, *, undo=(), **kw):
        return orig(self, op, args, **kw)

    return _patch((RemoteCache, "_call", _call))


def _cluster_before_ssd():
    """Fix 5 (c8a5cf1) reverted: ``TieredCache.lookup`` asks the cluster
    first and adopts recovered SSD blocks only past the available prefix (a
    block the cluster also holds counts as cached elsewhere: its recovered
    copy is freed)."""
    from saria.runtime.cache import TieredCache

    SSD = Tier.SSD

    def adopt(self, keys, plan):
        masks, recovered = plan.masks, self.backend.recovered
        pos, handles = [], []
        for i in range(plan.num_available, keys.shape[0]):
            if i < plan.num_known and masks[i] & SSD.bit:
                continue
            h = recovered.pop(bytes(keys[i]), None)
            if h is None:
                break
            if i < plan.num_known and masks[i]:
                self.backend.free(SSD, np.array([h], np.int64))
                continue
            pos.append(i)
            handles.append(h)
        self.manager.adopt_ssd(keys, pos, handles)
        return bool(pos)

    def lookup(self, keys):
        with self._lock:
            plan = self.manager.lookup(keys)
            if self.backend.recovered and plan.num_available < keys.shape[0]:
                if adopt(self, keys, plan):
                    plan = self.index.match(keys)
            return plan

    return _patch((TieredCache, "lookup", lookup))


def _no_breaker():
    """Fix 6 (cc07f1b, issue-31b) reverted: the client's breaker never
    refuses a call -- every call to a down server waits out its deadline."""
    from saria.serve.breaker import Breaker

    return _patch((Breaker, "refuse", lambda self, *, may_probe: False))


def _gone_pool_raises():
    """N2 (3c8617b) reverted: a worker that maps a server pool file that is
    gone raises ``FileNotFoundError`` out of ``start_load_kv`` (an engine
    crash) instead of failing the step's ops."""
    orig = SariaWorker._map_server_pool

    def _map_server_pool(self, server_pool):
        os.path.getsize(server_pool[0])   # 3c8617b^: no try around the mapping
        return orig(self, server_pool)

    return _patch((SariaWorker, "_map_server_pool", _map_server_pool))


def _no_unfilled():
    """N5 (d1792f4) reverted: a KV block whose load failed is never marked
    unfilled, so vLLM is never told about it after the step of the load."""
    return _patch((SariaScheduler, "_mark_unfilled", lambda self, st, positions: None))


def _hold_empty_store():
    """The zero-block store spec (8bef907) reverted: the server holds a store
    spec of zero blocks, which the connector never completes."""
    from saria.serve.server import CacheServer

    def _store_reply(self, s, spec, sid):
        self._hold(s, s.stores, spec, sid)
        return {"spec": sid, "positions": spec.positions, "slots": spec.slots,
                "direct": spec.direct, "promotion": spec.promotion}

    return _patch((CacheServer, "_store_reply", _store_reply))


def _keep_preempted_waves():
    """The preempted request's write-through waves (722edca) reverted: waves
    not copied yet when vLLM preempted the request are kept (and copied from
    its freed or reused pages)."""
    orig_meta, orig_drain = SariaScheduler.build_connector_meta, SariaScheduler._drain_direct

    def build_connector_meta(self, so):
        self._mut_waves = {rid: st.direct for rid in getattr(so, "preempted_req_ids", None) or ()
                           if (st := self.reqs.get(rid)) is not None and st.direct}
        return orig_meta(self, so)

    def _drain_direct(self, stores):
        for rid, waves in self.__dict__.pop("_mut_waves", {}).items():
            st = self.reqs.get(rid)
            if st is not None:   # 722edca dropped them just before this call
                st.direct = waves + st.direct
        return orig_drain(self, stores)

    return _patch((SariaScheduler, "build_connector_meta", build_connector_meta),
                  (SariaScheduler, "_drain_direct", _drain_direct))


def _drain_waits_for_server():
    """Issue 41's drain fix reverted: a finished request waits for staging
    slots as long as it takes (the server always counts as reachable, the
    drain deadline never comes)."""
    from saria.connector.remote import ServerCache

    return _patch((ServerCache, "reachable", property(lambda self: True)),
                  (OpTracker, "now", lambda self: 0.0))


def _sync_hybrid_loads():
    """Several KV-cache groups with synchronous loads (before this round):
    a failed read goes to vLLM as block-level load errors, on which vLLM
    0.32 raises with several groups -- the engine dies."""
    from saria.connector.layout import Geometry

    return _patch((Geometry, "async_loads", property(lambda self: False)))


def _free_held_checkpoint():
    """Issue 40's checkpoint fix reverted: a checkpoint that leaves the index
    (superseded, evicted) frees its slots at once, though a prepared load
    still names them (and reads what reuses them, or a freed handle)."""
    def _free_checkpoint(self, key, tier):
        self.backend.free_state(tier, self.index.remove_checkpoint(bytes(key), tier))

    def _release_checkpoint(self, ck):
        if ck is not None:
            ref = (int(ck.tier), int(ck.slot))
            left = self._ckpt_readers.pop(ref, 1) - 1
            if left:
                self._ckpt_readers[ref] = left

    return _patch((CacheManager, "_free_checkpoint", _free_checkpoint),
                  (CacheManager, "_release_checkpoint", _release_checkpoint))


MUTATIONS = {
    "drain-waits-for-server": _drain_waits_for_server,
    "sync-hybrid-loads": _sync_hybrid_loads,
    "free-held-checkpoint": _free_held_checkpoint,
    "readiness-off": _readiness_off,
    "tp-store-first-failure": _tp_store_first_failure,
    "shorten-relock": _shorten_relock,
    "reuse-moved-load": _reuse_moved_load,
    "no-cancel-owed": _no_cancel_owed,
    "cluster-before-ssd": _cluster_before_ssd,
    "no-breaker": _no_breaker,
    "gone-pool-raises": _gone_pool_raises,
    "no-unfilled": _no_unfilled,
    "hold-empty-store": _hold_empty_store,
    "keep-preempted-waves": _keep_preempted_waves,
}


@contextlib.contextmanager
def applied(name: str):
    undo = MUTATIONS[name]()
    try:
        yield
    finally:
        undo()
