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
"""

from __future__ import annotations

import contextlib

from saria.connector.ops import OpTracker
from saria.core.manager import CacheManager


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


MUTATIONS = {
    "readiness-off": _readiness_off,
    "tp-store-first-failure": _tp_store_first_failure,
}


@contextlib.contextmanager
def applied(name: str):
    undo = MUTATIONS[name]()
    try:
        yield
    finally:
        undo()
