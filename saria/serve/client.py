"""The client of ``saria serve``: the one core's verbs over the wire.

``RemoteCache`` offers the calls an engine's scheduler connector makes of an
in-process ``TieredCache`` (``lookup``, ``touch``, ``prepare_load`` /
``complete_load`` / ``cancel_load``, ``prepare_store`` / ``prepare_promotion`` /
``complete_store``, ``take_staging`` / ``release_staging``, ``gauges``,
``flush``, ``close``), plus ``batch`` for one round trip per scheduler step.

Failure model: every call has a deadline (``timeout_s``). A call that misses
it raises ``ServerUnavailable``; the engine treats it as a miss and
recomputes. That miss also opens the client's breaker (``saria.serve.breaker``):
every later call fails at once, without a message, until a probe (from the
heartbeat thread, backing off from 0.25 s to 2 s) gets a reply -- a server
that is down costs an engine one deadline, not one per call, and a server
that exits costs none: a call whose connection closes fails at once
(``saria.serve.link``). Sockets are
``ZMQ_IMMEDIATE``: a send to a server that is not connected fails at once
instead of queueing.

Nothing leaks past a missed deadline: each call that makes the server hold
something (``prepare_load`` / ``prepare_store`` / ``prepare_promotion`` /
``take_staging``) carries a spec id the client chose (``rid``), and a call
that got no reply leaves a *debt*: a ``cancel`` of that id (or, for a
completion or release that got no reply or was refused by the breaker, the
call itself: sent again, it completes the spec or finds it done). Debts are
paid before the next call, by the heartbeat thread as soon as the server
answers (so an idle engine leaks nothing either) and at close; a debt of an
older boot or session is dropped (the server already released everything of
it). See ``saria.serve.specids``.

A reply with another boot token means the server restarted: the session and
every spec of the old boot are void (``complete_*`` of such a spec is a no-op
that reports nothing served) and the client says hello again on its next
call. A session the server ended (lease expired while the engine was idle)
is renewed the same way. A heartbeat thread (its own socket) keeps the lease
while the engine is idle; an engine killed with SIGKILL stops pinging and the
server ends its session after ``lease_s``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
import zmq

from saria.core import LoadSpec, StoreSpec
from saria.errors import SariaError
from saria.serve import protocol as P
from saria.serve.auth import ClientSecurity
from saria.serve.breaker import Breaker
from saria.serve.link import REPLY, TIMEOUT, Link


class ServerUnavailable(SariaError, TimeoutError):
    """No reply within the call's deadline (server down, overloaded, or restarting)."""


class BreakerOpen(ServerUnavailable):
    """Refused without a message: the server missed a deadline and has not
    answered a probe since."""


CONNECT_GRACE_S = 0.1  # how long a send waits for a connection (IMMEDIATE) before failing
MAX_DEBTS = 4096       # as many as the server keeps tombstones per session
_PREPARES = frozenset({"prepare_load", "prepare_store", "prepare_promotion", "take_staging"})


@dataclass(slots=True)
class RemotePlan:
    num_blocks: int


@dataclass(slots=True)
class RemoteLoadSpec(LoadSpec):
    """A ``LoadSpec`` as the server sent it: ``spec`` is its id there, valid
    for the server's boot ``boot`` and the session ``session`` only."""

    spec: int = -1
    boot: str = ""
    session: str = ""


@dataclass(slots=True)
class RemoteStoreSpec(StoreSpec):
    """A ``StoreSpec`` as the server sent it (``masks`` stay on the server;
    ``chain`` is the request's keys, for its direct writes)."""

    spec: int = -1
    boot: str = ""
    session: str = ""

    @classmethod
    def of(cls, keys: np.ndarray, positions, slots, spec: int, boot: str, *,
           promotion: bool = False, direct=None, session: str = "") -> RemoteStoreSpec:
        return cls(keys, positions, slots, _NO_MASKS, promotion=promotion,
                   direct=_EMPTY if direct is None else direct, chain=keys, spec=spec, boot=boot,
                   session=session)


_EMPTY = np.zeros(0, np.int64)
_NO_MASKS = np.zeros(0, np.uint8)


