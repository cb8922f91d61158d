"""``saria serve``: one cache per node, shared by every engine on it.

The server owns what an engine's scheduler connector owns in-process: the
index, the policies, the DRAM pool and the SSD drives (one ``TieredCache`` per
*namespace*), and answers the core's verbs over ZMQ (``saria.serve.protocol``).
It never touches CUDA: workers map the DRAM pool's file themselves (and
page-lock their mapping) and read SSD slots directly.

Namespaces. A client's hello carries its layout fingerprint (model, dtype,
block size, page layout, layers, TP size, hash settings); its digest names
the namespace, so engines of the same model and layout share blocks and
different models never mix. Each namespace gets ``dram_bytes / max_models`` of
DRAM and ``ssd_bytes / max_models`` of each drive directory, created at its
first hello; a hello for one namespace too many is refused with the limit.

Sessions and leases. Hello returns a session id, the server's boot token, the
pool file to map and the lease. Every call renews the session's lease; a
session whose lease ran out (an engine killed with SIGKILL, a hung host) is
ended by the server: its loads are cancelled (unlocked), its stores completed
as failed (their slots freed), its staging slots released. So nothing an
engine held outlives its lease, and nothing of another session is touched.

Specs stay in the server. ``prepare_load`` / ``prepare_store`` /
``prepare_promotion`` keep the spec under an id and return its arrays and the
id; ``complete_*`` and ``cancel_load`` name the id. A client cannot forge or
alter a spec, and an id of another session is refused. The client chooses
the id (``rid``) so that a prepare whose reply missed its deadline can still
be ended: ``cancel`` ends whatever an id holds (a load, a store, a
``take_staging``'s slots) or leaves a tombstone that refuses the prepare if
it comes later (``saria.serve.specids``). A ``batch`` is all-or-nothing
against errors that escape it: what its earlier calls prepared is undone.

The cluster tier. With ``remote`` (the keys of
``saria.tiers.remote.RemoteSettings.from_mapping``; ``saria serve --remote
mooncake://HOST:PORT``) every namespace's cache also has a ``RemoteTier``,
this node's one client of the Mooncake Store the fleet shares, under the
namespace's digest: engines of the same layout on other nodes find what this
node published, and fetched blocks reach engines as verified DRAM blocks
(``saria.core.remote``). Its counters, latencies and breaker state are among
the namespace's gauges (``remote_*``: ``saria status``, Prometheus).

Invariants: a malformed frame, a wrong protocol version or a call the cache
rejects gets an error reply and changes nothing; the loop itself never raises
on client input.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import signal
import socket
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import zmq

from saria.core import LoadSpec, StoreSpec
from saria.errors import ConfigError, SariaError
from saria.keys import digest_bytes
from saria.policy import make_admission
from saria.routing import wire
from saria.runtime.cache import CacheConfig, TieredCache
from saria.serve import auth
from saria.serve import protocol as P
from saria.serve.limits import LAYOUT_FIELDS, HelloRate, Limits, QuotaError, check_layout
from saria.serve.metrics import ServerMetrics
from saria.serve.publisher import EventPublisher, to_wire
from saria.serve import fence as F
from saria.serve.specids import SpecIds
from saria.serve.startup import check, stop_summary
from saria.serve.paths import default_listen, default_runtime_dir  # noqa: F401
from saria.serve.tenants import Tenants, map_keys

log = logging.getLogger("saria.serve")

__all__ = ["LAYOUT_FIELDS", "CacheServer", "ServerConfig", "namespace_of", "run"]


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Settings of ``saria serve``; sizes in bytes."""

    listen: str
    dram_bytes: int
    ssd_dirs: tuple[str, ...] = ()
    ssd_bytes: int = 0
    admission: str = "saria"
    promotion: str = "lazy"
    dwpd: float = 1.0
    max_models: int = 1
    lease_s: float = 10.0
    metrics_port: int | None = None
    pin: bool = False  # workers page-lock their own mappings
    events: str | None = None  # ZMQ PUB endpoint of the node's KV events (None: off)
    node: str = ""             # the node's name in event topics (default: the host name)
    scrub_bytes_per_s: float = 0.0  # background SSD scrub of each namespace's store (0: off)
    # the cluster tier: RemoteSettings.from_mapping's keys (None: off)
    remote: dict | None = None
    # security (saria.serve.auth, .tenants, .limits; docs/security.md)
    limits: Limits = Limits()
    curve_secret: str | None = None   # the server's NAME.key_secret (tcp:// needs it)
    curve_clients: str | None = None  # a folder of the allowed clients' NAME.key files
    insecure_tcp: bool = False        # tcp:// without CURVE: anyone who reaches it is trusted
    allow_uids: tuple[int, ...] = ()  # ipc:// peers of other uids let in (SO_PEERCRED)
    tenants: str | None = None        # the tenants file (saria.serve.tenants)
    metrics_host: str = "127.0.0.1"   # where the Prometheus endpoint binds

    def __post_init__(self) -> None:
        if self.max_models < 1:
            raise ConfigError("max_models", f"must be at least 1, got {self.max_models}")
        if not self.lease_s > 0:
            raise ConfigError("lease_s", f"must be positive, got {self.lease_s}")
        if self.dram_bytes <= 0:
            raise ConfigError("dram", f"must be positive, got {self.dram_bytes}")
        if not self.scrub_bytes_per_s >= 0:
            raise ConfigError("scrub_rate", f"must be >= 0, got {self.scrub_bytes_per_s}")
        make_admission(self.admission, dwpd=self.dwpd)  # a bad name fails here, naming the key
        if self.remote is not None:
            from saria.tiers.remote import RemoteSettings

            RemoteSettings.from_mapping(self.remote)  # a bad setting fails here, naming its key
        if not self.listen.startswith(("ipc://", "inproc://")) and not self.insecure_tcp and (
                self.curve_secret is None or self.curve_clients is None):
            raise ConfigError("listen", f"{self.listen} is reachable by every user of the host "
                              "(and beyond): give --curve-secret and --curve-clients (saria serve "
                              "keygen), or --insecure-tcp to accept anyone")


