"""The client's breaker: a server that missed a deadline costs the engine
nothing more until it answers again.

Without it every call of an engine step waits out its deadline while the
server is down (a 30-token generation took 34 s instead of 0.3 s). The
cluster tier's ``saria.tiers.remote.guard`` does the same for Mooncake.

* **Open.** The first call that finds the server unreachable (no reply in
  its deadline, or a send that cannot go out) opens the breaker: from then
  on calls fail at once (``ServerUnavailable``), which the engine treats as
  a miss / a skipped store, with no message sent.
* **Probe.** A probe -- the client's heartbeat thread, or, in a client
  without one, the first call after the back-off -- asks the server with a
  short deadline; the back-off doubles from ``min_s`` to ``max_s``.
* **Close.** Any reply (even an error: the server is there) closes it.

It logs once when it opens and once when it closes (with what it skipped).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("saria.serve")


class Breaker:
    """Open / closed state with a probe back-off; thread-safe."""

    def __init__(self, address: str, *, min_s: float = 0.25, max_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.address = address
        self.min_s, self.max_s = float(min_s), float(max_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._opened_at: float | None = None
        self._backoff = self.min_s
        self._next_probe = 0.0
        self.opened = 0      # times it opened
        self.skipped = 0     # calls refused while open
        self._skipped_before = 0

    @property
    def is_open(self) -> bool:
        return self._opened_at is not None

    def trip(self, why: str) -> None:
        """A call found the server unreachable: open (logs once per opening)."""
        with self._lock:
            now = self._clock()
            if self._opened_at is None:
                self._opened_at = now
                self.opened += 1
                self._skipped_before = self.skipped
                self._backoff = self.min_s
                log.warning("saria: the cache server at %s is unreachable (%s); the engine "
                            "recomputes and skips stores until it answers again", self.address,
                            why)
            self._next_probe = now + self._backoff

    def refuse(self, *, may_probe: bool) -> bool:
        """Whether a call must fail at once: the breaker is open and the call
        may not be the probe (`may_probe`: the client has no probe thread
        and the back-off has passed -- then it goes out as the probe)."""
        with self._lock:
            if self._opened_at is None:
                return False
            if may_probe and self._clock() >= self._next_probe:
                return False
            self.skipped += 1
            return True

    def probe_due(self) -> bool:
        with self._lock:
            return self._opened_at is not None and self._clock() >= self._next_probe

    def seconds_to_probe(self) -> float | None:
        """Time until the next probe is due (None while closed)."""
        with self._lock:
            if self._opened_at is None:
                return None
            return max(0.0, self._next_probe - self._clock())

    def probe_failed(self) -> None:
        with self._lock:
            self._backoff = min(self._backoff * 2, self.max_s)
            self._next_probe = self._clock() + self._backoff

    def reset(self) -> None:
        """The server answered: close (logs once)."""
        with self._lock:
            if self._opened_at is None:
                return
            down = self._clock() - self._opened_at
            self._opened_at = None
            log.warning("saria: the cache server at %s answers again after %.1f s (%d calls "
                        "skipped meanwhile)", self.address, down,
                        self.skipped - self._skipped_before)
