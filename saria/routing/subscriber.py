"""A ZMQ SUB socket feeding a ``FleetIndex`` from live publishers."""

from __future__ import annotations

import threading

import zmq

from saria.routing.index import FleetIndex


class EventSubscriber:
    """Connects to publishers' PUB endpoints and applies what arrives, on a
    background thread (``start``) or on demand (``poll``). Reads of the index
    while the thread runs go through ``lock``.

    Keep it polled: ZMQ reconnects to a restarted publisher only while the
    socket is in use, and what a publisher sends before the reconnection (its
    ``AllBlocksCleared`` among it) is lost, as with any PUB/SUB."""

    def __init__(self, endpoints: list[str], index: FleetIndex | None = None, *,
                 topic: str = "", ctx: zmq.Context | None = None) -> None:
        self.index = index or FleetIndex()
        self.lock = threading.Lock()
        self._own_ctx = ctx is None
        self.ctx = ctx or zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt_string(zmq.SUBSCRIBE, topic)
        for e in endpoints:
            self.sock.connect(e)
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self, timeout_ms: int = 0) -> int:
        """Applies every message waiting (waiting up to `timeout_ms` for the
        first); returns how many."""
        n = 0
        while self.sock.poll(timeout_ms if n == 0 else 0):
            frames = self.sock.recv_multipart()
            n += 1
            if len(frames) != 3:
                self.errors += 1
                continue
            try:
                with self.lock:
                    self.index.ingest(*frames)
            except ValueError:
                self.errors += 1  # one bad payload must not stop the feed
        return n

    def start(self) -> EventSubscriber:
        def loop():
            while not self._stop.is_set():
                self.poll(100)
        self._thread = threading.Thread(target=loop, name="saria-events", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self.sock.close(0)
        if self._own_ctx:
            self.ctx.term()