def namespace_of(layout: dict) -> str:
    parts = tuple(layout[k] for k in LAYOUT_FIELDS)
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


@dataclass
class Session:
    sid: str
    namespace: str
    engine: str
    pid: int
    expires: float
    peer: str = ""     # who said hello (auth.Gate's name for it)
    proc: str = ""     # the client process it came from (auth.process_of)
    tenant: str = ""   # its tenant (tenants.DEFAULT: the node's own)
    space: bytes | None = None  # its tenant's key space
    held: dict[int, float] = field(default_factory=dict)  # spec id -> when prepared
    loads: dict[int, LoadSpec] = field(default_factory=dict)
    stores: dict[int, StoreSpec] = field(default_factory=dict)
    staging: set[int] = field(default_factory=set)
    takes: dict[int, set[int]] = field(default_factory=dict)  # take_staging id -> slots
    ids: SpecIds = field(default_factory=SpecIds)
    fence: str = ""  # its workers' fence file (saria.serve.fence)
    worked: float = 0.0  # when it last called anything but ping / stats (monotonic)


class CacheServer:
    """The server loop; ``serve()`` runs until ``stop()`` (or SIGTERM under
    ``saria serve``), then flushes and closes every namespace's cache."""

    def __init__(self, cfg: ServerConfig, *, runtime_dir: str | None = None) -> None:
        self.cfg = cfg
        self.boot = secrets.token_hex(8)
        self.node = cfg.node or socket.gethostname()
        self.runtime_dir = runtime_dir or default_runtime_dir()
        folder = auth.ipc_dir(cfg.listen)
        if folder is not None:  # never a folder another user made or can change
            auth.secure_dir(folder, strict=cfg.listen == default_listen())
        self.tenants = Tenants.from_file(cfg.tenants)
        self.hellos = HelloRate(cfg.limits.hellos_per_s)
        self.loop_errors = 0
        self._ns_since: dict[str, float] = {}  # namespace -> since when no session uses it
        self.caches: dict[str, TieredCache] = {}
        self.remotes: dict[str, object] = {}  # namespace -> its RemoteTier (--remote)
        self.layouts: dict[str, dict] = {}
        self.pools: dict[str, str] = {}
        self.sessions: dict[str, Session] = {}
        self.fencing: dict[str, Session] = {}  # ended, a worker still mid-copy: slots kept
        self._next_spec = 1
        self._stop = threading.Event()
        self.metrics = ServerMetrics(self)
        self.ctx = zmq.Context()
        self.gate = auth.Gate(self.ctx, ipc=folder is not None, allow_uids=cfg.allow_uids,
                              client_keys=auth.load_allowlist(cfg.curve_clients)
                              if cfg.curve_clients else None, insecure_tcp=cfg.insecure_tcp)
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        # a bigger frame is dropped by libzmq as it arrives, before any allocation
        self.sock.setsockopt(zmq.MAXMSGSIZE, cfg.limits.max_frame or -1)
        self.sock.zap_domain = auth.DOMAIN
        if cfg.curve_secret is not None:
            self.sock.curve_publickey, self.sock.curve_secretkey = \
                auth.load_secret(cfg.curve_secret)
            self.sock.curve_server = True
        elif cfg.insecure_tcp and folder is None:
            log.warning("saria serve: %s is INSECURE (--insecure-tcp): anyone who reaches it "
                        "can read and poison the cache", cfg.listen)
        old = os.umask(0o077)  # an ipc:// socket file is created owner-only (0600)
        try:
            self.sock.bind(cfg.listen)
        finally:
            os.umask(old)
        self.address = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.publisher = None
        if cfg.events:
            self.publisher = EventPublisher(cfg.events, self.ctx)
            log.info("saria serve: KV events on %s as node %r", self.publisher.address,
                     self.node)
        removed = remove_stale_pools()
        if removed:
            log.info("saria serve: removed %d pool file(s) of servers no longer running: %s",
                     len(removed), ", ".join(removed))
        self._ops = {
            "hello": self._hello, "ping": self._ping, "bye": self._bye, "stats": self._stats,
            "lookup": self._lookup, "touch": self._touch,
            "prepare_load": self._prepare_load, "complete_load": self._complete_load,
            "cancel_load": self._cancel_load, "prepare_store": self._prepare_store,
            "prepare_promotion": self._prepare_promotion, "complete_store": self._complete_store,
            "take_staging": self._take_staging, "release_staging": self._release_staging,
            "write_direct": self._write_direct, "cancel": self._cancel,
            "gauges": self._gauges, "flush": self._flush,
        }
        log.info("saria serve: listening on %s (boot %s, lease %.1f s)", self.address, self.boot,
                 cfg.lease_s)
        log.info("saria serve: DRAM %d B over at most %d model(s)", cfg.dram_bytes, cfg.max_models)
        if cfg.ssd_dirs and cfg.ssd_bytes:
            for d in cfg.ssd_dirs:
                log.info("saria serve: SSD %s, %d B, admission %s", d, cfg.ssd_bytes, cfg.admission)
        else:
            log.info("saria serve: SSD off")
        if cfg.metrics_port is not None:
            self.metrics.serve(cfg.metrics_port, cfg.metrics_host)
        self._delays = _test_delays()

    # ------------------------------------------------------------ the loop

    def serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                if poller.poll(timeout=100):
                    while not self._stop.is_set():  # a busy socket must not hold off a stop
                        try:
                            frames = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        self._guarded(self._handle, frames)
                self._guarded(self._expire, time.monotonic())
                self._guarded(self._retry_fences)
                self._guarded(self._publish)
        finally:
            self.close()

    def stop(self) -> None:
        self._stop.set()

    def _guarded(self, fn, *args) -> None:
        """No exception leaves the loop: one client's request, a lease's end
        or a publish that fails is logged and counted, and the loop goes on."""
        try:
            fn(*args)
        except Exception:
            self.loop_errors += 1
            log.exception("saria serve: %s failed (the server goes on)", fn.__name__)

    def close(self) -> None:
        # The clients' socket first: their calls fail at once on the closed
        # connection (saria.serve.link) instead of waiting out their deadline
        # while the caches flush.
        self.sock.close(0)
        for ns, cache in self.caches.items():
            try:
                cache.flush()
                for line in stop_summary({ns: cache}):  # what the next start finds
                    log.info(line)
            finally:
                cache.close()
        for tier in self.remotes.values():
            tier.close()
        self.remotes.clear()
        fences = [s.fence for s in [*self.sessions.values(), *self.fencing.values()]]
        for path in [*self.pools.values(), *fences]:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self._publish()  # what the flush moved
        self.caches.clear()
        if self.publisher is not None:
            self.publisher.close()
        self.metrics.close()
        self.gate.close()
        self.ctx.term()

    def _publish(self) -> None:
        """Each namespace's residency changes since the last call, one batch."""
        if self.publisher is None:
            return
        for ns, cache in self.caches.items():
            layout = self.layouts.get(ns)
            if layout is None:
                continue
            events = to_wire(cache.take_events(), block_size=layout["block_size"],
                             digest=layout["digest"])
            self.publisher.publish(wire.topic(self.node, layout["model"]), events)

    def _handle(self, frames: list[zmq.Frame]) -> None:
        if len(frames) < 2:
            return  # not a DEALER's message: nothing to answer
        ident, frame = frames[0].bytes, frames[-1]
        peer = frame.get("User-Id") or ""  # the gate's name for the peer
        proc = auth.process_of(frame, ident)
        t0 = time.perf_counter()
        op, rid = "?", 0
        try:
            rid, op, sid, args = P.request(frame.bytes, self.cfg.limits.max_frame)
            reply = {"id": rid, "ok": True, "result": self._call(op, sid, args, peer, proc)}
        except P.RemoteError as e:
            reply = {"id": getattr(e, "rid", rid), "ok": False, "code": e.code,
                     "error": e.detail}
        except P.ProtocolError as e:
            reply = {"id": getattr(e, "rid", rid), "ok": False, "code": "protocol",
                     "error": str(e)}
        except SariaError as e:
            reply = {"id": rid, "ok": False, "code": "config", "error": str(e)}
        except Exception as e:  # a bug must not take every engine's cache down with it
            log.exception("saria serve: %s failed", op)
            reply = {"id": rid, "ok": False, "code": "internal",
                     "error": f"{type(e).__name__}: {e}"}
        reply["boot"] = self.boot
        if op in self._delays:
            self._test_delay(op)
        self.metrics.rpc(op if op in self._ops or op == "batch" else "?",
                         time.perf_counter() - t0, reply["ok"])
        try:
            out = P.pack(reply)
        except Exception as e:  # a result that does not encode is a bug; say so, one line
            log.exception("saria serve: the reply to %s does not encode", op)
            out = P.pack({"id": rid, "ok": False, "code": "internal", "boot": self.boot,
                          "error": f"reply does not encode: {type(e).__name__}"})
        try:
            self.sock.send_multipart([ident, out], zmq.NOBLOCK)
        except zmq.Again:
            pass  # the client is gone or not reading; its lease will expire

    def _batch(self, sid: str | None, args: dict, peer: str) -> list[dict]:
        """Plain calls in order, one result each; a saria error is that call's
        result, anything that escapes (a bug, a malformed call) undoes what
        the earlier calls prepared before the error reply goes out."""
        calls = P.arg(args, "calls", list)
        s = self.sessions.get(sid) if sid is not None else None
        if s is not None and s.peer != peer:
            s = None  # not this peer's session: _call refuses each sub-call
        before = self._held(s)
        out = []
        try:
            for call in calls:
                if not (isinstance(call, list) and len(call) == 2 and isinstance(call[0], str)
                        and isinstance(call[1], dict)) or call[0] in ("batch", "hello"):
                    raise P.ProtocolError("a batch holds [op, args] pairs of plain calls")
                try:
                    out.append({"ok": True, "result": self._call(call[0], sid, call[1], peer)})
                except (P.RemoteError, P.ProtocolError, SariaError) as e:
                    out.append({"ok": False, "code": getattr(e, "code", "protocol"),
                                "error": str(e)})
        except BaseException:
            if s is not None and s.sid in self.sessions:
                for rid in self._held(s) - before:
                    self._drop_spec(s, rid)
            raise
        return out

    def _call(self, op: str, sid: str | None, args: dict, peer: str = "", proc: str = ""):
        if op == "batch":
            return self._batch(sid, args, peer)
        fn = self._ops.get(op)
        if fn is None:
            raise P.ProtocolError(f"unknown op {op!r}")
        if op == "hello":
            return fn(args, peer, proc)
        if op == "stats" and sid is None:
            return fn(None, args, peer)
        if sid is None:
            raise P.RemoteError("session", f"{op} needs a session: say hello first")
        s = self.sessions.get(sid)
        if s is None or s.peer != peer:  # a session is its peer's alone
            raise P.RemoteError("session", "unknown or expired session: say hello again")
        now = time.monotonic()
        s.expires = now + self.cfg.lease_s
        if op not in ("ping", "stats"):
            s.worked = now
        return fn(s, args)

    # ---------------------------------------------------------- sessions

    def _hello(self, args: dict, peer: str = "", proc: str = ""):
        self.hellos.check(proc or peer or "?")  # every hello counts, good or bad
        layout = P.arg(args, "layout", dict)
        # every check before anything is registered: a refused hello changes nothing
        check_layout(layout, self.cfg.limits, self.cfg.dram_bytes // self.cfg.max_models)
        engine = P.arg(args, "name", str, "engine")
        pid = P.arg(args, "pid", int, 0)
        self._check_sessions(peer, proc)
        slot_bytes = layout["slot_bytes"]
        ns = namespace_of(layout)
        cache = self.caches.get(ns) or self._open(ns, slot_bytes, layout)
        sid = secrets.token_hex(12)
        tenant = self.tenants.tenant_of(peer)
        if tenant:
            engine = f"{tenant}/{engine}"  # figures are kept, and shown, per tenant
        now = time.monotonic()
        s = Session(sid, ns, engine, pid, now + self.cfg.lease_s, peer=peer, proc=proc,
                    tenant=tenant, space=self.tenants.space(tenant), worked=now)
        s.fence = F.create(f"{self.pools[ns]}-fence-{sid}")
        self.sessions[sid] = s
        log.info("saria serve: session %s for %s (pid %d, DP %s, TP %s) in namespace %s",
                 sid[:8], engine, s.pid, args.get("dp_rank"), args.get("tp_rank"), ns)
        pool = cache.backend.pool
        return {"session": sid, "boot": self.boot, "namespace": ns, "lease_s": self.cfg.lease_s,
                "pool": self.pools[ns], "pool_slots": pool.num_slots,
                "slot_bytes": pool.slot_bytes, "staging_slots": cache.backend.staging_slots,
                "fence": s.fence,
                "ssd_dirs": list(self._store_dirs(ns))}

    def _check_sessions(self, peer: str, proc: str) -> None:
        """Refuses a hello over a session cap, after making room where a cap
        is full of other processes' idle sessions (``_make_room``). A process
        at its own cap is refused: nothing of another's is taken for it."""
        lim = self.cfg.limits
        mine = sum(s.proc == proc for s in self.sessions.values())
        if lim.sessions_per_process and mine >= lim.sessions_per_process:
            raise QuotaError(f"this client process ({proc}) holds {mine} sessions, the most one "
                             "process may (--max-sessions-per-process)")
        if lim.sessions_per_peer:
            ours = [s for s in self.sessions.values() if s.peer == peer]
            if len(ours) >= lim.sessions_per_peer and not self._make_room(ours, proc):
                raise QuotaError(f"{peer or 'this peer'} holds {len(ours)} sessions, the most "
                                 "one peer may (--max-sessions-per-peer), none of them idle")
        if lim.sessions:
            every = list(self.sessions.values())
            if len(every) >= lim.sessions and not self._make_room(every, proc):
                raise QuotaError(f"this server holds at most {lim.sessions} sessions "
                                 "(--max-sessions), none of them idle")

    def _make_room(self, full: list[Session], proc: str) -> bool:
        """Ends one idle session of `full` (a full cap) for a hello from
        `proc`: of the process holding the most, and only if it holds more
        than `proc` does, its longest idle. Idle: nothing held (no spec, no
        staging slot) and no call but ping / stats for ``REAP_IDLE_S``. Its
        client, if it is still there, says hello again on its next call
        (``RemoteCache``), like after a lease that ran out."""
        now = time.monotonic()
        count: dict[str, int] = {}
        for s in full:
            count[s.proc] = count.get(s.proc, 0) + 1
        idle = [s for s in full if now - s.worked >= REAP_IDLE_S and not s.held
                and not s.staging and count[s.proc] > count.get(proc, 0) + 1]
        if not idle:
            return False
        victim = min(idle, key=lambda s: (-count[s.proc], s.worked))
        log.warning("saria serve: ended idle session %s (%s, %s, %d sessions) to let %s say "
                    "hello at a full session cap", victim.sid[:8], victim.engine, victim.proc,
                    count[victim.proc], proc)
        self.metrics.reaped += 1
        self._end(victim)
        return True

    def _store_dirs(self, ns: str) -> tuple[str, ...]:
        if not (self.cfg.ssd_dirs and self.cfg.ssd_bytes):
            return ()
        return tuple(os.path.join(d, f"saria-{ns}") for d in self.cfg.ssd_dirs)

    def _open(self, ns: str, slot_bytes: int, layout: dict) -> TieredCache:
        if len(self.caches) >= self.cfg.max_models:
            raise P.RemoteError("config", f"this server holds at most {self.cfg.max_models} "
                                f"model layout(s) (--max-models); {layout['model']!r} is one more")
        dram = self.cfg.dram_bytes // self.cfg.max_models
        if dram < slot_bytes:
            raise P.RemoteError("config", f"--dram / --max-models ({dram} B) cannot hold one "
                                f"block of {slot_bytes} B")
        dirs = self._store_dirs(ns)
        for d in dirs:
            os.makedirs(d, exist_ok=True)
        slots = dram // slot_bytes
        staging = 0
        if dirs and make_admission(self.cfg.admission).writes_on_create and slots > 1:
            staging = max(1, slots // 8)  # write-through of blocks DRAM does not keep
        pool = os.path.join(POOL_DIR, f"{_pool_prefix()}{os.getpid()}-{self.boot}-{ns}")
        remote = self._remote_tier(ns, slot_bytes)
        try:
            cache = TieredCache(CacheConfig(
                block_bytes=slot_bytes, dram_bytes=dram, ssd_dirs=dirs,
                ssd_bytes=self.cfg.ssd_bytes // self.cfg.max_models if dirs else 0,
                admission=self.cfg.admission, promotion=self.cfg.promotion, dwpd=self.cfg.dwpd,
                shared_pool=pool, staging_slots=staging, pin=self.cfg.pin,
                events=self.publisher is not None,
                ssd_scrub_bytes_per_s=self.cfg.scrub_bytes_per_s,
                ssd_parts=layout["tp_size"]),  # each rank's worker reads its part of a block
                remote=remote)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(pool)
            if remote is not None:
                remote.close()
            raise
        if remote is not None:
            self.remotes[ns] = remote
        os.chmod(pool, 0o600)
        # the layout entry first: a namespace in `caches` always has one (the publisher reads it)
        self.layouts[ns] = {"model": layout["model"], "block_size": layout["block_size"],
                            "digest": _digest(layout)}
        self.pools[ns] = pool
        self.caches[ns] = cache
        if self.publisher is not None:  # an indexer drops what it knew of this node
            self.publisher.publish(wire.topic(self.node, self.layouts[ns]["model"]),
                                   [wire.Cleared()])
        g = cache.gauges()
        log.info("saria serve: namespace %s (%s): DRAM %d slots of %d B, SSD %s (%d blocks "
                 "recovered)", ns, layout["model"], g["dram_slots"], slot_bytes,
                 ", ".join(dirs) or "off", g["ssd_recovered_unadopted"])
        return cache

    def _remote_tier(self, ns: str, slot_bytes: int):
        """The namespace's client of the cluster tier (``--remote``), or None."""
        if self.cfg.remote is None:
            return None
        from saria.tiers.remote import RemoteSettings, RemoteSetupError, RemoteTier

        settings = RemoteSettings.from_mapping(self.cfg.remote)
        try:
            tier = RemoteTier(settings, ns, slot_bytes)
        except RemoteSetupError as e:
            raise P.RemoteError("config", str(e)) from None
        log.info("saria serve: namespace %s: cluster tier at %s (segment %d B, deadline %g s)",
                 ns, settings.master, settings.segment_bytes, settings.deadline_s)
        return tier

    def _ping(self, s: Session, args: dict):
        return {"lease_s": self.cfg.lease_s}

    def _bye(self, s: Session, args: dict):
        self._end(s)
        return True

    def _expire(self, now: float) -> None:
        age = self.cfg.limits.spec_age_s
        for s in list(self.sessions.values()):
            if age and s.expires >= now:
                self._end_old_specs(s, now - age)
        for s in [s for s in self.sessions.values() if s.expires < now]:
            log.warning("saria serve: lease of session %s (%s, pid %d) expired: releasing "
                        "%d loads, %d stores, %d staging slots", s.sid[:8], s.engine, s.pid,
                        len(s.loads), len(s.stores), len(s.staging))
            self.metrics.expired += 1
            self._end(s)
        self._close_idle(now)

    def _close_idle(self, now: float) -> None:
        """Closes a namespace no session has used for --namespace-idle
        seconds (flushed; its SSD blocks are recovered if it opens again), so
        a layout nobody serves does not keep a --max-models place forever."""
        idle = self.cfg.limits.namespace_idle_s
        if not idle:
            return
        # a session still being fenced holds slots a worker may be writing
        used = {s.namespace for s in [*self.sessions.values(), *self.fencing.values()]}
        for ns in list(self.caches):
            if ns in used or ns not in self._ns_since:
                self._ns_since[ns] = now
            elif now - self._ns_since[ns] >= idle:
                log.info("saria serve: namespace %s (%s) idle for %g s: closing it", ns,
                         self.layouts[ns]["model"], idle)
                self._publish()  # what it holds is announced before it goes
                cache = self.caches.pop(ns)
                self.layouts.pop(ns)
                self._ns_since.pop(ns)
                try:
                    cache.flush()
                finally:
                    cache.close()
                    tier = self.remotes.pop(ns, None)
                    if tier is not None:
                        tier.close()
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self.pools.pop(ns))
                self.metrics.namespaces_closed += 1

    def _end_old_specs(self, s: Session, before: float) -> None:
        """Ends the specs `s` prepared before `before` (--max-lock-age): a
        session's heartbeat keeps the session, never a lock, alive."""
        for sid in [sid for sid, t in s.held.items() if t < before]:
            self._drop_spec(s, sid)
            self.metrics.specs_aged += 1
            log.warning("saria serve: spec %d of session %s (%s) held past --max-lock-age "
                        "(%g s): ended", sid, s.sid[:8], s.engine, self.cfg.limits.spec_age_s)

    def _end(self, s: Session) -> None:
        """Ends a session: nothing of it is reused before its workers are
        fenced (``saria.serve.fence``); until then its slots stay held."""
        self.sessions.pop(s.sid, None)
        if not F.fence(s.fence):
            log.warning("saria serve: session %s (%s, pid %d) ended while a worker of it is "
                        "copying: its %d stores, %d loads and %d staging slots stay held until "
                        "the copy is over", s.sid[:8], s.engine, s.pid, len(s.stores),
                        len(s.loads), len(s.staging))
            self.fencing[s.sid] = s
            return
        self._release(s)

    def _retry_fences(self) -> None:
        for s in [s for s in self.fencing.values() if F.fence(s.fence)]:
            del self.fencing[s.sid]
            log.info("saria serve: session %s fenced: its slots are free", s.sid[:8])
            self._release(s)

    def _release(self, s: Session) -> None:
        cache = self.caches[s.namespace]
        for spec in s.loads.values():
            cache.cancel_load(spec)
        for spec in s.stores.values():
            cache.complete_store(spec, success=False)
        if s.staging:
            cache.release_staging(np.fromiter(s.staging, np.int64))

    def _stats(self, s: Session | None, args: dict, peer: str = ""):
        """The node's figures for its own tenant (the server's uid over IPC);
        any other tenant sees, inside its session, its own engines only."""
        tenant = s.tenant if s is not None else self.tenants.tenant_of(peer)
        if s is None and tenant:
            raise P.RemoteError("session", "stats needs a session for a tenant: say hello first")
        return self.metrics.snapshot(tenant or None)

    # --------------------------------------------------------------- verbs

    def _cache(self, s: Session) -> TieredCache:
        return self.caches[s.namespace]

    @staticmethod
    def _keys(s: Session, args: dict, name: str = "keys") -> np.ndarray:
        """A key argument, in the session's tenant's key space."""
        return map_keys(s.space, P.keys_arg(args, name))

    def _room_for_spec(self, s: Session) -> None:
        """Refuses a prepare before it locks anything when the session, or
        its process over all its sessions, holds its most specs (--max-specs)."""
        lim = self.cfg.limits.specs_per_session
        if lim and len(s.held) >= lim:
            raise QuotaError(f"this session holds {len(s.held)} loads and stores, the most one "
                             "may (--max-specs)")
        ours = sum(len(x.held) for x in self._of_process(s))
        if lim and ours >= lim:
            raise QuotaError(f"this client process ({s.proc}) holds {ours} loads and stores "
                             "over its sessions, the most one may (--max-specs)")

    def _of_process(self, s: Session) -> list[Session]:
        """The open sessions of `s`'s client process, `s` among them."""
        return [x for x in self.sessions.values() if x.proc == s.proc]

    @staticmethod
    def _hold(s: Session, table: dict, spec, sid: int) -> int:
        """Registers a prepared spec under its claimed id, with its age."""
        table[sid] = spec
        s.held[sid] = time.monotonic()
        return sid

    def _lookup(self, s: Session, args: dict):
        plan = self._cache(s).lookup(self._keys(s, args))
        self.metrics.lookup(s, plan)
        return {"num_blocks": plan.num_blocks}

    def _touch(self, s: Session, args: dict):
        keys = self._keys(s, args)
        hits, at = P.arg(args, "hits", int), P.arg(args, "checkpoint_at", int, 0)
        if not (0 <= hits <= keys.shape[0] and 0 <= at <= keys.shape[0]):
            raise P.ProtocolError("touch: 'hits' and 'checkpoint_at' must lie in [0, len(keys)]")
        return self._cache(s).touch(keys, hits=hits, checkpoint_at=at)

    def _spec_id(self) -> int:
        self._next_spec += 1
        return self._next_spec

    def _claim(self, s: Session, args: dict) -> int:
        """A prepare's spec id, checked before the cache holds anything for it."""
        return s.ids.claim(args, self._held(s), self._spec_id)

    @staticmethod
    def _held(s: Session | None) -> set[int]:
        """The ids under which a session holds something."""
        return set() if s is None else set(s.loads) | set(s.stores) | set(s.takes)

    def _drop_spec(self, s: Session, rid: int) -> str | None:
        """Ends what `rid` holds in session `s`: a load is cancelled, a store
        failed (its slots freed), a take's staging slots released."""
        cache = self._cache(s)
        s.held.pop(rid, None)
        if (load := s.loads.pop(rid, None)) is not None:
            cache.cancel_load(load)
            return "load"
        if (spec := s.stores.pop(rid, None)) is not None:
            cache.complete_store(spec, success=False)
            return "store"
        if (slots := s.takes.pop(rid, None)) is not None:
            mine = slots & s.staging
            s.staging -= mine
            if mine:
                cache.release_staging(np.fromiter(mine, np.int64))
            return "staging"
        return None

    def _cancel(self, s: Session, args: dict):
        """Idempotent: ends what the id holds, or leaves a tombstone for a
        prepare still on its way; returns what it ended (or "tombstone")."""
        rid = P.arg(args, "spec", int)
        ended = self._drop_spec(s, rid)
        if ended is None:
            s.ids.bury(rid)
            return "tombstone"
        return ended

    def _test_delay(self, op: str) -> None:
        """Fault injection for tests (``SARIA_SERVE_TEST_DELAY``): the loop
        stalls after handling `op`, before its reply goes out."""
        seconds, left = self._delays[op]
        if left <= 1:
            del self._delays[op]
        else:
            self._delays[op] = (seconds, left - 1)
        time.sleep(seconds)

    def _prepare_load(self, s: Session, args: dict):
        keys = self._keys(s, args)
        blocks, start = P.arg(args, "blocks", int), P.arg(args, "start", int, 0)
        if not 0 <= start <= blocks <= keys.shape[0]:
            raise P.ProtocolError(f"prepare_load: need 0 <= start <= blocks <= {keys.shape[0]}")
        self._room_for_spec(s)
        sid = self._claim(s, args)
        spec = self._cache(s).prepare_load(keys, blocks, start=start)
        self._hold(s, s.loads, spec, sid)
        return {"spec": sid, "num_blocks": spec.num_blocks, "start": spec.start,
                "tiers": spec.tiers, "slots": spec.slots}

    def _complete_load(self, s: Session, args: dict):
        failed = P.arg(args, "failed", (np.ndarray, type(None)), None)
        spec = self._peek(s.loads, args)
        if failed is not None and (failed.ndim != 1 or failed.dtype.kind not in "iu" or (
                failed.size and (failed.min() < spec.start or failed.max() >= spec.num_blocks))):
            raise P.ProtocolError("complete_load: 'failed' must list positions the load read")
        spec = self._take(s.loads, args, s)
        served = self._cache(s).complete_load(
            spec, None if failed is None else failed.astype(np.int64))
        self.metrics.served(s, spec, served)
        return served

    def _cancel_load(self, s: Session, args: dict):
        self._cache(s).cancel_load(self._take(s.loads, args, s))
        return True

    def _store_reply(self, s: Session, spec: StoreSpec, sid: int):
        if spec.num_blocks == 0:
            # nothing to copy: a client never completes such a spec (the connector
            # skips it, as in-process), so it is ended here rather than held --
            # held, it would count against --max-specs until --max-lock-age
            self._cache(s).complete_store(spec, success=False)
        else:
            self._hold(s, s.stores, spec, sid)
        return {"spec": sid, "positions": spec.positions, "slots": spec.slots,
                "direct": spec.direct, "promotion": spec.promotion}

    def _prepare_store(self, s: Session, args: dict):
        keys = self._keys(s, args)
        start = P.arg(args, "start", int, 0)
        if not 0 <= start <= keys.shape[0]:
            raise P.ProtocolError("prepare_store: 'start' out of range")
        tag, direct = P.arg(args, "tag", int, 0), P.arg(args, "direct", bool, False)
        self._room_for_spec(s)
        sid = self._claim(s, args)
        spec = self._cache(s).prepare_store(keys, start, session=tag, direct=direct)
        # blocks DRAM could not take go to the SSD through the client's
        # staging copies (write_direct), as in the in-process connector
        direct, spec.direct = spec.direct, spec.direct[:0]
        reply = self._store_reply(s, spec, sid)
        reply["direct"] = direct
        return reply

    def _prepare_promotion(self, s: Session, args: dict):
        keys = self._keys(s, args)
        pos = P.arg(args, "ssd_positions", np.ndarray)
        if pos.ndim != 1 or pos.dtype.kind not in "iu" or (pos.size and (
                pos.min() < 0 or pos.max() >= keys.shape[0])):
            raise P.ProtocolError("prepare_promotion: 'ssd_positions' must index 'keys'")
        dram_blocks = P.arg(args, "dram_blocks", int)
        self._room_for_spec(s)
        sid = self._claim(s, args)
        spec = self._cache(s).prepare_promotion(keys, pos.astype(np.int64), dram_blocks)
        return self._store_reply(s, spec, sid)

    def _complete_store(self, s: Session, args: dict):
        success = P.arg(args, "success", bool, True)
        spec = self._take(s.stores, args, s)
        return self._cache(s).complete_store(spec, success=success)

    def _write_direct(self, s: Session, args: dict):
        chain = self._keys(s, args, "chain")
        pos = P.arg(args, "positions", np.ndarray)
        staging = P.arg(args, "slots", np.ndarray)
        if pos.ndim != 1 or pos.dtype.kind not in "iu" or staging.shape != pos.shape or \
                (pos.size and (pos.min() < 0 or pos.max() >= chain.shape[0])):
            raise P.ProtocolError("write_direct: 'positions' must index 'chain', one slot each")
        if not {int(x) for x in staging} <= s.staging:
            raise P.ProtocolError("write_direct: slots this session does not hold")
        return self._cache(s).write_direct(chain, pos.astype(np.int64), staging.astype(np.int64))

    def _take_staging(self, s: Session, args: dict):
        count = P.arg(args, "count", int)
        if count < 0:
            raise P.ProtocolError("take_staging: 'count' must not be negative")
        # up to `count`, as in-process -- but never more than the session's share
        share = max(1, int(self.cfg.limits.staging_per_session
                           * self._cache(s).backend.staging_slots))
        ours = sum(len(x.staging) for x in self._of_process(s))  # a process's sessions share it
        if count and ours >= share:
            raise QuotaError(f"take_staging: this client process holds {ours} staging slots, "
                             "its whole share (--max-staging-share)")
        count = min(count, share - ours)
        rid = self._claim(s, args) if "rid" in args else None
        slots = self._cache(s).take_staging(count)
        s.staging.update(int(x) for x in slots)
        if rid is not None and slots.size:
            s.takes[rid] = {int(x) for x in slots}  # until released, cancellable by id
        return slots

    def _release_staging(self, s: Session, args: dict):
        slots = P.arg(args, "slots", np.ndarray)
        mine = [int(x) for x in slots if int(x) in s.staging]
        if len(mine) != slots.size:
            raise P.ProtocolError("release_staging: slots this session does not hold")
        s.staging.difference_update(mine)
        for rid in [r for r, held in s.takes.items() if not held.isdisjoint(mine)]:
            s.takes[rid].difference_update(mine)
            if not s.takes[rid]:
                del s.takes[rid]
        self._cache(s).release_staging(np.asarray(mine, np.int64))
        return True

    def _gauges(self, s: Session, args: dict):
        return {k: float(v) for k, v in self._cache(s).gauges().items()}

    def _flush(self, s: Session, args: dict):
        self._cache(s).flush()
        return True

    @staticmethod
    def _peek(table: dict, args: dict):
        spec = table.get(P.arg(args, "spec", int))
        if spec is None:
            raise P.RemoteError("session", "no such spec in this session (completed, "
                                "cancelled, or expired with its lease)")
        return spec

    @staticmethod
    def _take(table: dict, args: dict, s: Session | None = None):
        sid = P.arg(args, "spec", int)
        spec = table.pop(sid, None)
        if s is not None:
            s.held.pop(sid, None)
        if spec is None:
            raise P.RemoteError("session", "no such spec in this session (completed, "
                                "cancelled, or expired with its lease)")
        return spec


POOL_DIR = "/dev/shm"
#: a session that held nothing and called nothing but ping / stats for this
#: long may be ended to let another process say hello at a full session cap;
#: an engine between its hello and its first lookup is not idle yet
REAP_IDLE_S = 2.0


def _digest(layout: dict) -> int:
    try:
        return digest_bytes(str(layout["hash_algo"]))
    except (KeyError, ValueError):
        return 32


def _test_delays() -> dict[str, tuple[float, int]]:
    """``SARIA_SERVE_TEST_DELAY=op:seconds[:count],...``: fault injection for
    tests (a loop too busy to answer in time); unset in production."""
    out: dict[str, tuple[float, int]] = {}
    for part in filter(None, os.environ.get("SARIA_SERVE_TEST_DELAY", "").split(",")):
        op, seconds, *count = part.split(":")
        out[op] = (float(seconds), int(count[0]) if count else 1 << 30)
    if out:
        log.warning("saria serve: test fault injection on: %s", out)
    return out


def _pool_prefix() -> str:
    return f"saria-serve-{os.getuid()}-"


def remove_stale_pools() -> list[str]:
    """Pool files of this user's servers whose process is gone (a server
    killed with SIGKILL cannot remove its own): ``saria-serve-UID-PID-...``."""
    removed = []
    prefix = _pool_prefix()
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(POOL_DIR):
            if not name.startswith(prefix):
                continue
            pid = name[len(prefix):].split("-", 1)[0]
            if not pid.isdigit() or _alive(int(pid)):
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(POOL_DIR, name))
                removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run(cfg: ServerConfig) -> int:
    """``saria serve``'s body: serve until SIGTERM / SIGINT, then close cleanly."""
    from saria.serve.client import ServerUnavailable, server_stats

    try:  # an ipc bind would silently take the socket of a live server
        live = server_stats(cfg.listen, 0.3)
    except (ServerUnavailable, P.RemoteError, P.ProtocolError, ConfigError):
        live = None  # (a folder that is not ours: CacheServer refuses it, one line)
    if live is not None:
        raise ConfigError("listen", f"a saria serve already answers at {cfg.listen} "
                          f"(boot {live['boot']})")
    check(cfg)  # every SSD dir, the remote tier, the listen address: one line if bad
    server = CacheServer(cfg)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.stop())
    server.serve()
    log.info("saria serve: stopped")
    return 0
