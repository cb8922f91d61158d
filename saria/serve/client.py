"""The client of ``saria serve``: the one core's verbs over the wire.

``RemoteCache`` offers the calls an engine's scheduler connector makes of an
in-process ``TieredCache`` (``lookup``, ``touch``, ``prepare_load`` /
``complete_load`` / ``cancel_load``, ``prepare_store`` / ``prepare_promotion`` /
``complete_store``, ``take_staging`` / ``release_staging``, ``gauges``,
``flush``, ``close``), plus ``batch`` for one round trip per scheduler step.

Failure model: every call has a deadline (``timeout_s``). A call that misses
it raises ``ServerUnavailable``; the engine treats it as a miss and
recomputes. A reply with another boot token means the server restarted: the
session and every spec of the old boot are void (``complete_*`` of such a
spec is a no-op that reports nothing served) and the client says hello again
on its next call. A session the server ended (lease expired while the engine
was idle) is renewed the same way. A heartbeat thread (its own socket) keeps
the lease while the engine is idle; an engine killed with SIGKILL stops
pinging and the server ends its session after ``lease_s``.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from dataclasses import dataclass

import numpy as np
import zmq

from saria.core import LoadSpec, StoreSpec
from saria.errors import SariaError
from saria.serve import protocol as P
from saria.serve.auth import ClientSecurity


class ServerUnavailable(SariaError, TimeoutError):
    """No reply within the call's deadline (server down, overloaded, or restarting)."""


@dataclass(slots=True)
class RemotePlan:
    num_blocks: int


@dataclass(slots=True)
class RemoteLoadSpec(LoadSpec):
    """A ``LoadSpec`` as the server sent it: ``spec`` is its id there, valid
    for the server's boot ``boot`` only."""

    spec: int = -1
    boot: str = ""


@dataclass(slots=True)
class RemoteStoreSpec(StoreSpec):
    """A ``StoreSpec`` as the server sent it (``masks`` stay on the server;
    ``chain`` is the request's keys, for its direct writes)."""

    spec: int = -1
    boot: str = ""

    @classmethod
    def of(cls, keys: np.ndarray, positions, slots, spec: int, boot: str, *,
           promotion: bool = False, direct=None) -> RemoteStoreSpec:
        return cls(keys, positions, slots, _NO_MASKS, promotion=promotion,
                   direct=_EMPTY if direct is None else direct, chain=keys, spec=spec, boot=boot)


_EMPTY = np.zeros(0, np.int64)
_NO_MASKS = np.zeros(0, np.uint8)


