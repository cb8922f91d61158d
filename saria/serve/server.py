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
alter a spec, and an id of another session is refused.

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
from saria.serve import protocol as P
from saria.serve.metrics import ServerMetrics
from saria.serve.publisher import EventPublisher, to_wire
from saria.serve.startup import check, stop_summary
from saria.serve.paths import default_listen, default_runtime_dir  # noqa: F401

log = logging.getLogger("saria.serve")

LAYOUT_FIELDS = ("model", "dtype", "block_size", "page_bytes", "num_layers", "tp_size",
                 "kv_layout", "hash_algo", "hash_seed", "slot_bytes")


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
    loads: dict[int, LoadSpec] = field(default_factory=dict)
    stores: dict[int, StoreSpec] = field(default_factory=dict)
    staging: set[int] = field(default_factory=set)


class CacheServer:
    """The server loop; ``serve()`` runs until ``stop()`` (or SIGTERM under
    ``saria serve``), then flushes and closes every namespace's cache."""

    def __init__(self, cfg: ServerConfig, *, runtime_dir: str | None = None) -> None:
        self.cfg = cfg
        self.boot = secrets.token_hex(8)
        self.node = cfg.node or socket.gethostname()
        self.runtime_dir = runtime_dir or default_runtime_dir()
        if cfg.listen.startswith("ipc://"):
            os.makedirs(os.path.dirname(cfg.listen[len("ipc://"):]) or ".", mode=0o700,
                        exist_ok=True)
        self.caches: dict[str, TieredCache] = {}
        self.remotes: dict[str, object] = {}  # namespace -> its RemoteTier (--remote)
        self.layouts: dict[str, dict] = {}
        self.pools: dict[str, str] = {}
        self.sessions: dict[str, Session] = {}
        self._next_spec = 1
        self._stop = threading.Event()
        self.metrics = ServerMetrics(self)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, P.MAX_FRAME)
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
            "write_direct": self._write_direct,
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
            self.metrics.serve(cfg.metrics_port)

    # ------------------------------------------------------------ the loop

    def serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                if poller.poll(timeout=100):
                    while True:
                        try:
                            frames = self.sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._handle(frames)
                self._expire(time.monotonic())
                self._publish()
        finally:
            self.close()

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
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
        for path in self.pools.values():
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self._publish()  # what the flush moved
        self.caches.clear()
        if self.publisher is not None:
            self.publisher.close()
        self.metrics.close()
        self.sock.close(0)
        self.ctx.term()

    def _publish(self) -> None:
        """Each namespace's residency changes since the last call, one batch."""
        if self.publisher is None:
            return
        for ns, cache in self.caches.items():
            layout = self.layouts[ns]
            events = to_wire(cache.take_events(), block_size=layout["block_size"],
                             digest=layout["digest"])
            self.publisher.publish(wire.topic(self.node, layout["model"]), events)

    def _handle(self, frames: list[bytes]) -> None:
        if len(frames) < 2:
            return  # not a DEALER's message: nothing to answer
        ident, frame = frames[0], frames[-1]
        t0 = time.perf_counter()
        op = "?"
        try:
            rid, op, sid, args = P.request(frame)
            reply = {"id": rid, "ok": True, "result": self._call(op, sid, args)}
        except P.RemoteError as e:
            reply = {"id": P.request_id(frame), "ok": False, "code": e.code, "error": str(e)}
        except P.ProtocolError as e:
            reply = {"id": P.request_id(frame), "ok": False, "code": "protocol", "error": str(e)}
        except SariaError as e:
            reply = {"id": P.request_id(frame), "ok": False, "code": "config", "error": str(e)}
        except Exception as e:  # a bug must not take every engine's cache down with it
            log.exception("saria serve: %s failed", op)
            reply = {"id": P.request_id(frame), "ok": False, "code": "internal",
                     "error": f"{type(e).__name__}: {e}"}
        reply["boot"] = self.boot
        self.metrics.rpc(op if op in self._ops or op == "batch" else "?",
                         time.perf_counter() - t0, reply["ok"])
        try:
            self.sock.send_multipart([ident, P.pack(reply)], zmq.NOBLOCK)
        except zmq.Again:
            pass  # the client is gone or not reading; its lease will expire

    def _call(self, op: str, sid: str | None, args: dict):
        if op == "batch":
            calls = P.arg(args, "calls", list)
            out = []
            for call in calls:
                if not (isinstance(call, list) and len(call) == 2 and isinstance(call[0], str)
                        and isinstance(call[1], dict)) or call[0] in ("batch", "hello"):
                    raise P.ProtocolError("a batch holds [op, args] pairs of plain calls")
                try:
                    out.append({"ok": True, "result": self._call(call[0], sid, call[1])})
                except (P.RemoteError, P.ProtocolError, SariaError) as e:
                    out.append({"ok": False, "code": getattr(e, "code", "protocol"),
                                "error": str(e)})
            return out
        fn = self._ops.get(op)
        if fn is None:
            raise P.ProtocolError(f"unknown op {op!r}")
        if op in ("hello", "stats"):
            return fn(args)
        if sid is None:
            raise P.RemoteError("session", f"{op} needs a session: say hello first")
        s = self.sessions.get(sid)
        if s is None:
            raise P.RemoteError("session", "unknown or expired session: say hello again")
        s.expires = time.monotonic() + self.cfg.lease_s
        return fn(s, args)

    # ---------------------------------------------------------- sessions

    def _hello(self, args: dict):
        layout = P.arg(args, "layout", dict)
        for k in LAYOUT_FIELDS:
            if k not in layout:
                raise P.ProtocolError(f"layout lacks {k!r}")
        slot_bytes = layout["slot_bytes"]
        if not isinstance(slot_bytes, int) or isinstance(slot_bytes, bool) or slot_bytes <= 0:
            raise P.ProtocolError("layout 'slot_bytes' must be a positive integer")
        tp = layout["tp_size"]
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1 or slot_bytes % tp:
            raise P.ProtocolError("layout 'tp_size' must be a positive integer dividing 'slot_bytes'")
        ns = namespace_of(layout)
        cache = self.caches.get(ns) or self._open(ns, slot_bytes, layout)
        sid = secrets.token_hex(12)
        engine = str(P.arg(args, "name", str, "engine"))
        s = Session(sid, ns, engine, int(P.arg(args, "pid", int, 0)),
                    time.monotonic() + self.cfg.lease_s)
        self.sessions[sid] = s
        log.info("saria serve: session %s for %s (pid %d, DP %s, TP %s) in namespace %s",
                 sid[:8], engine, s.pid, args.get("dp_rank"), args.get("tp_rank"), ns)
        pool = cache.backend.pool
        return {"session": sid, "boot": self.boot, "namespace": ns, "lease_s": self.cfg.lease_s,
                "pool": self.pools[ns], "pool_slots": pool.num_slots,
                "slot_bytes": pool.slot_bytes, "staging_slots": cache.backend.staging_slots,
                "ssd_dirs": list(self._store_dirs(ns))}

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
        self.pools[ns] = pool
        self.caches[ns] = cache
        self.layouts[ns] = {"model": str(layout["model"]), "block_size": int(layout["block_size"]),
                            "digest": _digest(layout)}
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
        for s in [s for s in self.sessions.values() if s.expires < now]:
            log.warning("saria serve: lease of session %s (%s, pid %d) expired: releasing "
                        "%d loads, %d stores, %d staging slots", s.sid[:8], s.engine, s.pid,
                        len(s.loads), len(s.stores), len(s.staging))
            self.metrics.expired += 1
            self._end(s)

    def _end(self, s: Session) -> None:
        cache = self.caches[s.namespace]
        for spec in s.loads.values():
            cache.cancel_load(spec)
        for spec in s.stores.values():
            cache.complete_store(spec, success=False)
        if s.staging:
            cache.release_staging(np.fromiter(s.staging, np.int64))
        self.sessions.pop(s.sid, None)

    def _stats(self, args: dict):
        return self.metrics.snapshot()

    # --------------------------------------------------------------- verbs

    def _cache(self, s: Session) -> TieredCache:
        return self.caches[s.namespace]

    def _lookup(self, s: Session, args: dict):
        plan = self._cache(s).lookup(P.keys_arg(args))
        self.metrics.lookup(s, plan)
        return {"num_blocks": plan.num_blocks}

    def _touch(self, s: Session, args: dict):
        keys = P.keys_arg(args)
        hits, at = P.arg(args, "hits", int), P.arg(args, "checkpoint_at", int, 0)
        if not (0 <= hits <= keys.shape[0] and 0 <= at <= keys.shape[0]):
            raise P.ProtocolError("touch: 'hits' and 'checkpoint_at' must lie in [0, len(keys)]")
        return self._cache(s).touch(keys, hits=hits, checkpoint_at=at)

    def _spec_id(self) -> int:
        self._next_spec += 1
        return self._next_spec

    def _prepare_load(self, s: Session, args: dict):
        keys = P.keys_arg(args)
        blocks, start = P.arg(args, "blocks", int), P.arg(args, "start", int, 0)
        if not 0 <= start <= blocks <= keys.shape[0]:
            raise P.ProtocolError(f"prepare_load: need 0 <= start <= blocks <= {keys.shape[0]}")
        spec = self._cache(s).prepare_load(keys, blocks, start=start)
        sid = self._spec_id()
        s.loads[sid] = spec
        return {"spec": sid, "num_blocks": spec.num_blocks, "start": spec.start,
                "tiers": spec.tiers, "slots": spec.slots}

    def _complete_load(self, s: Session, args: dict):
        failed = P.arg(args, "failed", (np.ndarray, type(None)), None)
        spec = self._peek(s.loads, args)
        if failed is not None and (failed.ndim != 1 or failed.dtype.kind not in "iu" or (
                failed.size and (failed.min() < spec.start or failed.max() >= spec.num_blocks))):
            raise P.ProtocolError("complete_load: 'failed' must list positions the load read")
        spec = self._take(s.loads, args)
        served = self._cache(s).complete_load(
            spec, None if failed is None else failed.astype(np.int64))
        self.metrics.served(s, spec, served)
        return served

    def _cancel_load(self, s: Session, args: dict):
        self._cache(s).cancel_load(self._take(s.loads, args))
        return True

    def _store_reply(self, s: Session, spec: StoreSpec):
        sid = self._spec_id()
        s.stores[sid] = spec
        return {"spec": sid, "positions": spec.positions, "slots": spec.slots,
                "direct": spec.direct, "promotion": spec.promotion}

    def _prepare_store(self, s: Session, args: dict):
        keys = P.keys_arg(args)
        start = P.arg(args, "start", int, 0)
        if not 0 <= start <= keys.shape[0]:
            raise P.ProtocolError("prepare_store: 'start' out of range")
        spec = self._cache(s).prepare_store(keys, start, session=P.arg(args, "tag", int, 0),
                                            direct=P.arg(args, "direct", bool, False))
        # blocks DRAM could not take go to the SSD through the client's
        # staging copies (write_direct), as in the in-process connector
        direct, spec.direct = spec.direct, spec.direct[:0]
        reply = self._store_reply(s, spec)
        reply["direct"] = direct
        return reply

    def _prepare_promotion(self, s: Session, args: dict):
        keys = P.keys_arg(args)
        pos = P.arg(args, "ssd_positions", np.ndarray)
        if pos.ndim != 1 or pos.dtype.kind not in "iu" or (pos.size and (
                pos.min() < 0 or pos.max() >= keys.shape[0])):
            raise P.ProtocolError("prepare_promotion: 'ssd_positions' must index 'keys'")
        spec = self._cache(s).prepare_promotion(keys, pos.astype(np.int64),
                                                P.arg(args, "dram_blocks", int))
        return self._store_reply(s, spec)

    def _complete_store(self, s: Session, args: dict):
        success = P.arg(args, "success", bool, True)
        spec = self._take(s.stores, args)
        return self._cache(s).complete_store(spec, success=success)

    def _write_direct(self, s: Session, args: dict):
        chain = P.keys_arg(args, "chain")
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
        slots = self._cache(s).take_staging(count)
        s.staging.update(int(x) for x in slots)
        return slots

    def _release_staging(self, s: Session, args: dict):
        slots = P.arg(args, "slots", np.ndarray)
        mine = [int(x) for x in slots if int(x) in s.staging]
        if len(mine) != slots.size:
            raise P.ProtocolError("release_staging: slots this session does not hold")
        s.staging.difference_update(mine)
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
    def _take(table: dict, args: dict):
        spec = table.pop(P.arg(args, "spec", int), None)
        if spec is None:
            raise P.RemoteError("session", "no such spec in this session (completed, "
                                "cancelled, or expired with its lease)")
        return spec


POOL_DIR = "/dev/shm"


def _digest(layout: dict) -> int:
    try:
        return digest_bytes(str(layout["hash_algo"]))
    except (KeyError, ValueError):
        return 32


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
    except (ServerUnavailable, P.RemoteError, P.ProtocolError):
        live = None
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
