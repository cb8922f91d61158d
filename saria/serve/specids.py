"""Spec ids that the client chooses, and cancels that overtake their prepare.

A prepare (``prepare_load`` / ``prepare_store`` / ``prepare_promotion`` /
``take_staging``) registers what it holds before its reply leaves the server;
a client whose deadline passed first never learns what the server holds for
it. So the client names each such call's spec itself (``rid``, unique in its
session) and owes the server a ``cancel`` of every one whose reply it did not
get. A cancel may arrive before its prepare (the prepare still queued behind
a busy loop): it leaves a *tombstone*, and the prepare that comes later is
refused (code ``cancelled``) without holding anything.

Invariant: what a session holds is named by an id its client knows or can
cancel, and a cancel is never lost -- done at once, or waiting as a
tombstone. Tombstones are bounded per session (``MAX_TOMBSTONES``, oldest
dropped first): a cancel older than that many later cancels has had time to
meet its prepare.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Container

from saria.serve import protocol as P

MAX_TOMBSTONES = 4096


class SpecIds:
    """One session's tombstones, and the check of a prepare's id."""

    def __init__(self, limit: int = MAX_TOMBSTONES) -> None:
        self.limit = int(limit)
        self._tombstones: OrderedDict[int, None] = OrderedDict()

    def claim(self, args: dict, in_use: Container[int], server_id: Callable[[], int]) -> int:
        """The id of a prepare: the client's ``rid`` (refused when a cancel
        came first or it is in use), or one the server picks (clients that
        send none cannot cancel it)."""
        rid = P.arg(args, "rid", int, None)
        if rid is None:
            return server_id()
        if rid in self._tombstones:
            del self._tombstones[rid]
            raise P.RemoteError("cancelled", f"spec {rid} was cancelled before its prepare came")
        if rid in in_use:
            raise P.ProtocolError(f"spec id {rid} is already in use in this session")
        return rid

    def bury(self, rid: int) -> None:
        """A cancel of an id that holds nothing (yet): remember it, bounded."""
        self._tombstones[rid] = None
        self._tombstones.move_to_end(rid)
        while len(self._tombstones) > self.limit:
            self._tombstones.popitem(last=False)

    def __len__(self) -> int:
        return len(self._tombstones)