class RemoteCache:
    """A session with a ``saria serve`` process; see the module docstring."""

    def __init__(self, address: str, layout: dict, *, name: str = "engine",
                 dp_rank: int = 0, tp_rank: int = 0, timeout_s: float = 2.0,
                 heartbeat: bool = True, security: ClientSecurity | None = None) -> None:
        self.address = address
        self.security = security or ClientSecurity()
        self.layout = dict(layout)
        self.identity = {"name": name, "dp_rank": dp_rank, "tp_rank": tp_rank, "pid": os.getpid()}
        self.timeout_s = float(timeout_s)
        self._ctx = zmq.Context()
        self._sock = self._connect()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.session: str | None = None
        self.boot: str | None = None
        self.info: dict = {}
        self.reconnects = 0
        self._hello()
        self._beat: threading.Thread | None = None
        self._closing = threading.Event()
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
        r = self._call("prepare_load", {"keys": keys, "blocks": int(blocks), "start": int(start)})
        return RemoteLoadSpec(keys[:r["num_blocks"]], r["start"], r["tiers"], r["slots"],
                              spec=r["spec"], boot=self.boot)

    def complete_load(self, spec: RemoteLoadSpec, failed: np.ndarray | None = None) -> int:
        if spec.boot != self.boot:
            return 0  # the server restarted: nothing of that load is the server's any more
        args = {"spec": spec.spec, "failed": None if failed is None
                else np.asarray(failed, np.int64)}
        return self._call("complete_load", args, renew=False)

    def cancel_load(self, spec: RemoteLoadSpec) -> None:
        if spec.boot == self.boot:
            self._call("cancel_load", {"spec": spec.spec}, renew=False)

    def prepare_store(self, keys: np.ndarray, start: int = 0, *, session: int = 0,
                      direct: bool = False) -> RemoteStoreSpec:
        keys = _keys(keys)
        r = self._call("prepare_store", {"keys": keys, "start": int(start), "tag": int(session),
                                         "direct": bool(direct)})
        return self._store_spec(keys, r)

    def prepare_promotion(self, keys: np.ndarray, ssd_positions: np.ndarray,
                          dram_blocks: int) -> RemoteStoreSpec:
        keys = _keys(keys)
        r = self._call("prepare_promotion", {"keys": keys,
                                             "ssd_positions": np.asarray(ssd_positions, np.int64),
                                             "dram_blocks": int(dram_blocks)})
        return self._store_spec(keys, r)

    def complete_store(self, spec: RemoteStoreSpec, *, success: bool = True) -> int:
        if spec.boot != self.boot:
            return 0
        return self._call("complete_store", {"spec": spec.spec, "success": bool(success)},
                          renew=False)

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
        return self._call("take_staging", {"count": int(count)})

    def release_staging(self, slots: np.ndarray) -> None:
        self._call("release_staging", {"slots": np.asarray(slots, np.int64)}, renew=False)

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
        per call, in order (a failed call does not stop the others)."""
        return self._call("batch", {"calls": [[op, args] for op, args in calls]})

    def close(self) -> None:
        self._closing.set()
        if self._beat is not None:
            self._beat.join(timeout=2)
        try:
            if self.session is not None:
                self._call("bye", {}, renew=False, timeout_s=0.5)
        except (ServerUnavailable, P.RemoteError):
            pass
        self._sock.close(0)
        self._ctx.term()

    # ------------------------------------------------------------ helpers

    def _store_spec(self, keys: np.ndarray, r: dict) -> RemoteStoreSpec:
        return RemoteStoreSpec.of(keys, r["positions"], r["slots"], r["spec"], self.boot,
                                  promotion=r["promotion"], direct=r["direct"])

    def _connect(self) -> zmq.Socket:
        return self.security.socket(self._ctx, self.address)

    def _hello(self) -> None:
        info = self._raw("hello", None, {**self.identity, "layout": self.layout}, self.timeout_s)
        self.security.check_hello(info)  # the pool and drives it names are the server's own
        self.session, self.boot, self.info = info["session"], info["boot"], info

    def _call(self, op: str, args: dict, *, renew: bool = True, timeout_s: float | None = None):
        """One call; says hello again (once) when the server restarted or
        ended the session, if `renew` (a call naming a spec is not retried:
        its spec died with the session)."""
        with self._lock:
            if self.session is None:
                self._hello()
            try:
                return self._raw(op, self.session, args, timeout_s or self.timeout_s)
            except P.RemoteError as e:
                if e.code != "session" or not renew:
                    raise
                self.reconnects += 1
                self._hello()
                return self._raw(op, self.session, args, timeout_s or self.timeout_s)

    def _raw(self, op: str, session: str | None, args: dict, timeout_s: float):
        rid = next(self._ids)
        self._sock.send(P.pack({"v": P.VERSION, "id": rid, "op": op, "session": session,
                                "args": args}))
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self._sock.poll(int(left * 1000) + 1):
                # a late reply to this id would confuse the next call: start afresh
                self._sock.close(0)
                self._sock = self._connect()
                raise ServerUnavailable(f"saria server at {self.address}: no reply to {op} "
                                        f"within {timeout_s:g} s")
            reply = P.unpack(self._sock.recv())
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
        """Pings on a socket of its own every third of the lease."""
        sock = self._connect()
        period = float(self.info.get("lease_s", 10.0)) / 3
        try:
            while not self._closing.wait(period):
                sid = self.session
                if sid is None:
                    continue
                sock.send(P.pack({"v": P.VERSION, "id": 0, "op": "ping", "session": sid,
                                  "args": {}}))
                if sock.poll(int(period * 1000)):
                    sock.recv()
        finally:
            sock.close(0)


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
        sock.send(P.pack({"v": P.VERSION, "id": 1, "op": "stats", "session": None, "args": {}}))
        if not sock.poll(int(timeout_s * 1000)):
            raise ServerUnavailable(f"saria server at {address}: no reply within {timeout_s:g} s")
        reply = P.unpack(sock.recv())
        if not reply.get("ok"):
            raise P.RemoteError(reply.get("code", "internal"), reply.get("error", ""))
        return reply["result"]
    finally:
        sock.close(0)
        ctx.term()