class RemoteCache:
    """A session with a ``saria serve`` process; see the module docstring."""

    def __init__(self, address: str, layout: dict, *, name: str = "engine",
                 dp_rank: int = 0, tp_rank: int = 0, timeout_s: float = 2.0,
                 heartbeat: bool = True, security: ClientSecurity | None = None,
                 start_s: float = 0.0) -> None:
        self.address = address
        self.security = security or ClientSecurity()
        self.layout = dict(layout)
        self.identity = {"name": name, "dp_rank": dp_rank, "tp_rank": tp_rank, "pid": os.getpid()}
        self.timeout_s = float(timeout_s)
        self._ctx = zmq.Context()
        self._closed = False
        self._link: Link | None = Link(self._connect())  # the calls' socket, watched
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.session: str | None = None
        self.boot: str | None = None
        self.info: dict = {}
        self.reconnects = 0
        self.calls: Counter = Counter()  # op -> calls sent by the engine (not the heartbeat's)
        self.breaker = Breaker(address)
        self._debts: list[tuple[str | None, str | None, str, dict]] = []  # boot, session, op, args
        self._first_hello(start_s)
        self._beat: threading.Thread | None = None
        self._closing = threading.Event()
        self._kick = threading.Event()  # wakes the heartbeat: closing, or the breaker opened
        if heartbeat:
            self._beat = threading.Thread(target=self._heartbeat, name="saria-heartbeat",
                                          daemon=True)
            self._beat.start()

    # ------------------------------------------------------------- verbs

    def lookup(self, keys: np.ndarray) -> RemotePlan:
        return RemotePlan(self._call("lookup", {"keys": _keys(keys)})["num_blocks"])

    def touch(self, keys: np.ndarray, *, hits: int, checkpoint_at: int = 0) -> int:
        return self._call("touch", {"keys": _keys(keys), "hits": int(hits),
                                    "checkpoint_at": int(checkpoint_at)})

    def prepare_load(self, keys: np.ndarray, blocks: int, *, start: int = 0) -> RemoteLoadSpec:
        keys = _keys(keys)
        r = self._prepare("prepare_load", {"keys": keys, "blocks": int(blocks),
                                           "start": int(start)})
        return RemoteLoadSpec(keys[:r["num_blocks"]], r["start"], r["tiers"], r["slots"],
                              spec=r["spec"], boot=self.boot, session=self.session)

    def complete_load(self, spec: RemoteLoadSpec, failed: np.ndarray | None = None) -> int:
        if spec.boot != self.boot:
            return 0  # the server restarted: nothing of that load is the server's any more
        args = {"spec": spec.spec, "failed": None if failed is None
                else np.asarray(failed, np.int64)}
        return self._call("complete_load", args, renew=False, settle=[("complete_load", args)])

    def cancel_load(self, spec: RemoteLoadSpec) -> None:
        if spec.boot == self.boot:
            self._call("cancel_load", {"spec": spec.spec}, renew=False,
                       settle=_cancel_of(spec.spec))

    def cancel(self, spec_id: int) -> str:
        """Ends whatever the server holds under `spec_id` in this session (a
        load, a store -- as failed --, a take's staging slots), or leaves a
        tombstone against a prepare still on its way. Idempotent."""
        return self._call("cancel", {"spec": int(spec_id)}, renew=False,
                          settle=_cancel_of(spec_id))

    @property
    def debts(self) -> int:
        """Settling calls owed to the server (cancels of calls that got no reply)."""
        return len(self._debts)

    def prepare_store(self, keys: np.ndarray, start: int = 0, *, session: int = 0,
                      direct: bool = False) -> RemoteStoreSpec:
        keys = _keys(keys)
        r = self._prepare("prepare_store", {"keys": keys, "start": int(start),
                                            "tag": int(session), "direct": bool(direct)})
        return self._store_spec(keys, r)

    def prepare_promotion(self, keys: np.ndarray, ssd_positions: np.ndarray,
                          dram_blocks: int) -> RemoteStoreSpec:
        keys = _keys(keys)
        r = self._prepare("prepare_promotion", {
            "keys": keys, "ssd_positions": np.asarray(ssd_positions, np.int64),
            "dram_blocks": int(dram_blocks)})
        return self._store_spec(keys, r)

    def complete_store(self, spec: RemoteStoreSpec, *, success: bool = True) -> int:
        if spec.boot != self.boot:
            return 0
        args = {"spec": spec.spec, "success": bool(success)}
        return self._call("complete_store", args, renew=False, settle=[("complete_store", args)])

    def write_direct(self, chain: np.ndarray, positions: np.ndarray, staging: np.ndarray) -> int:
        """Write-through of ``chain[positions]``, whose bytes the caller copied
        into its staging slots `staging` (see ``TieredCache.write_direct``)."""
        return self._call("write_direct", {"chain": _keys(chain),
                                           "positions": np.asarray(positions, np.int64),
                                           "slots": np.asarray(staging, np.int64)}, renew=False)

    @property
    def staging_slots(self) -> int:
        return int(self.info.get("staging_slots", 0))

    def take_staging(self, count: int) -> np.ndarray:
        return self._prepare("take_staging", {"count": int(count)})

    def release_staging(self, slots: np.ndarray) -> None:
        args = {"slots": np.asarray(slots, np.int64)}
        self._call("release_staging", args, renew=False, settle=[("release_staging", args)])

    def gauges(self) -> dict[str, float]:
        return self._call("gauges", {})

    def flush(self) -> None:
        self._call("flush", {})

    def stats(self) -> dict:
        return self._call("stats", {})

    def ping(self) -> None:
        self._call("ping", {})

    def batch(self, calls: list[tuple[str, dict]]) -> list[dict]:
        """Several plain calls in one round trip; one ``{ok, result | error}``
        per call, in order (a call the server refuses does not stop the
        others; an error that escapes undoes the batch's prepares). Each
        prepare gets a spec id (``rid``), cancelled if no reply comes."""
        out, undo = [], []
        for op, args in calls:
            if op in _PREPARES and "rid" not in args:
                args = {**args, "rid": next(self._ids)}
            if op in _PREPARES:
                undo += _cancel_of(args["rid"])
            out.append([op, args])
        return self._call("batch", {"calls": out}, undo=undo)

    def close(self) -> None:
        self._closing.set()
        self._kick.set()
        if self._beat is not None:
            self._beat.join(timeout=2)
        try:
            if self.session is not None and not self.breaker.is_open:
                with self._lock:
                    if self._debts:
                        self._pay_debts()  # completions first: a bye would fail the stores
                self._call("bye", {}, renew=False, timeout_s=0.5)
        except (ServerUnavailable, P.RemoteError):
            pass
        if self._link is not None:
            self._link.close()
            self._link = None
        self._closed = True  # a call after this fails as a miss, never on a closed socket
        self._ctx.term()

    # ------------------------------------------------------------ helpers

    def _prepare(self, op: str, args: dict):
        """A call that makes the server hold something, under an id this
        client chose: no reply means a ``cancel`` of that id is owed."""
        rid = next(self._ids)
        return self._call(op, {**args, "rid": rid}, undo=_cancel_of(rid))

    def _owe(self, calls: list[tuple[str, dict]]) -> None:
        self._debts += [(self.boot, self.session, op, args) for op, args in calls]
        if len(self._debts) > MAX_DEBTS:
            del self._debts[:len(self._debts) - MAX_DEBTS]
        self._kick.set()  # the heartbeat pays as soon as the server answers

    def _pay_debts(self) -> None:
        """Sends what is owed to this boot's session in one batch (the lock
        held); debts of another boot or session are void and dropped."""
        calls = [[op, args] for boot, sid, op, args in self._debts
                 if boot == self.boot and sid == self.session and sid is not None]
        debts, self._debts = self._debts, []
        if not calls:
            return
        try:
            self._raw("batch", self.session, {"calls": calls}, self.timeout_s)
        except ServerUnavailable as e:
            self._debts = debts + self._debts
            self.breaker.trip(str(e))
            self._kick.set()
            raise
        except P.RemoteError:
            pass  # its session or boot is gone: the server released all of it

    def _store_spec(self, keys: np.ndarray, r: dict) -> RemoteStoreSpec:
        return RemoteStoreSpec.of(keys, r["positions"], r["slots"], r["spec"], self.boot,
                                  promotion=r["promotion"], direct=r["direct"],
                                  session=self.session)

    def _connect(self) -> zmq.Socket:
        return self.security.socket(self._ctx, self.address)

    def _first_hello(self, start_s: float) -> None:
        """Hello, retried for up to `start_s` while no reply comes: a server
        still starting beside its engines, or busy a moment, or whose reply
        was lost, is no reason for an engine not to start. (A hello whose
        reply was lost leaves a session the server reaps at its lease.)"""
        end = time.monotonic() + start_s
        while True:
            try:
                return self._hello()
            except ServerUnavailable as e:
                if self._closed or time.monotonic() >= end:
                    if start_s > 0:
                        raise ServerUnavailable(f"{e} (retried for {start_s:g} s)") from None
                    raise
                time.sleep(min(0.2, self.timeout_s))

    def _hello(self) -> None:
        info = self._raw("hello", None, {**self.identity, "layout": self.layout}, self.timeout_s)
        self.security.check_hello(info)  # the pool and drives it names are the server's own
        self.session, self.boot, self.info = info["session"], info["boot"], info

    def _call(self, op: str, args: dict, *, renew: bool = True, timeout_s: float | None = None,
              undo: list[tuple[str, dict]] = (), settle: list[tuple[str, dict]] = ()):
        """One call; says hello again (once) when the server restarted or
        ended the session, if `renew` (a call naming a spec is not retried:
        its spec died with the session). With no reply, `undo` and `settle`
        become debts; refused by the breaker (never sent), only `settle`."""
        with self._lock:
            if self.breaker.refuse(may_probe=self._beat is None):
                if settle:
                    self._owe(list(settle))
                raise BreakerOpen(f"saria server at {self.address}: not answering (breaker "
                                  f"open); {op} skipped")
            self.calls[op] += 1
            try:
                if self._debts:
                    self._pay_debts()
                out = self._session_call(op, args, renew, timeout_s or self.timeout_s)
            except ServerUnavailable as e:
                self._owe(list(undo) + list(settle))
                if self.breaker.is_open:
                    self.breaker.probe_failed()  # this call was the probe (no heartbeat)
                else:
                    self.breaker.trip(str(e))
                    self._kick.set()  # the heartbeat starts probing
                raise
            except P.RemoteError:
                self.breaker.reset()  # it answered
                raise
            self.breaker.reset()
            return out

    def _session_call(self, op: str, args: dict, renew: bool, timeout_s: float):
        if self.session is None:
            self._hello()
        try:
            return self._raw(op, self.session, args, timeout_s)
        except P.RemoteError as e:
            if e.code != "session" or not renew:
                raise
            self.reconnects += 1
            self._hello()
            return self._raw(op, self.session, args, timeout_s)

    def _raw(self, op: str, session: str | None, args: dict, timeout_s: float):
        rid = next(self._ids)
        deadline = time.monotonic() + timeout_s
        if self._closed:
            raise ServerUnavailable(f"saria server at {self.address}: this client is closed; "
                                    f"{op} not sent")
        if self._link is None:  # the last reconnect was refused (the socket's folder gone)
            try:
                self._link = Link(self._connect())
            except SariaError as e:
                raise ServerUnavailable(f"saria server at {self.address}: {e}; {op} not sent") \
                    from None
        link = self._link
        link.forget()
        _send(link.sock, P.pack({"v": P.VERSION, "id": rid, "op": op, "session": session,
                                 "args": args}), min(timeout_s, CONNECT_GRACE_S),
              f"saria server at {self.address}: not connected; {op} not sent")
        while True:
            got = link.wait(deadline)
            if got != REPLY:
                # a late reply to this id would confuse the next call: start afresh
                link.close()
                self._link = None  # connected afresh (and checked again) by the next call
                raise ServerUnavailable(
                    f"saria server at {self.address}: " + (
                        f"no reply to {op} within {timeout_s:g} s" if got == TIMEOUT else
                        f"the connection closed before {op} was answered (server gone)"))
            reply = P.unpack(link.sock.recv())
            if reply.get("id") != rid:
                continue  # a reply to a call that timed out before
            boot = reply.get("boot")
            if op != "hello" and self.boot is not None and boot != self.boot:
                self.session = None  # restarted: every spec of the old boot is void
                self.boot = boot
                self.reconnects += 1
                raise P.RemoteError("session", "the server restarted")
            if not reply["ok"]:
                raise P.RemoteError(reply.get("code", "internal"), reply.get("error", ""))
            return reply["result"]

    def _heartbeat(self) -> None:
        """Pings on a socket of its own every third of the lease; while the
        breaker is open, probes the server instead (with its back-off)."""
        sock = self._connect()
        period = float(self.info.get("lease_s", 10.0)) / 3
        next_ping = time.monotonic() + period
        try:
            while True:
                wait = max(0.0, next_ping - time.monotonic())
                to_probe = self.breaker.seconds_to_probe()
                if to_probe is not None:
                    wait = to_probe  # open: probes only (no pings, however overdue)
                elif self._debts:
                    wait = 0.0
                self._kick.wait(wait)
                self._kick.clear()
                if self._closing.is_set():
                    return
                if self.breaker.is_open:
                    if self.breaker.probe_due():
                        if self._probe(sock):
                            self.breaker.reset()
                        else:
                            self.breaker.probe_failed()
                    continue
                if self._debts:  # an idle engine pays too, not only at its next call
                    with self._lock:
                        with contextlib.suppress(ServerUnavailable):
                            self._pay_debts()
                if time.monotonic() < next_ping:
                    continue
                next_ping = time.monotonic() + period
                sid = self.session
                if sid is None:
                    continue
                try:
                    _send(sock, P.pack({"v": P.VERSION, "id": 0, "op": "ping", "session": sid,
                                        "args": {}}), CONNECT_GRACE_S, "")
                except ServerUnavailable:
                    continue
                if sock.poll(int(period * 1000)):
                    sock.recv()
        finally:
            sock.close(0)

    def _probe(self, sock: zmq.Socket) -> bool:
        """Whether the server answers a session-less call within the deadline."""
        while sock.poll(0):
            sock.recv()  # late replies of earlier pings / probes
        try:
            _send(sock, P.pack({"v": P.VERSION, "id": 0, "op": "stats", "session": None,
                                "args": {}}), CONNECT_GRACE_S, "")
        except ServerUnavailable:
            return False
        if not sock.poll(int(self.timeout_s * 1000)):
            return False
        sock.recv()
        return True


