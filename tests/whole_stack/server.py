"""A real ``saria serve`` (``CacheServer``) in a thread of the simulation.

The engines' schedulers talk to it over ZMQ (``ipc://`` in the run's folder)
through the real ``ServerCache``/``RemoteCache`` client, with a short
deadline. ``SimServer`` adds the faults, each a small override of the loop:

* ``paused``: the loop stops taking requests (a busy server: another
  engine's flush, a cluster lookup); calls made meanwhile miss their
  deadline, and the server carries them out when it resumes -- their
  replies reach nobody;
* ``drop_replies``: the next N replies are lost on the way;
* ``expire_all``: every session's lease runs out at the next turn of the loop;
* ``kill``: the process ends (no flush); a new server starts on the same
  socket and drives, and finds the journal's blocks.

Its SSD writes land at the simulation's ``land`` events (``write_mode="manual"``).
"""

from __future__ import annotations

import threading
import time

import numpy as np

import saria.serve.server as server_mod
from saria.index import Tier
from saria.serve.limits import Limits
from saria.serve.server import CacheServer, ServerConfig


class _DropSock:
    def __init__(self, sock, server: "SimServer") -> None:
        self._sock = sock
        self._server = server

    def send_multipart(self, frames, *a, **k):
        if self._server.drop_replies > 0:
            self._server.drop_replies -= 1
            return None
        return self._sock.send_multipart(frames, *a, **k)

    def __getattr__(self, name):
        return getattr(self._sock, name)


class SimServer(CacheServer):
    def __init__(self, cfg: ServerConfig, **kw) -> None:
        super().__init__(cfg, **kw)
        self.answering = threading.Event()
        self.answering.set()
        self.drop_replies = 0
        self.expire_all = False
        self.expire_engines: set[str] = set()   # sessions of engines that crashed
        self.handled = 0
        self.idle = threading.Event()

    def _open(self, *a, **k):
        real = server_mod.CacheConfig
        server_mod.CacheConfig = lambda **kw: real(**{**kw, "write_mode": "manual"})
        try:
            return super()._open(*a, **k)
        finally:
            server_mod.CacheConfig = real

    def _handle(self, frames) -> None:
        self.answering.wait()
        real = self.sock
        self.sock = _DropSock(real, self)
        try:
            super()._handle(frames)
        finally:
            self.sock = real
            self.handled += 1

    def _expire(self, now: float) -> None:
        if self.expire_all:
            self.expire_all = False
            now = time.monotonic() + self.cfg.lease_s + 1
        if self.expire_engines:  # a crashed engine's lease runs out (no heartbeat any more)
            for s in self.sessions.values():
                if s.engine in self.expire_engines:
                    s.expires = 0.0
        super()._expire(now)

    def crash(self) -> None:
        """Ends (at the loop's next turn) without the flush a clean stop does:
        what the writer had not landed is lost."""
        self.crashed = True
        self.stop()

    def close(self) -> None:
        if getattr(self, "crashed", False):
            for cache in self.caches.values():
                cache.close()
            self.caches.clear()
        super().close()


class ServerNode:
    """The server thread; ``start``/``kill``/``restart`` on one socket and drive."""

    def __init__(self, root: str, *, dram_bytes: int, ssd_bytes: int, admission: str,
                 max_models: int = 1, lease_s: float = 60.0) -> None:
        self.cfg = ServerConfig(listen=f"ipc://{root}/serve.sock", dram_bytes=dram_bytes,
                                ssd_dirs=(f"{root}/server-ssd",), ssd_bytes=ssd_bytes,
                                admission=admission, lease_s=lease_s, max_models=max_models,
                                # the sim's blocks are tiny and its engines restart often
                                limits=Limits(min_slot_bytes=0, hellos_per_s=0))
        self.root = root
        self.server: SimServer | None = None
        self.thread: threading.Thread | None = None
        self.address = self.cfg.listen

    @property
    def answering(self) -> bool:
        return self.server is not None and self.server.answering.is_set()

    def start(self) -> None:
        self.server = SimServer(self.cfg, runtime_dir=f"{self.root}/run")
        self.thread = threading.Thread(target=self._run, args=(self.server,), daemon=True,
                                       name="sim-serve")
        self.thread.start()

    def _run(self, srv: SimServer) -> None:
        srv.serve()

    def stop(self, *, crash: bool) -> None:
        srv, self.server = self.server, None
        if srv is None:
            return
        srv.answering.set()
        if crash:
            srv.crash()
        srv.stop()
        self.thread.join(30)

    def caches(self):
        return list(self.server.caches.values()) if self.server is not None else []

    def held_by_sessions(self) -> list[str]:
        """What live sessions still hold (after quiescence: nothing)."""
        out = []
        if self.server is None:
            return out
        for s in list(self.server.sessions.values()):
            if s.loads or s.stores or s.staging:
                out.append(f"session {s.engine}: {len(s.loads)} load specs, {len(s.stores)} "
                           f"store specs, {len(s.staging)} staging slots")
        return out

    def acknowledged_ssd(self) -> set[bytes]:
        out: set[bytes] = set()
        for c in self.caches():
            d = c.index.dump()
            on = (d["tiers"] & Tier.SSD.bit) != 0
            out |= {bytes(k) for k in d["keys"][on]}
        return out

    def recovered(self) -> set[bytes]:
        return {k for c in self.caches() for k in c.backend.recovered} | {
            bytes(k) for c in self.caches() for k in _ssd_keys(c)}


def _ssd_keys(cache) -> np.ndarray:
    d = cache.index.dump()
    return d["keys"][(d["tiers"] & Tier.SSD.bit) != 0]