def _send(sock: zmq.Socket, frame: bytes, grace_s: float, what: str) -> None:
    """Sends one frame; a socket with no connection (``IMMEDIATE``) gets
    `grace_s` to make one (a fresh socket's connect is asynchronous), then
    the call fails without waiting out its deadline."""
    try:
        sock.send(frame, zmq.NOBLOCK)
        return
    except zmq.Again:
        pass
    if sock.poll(int(grace_s * 1000), zmq.POLLOUT):
        try:
            sock.send(frame, zmq.NOBLOCK)
            return
        except zmq.Again:
            pass
    raise ServerUnavailable(what)


def _cancel_of(spec_id: int) -> list[tuple[str, dict]]:
    return [("cancel", {"spec": int(spec_id)})]


def _keys(keys) -> np.ndarray:
    arr = np.ascontiguousarray(keys, dtype=np.uint8)
    if arr.ndim != 2 or arr.shape[1] != 32:
        raise ValueError(f"block keys must be (n, 32) uint8, got {arr.shape}")
    return arr


def server_stats(address: str, timeout_s: float = 2.0,
                 security: ClientSecurity | None = None) -> dict:
    """The server's figures without a session (``saria status``; the
    server's own tenant only)."""
    ctx = zmq.Context()
    try:
        sock = (security or ClientSecurity()).socket(ctx, address)
    except BaseException:
        ctx.term()
        raise
    try:
        _send(sock, P.pack({"v": P.VERSION, "id": 1, "op": "stats", "session": None, "args": {}}),
              timeout_s, f"saria server at {address}: no reply within {timeout_s:g} s (not answering)")
        if not sock.poll(int(timeout_s * 1000)):
            raise ServerUnavailable(f"saria server at {address}: no reply within {timeout_s:g} s")
        reply = P.unpack(sock.recv())
        if not reply.get("ok"):
            raise P.RemoteError(reply.get("code", "internal"), reply.get("error", ""))
        return reply["result"]
    finally:
        sock.close(0)
        ctx.term()
