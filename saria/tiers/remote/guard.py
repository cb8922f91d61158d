"""Remote calls that never hold up the engine: a bounded lane and a breaker.

Mooncake's client blocks a call for its own timeouts (with the master killed,
every ``get`` waits ~4.3 s before it fails). The engine cannot wait that long
in a scheduler step, so every remote call runs through ``Guard.submit``:

* **Deadline.** The call runs on one of the lane's threads; the caller waits
  at most ``deadline_s`` and then takes a miss. The call itself goes on until
  Mooncake returns: the buffers it reads or writes stay in use until then
  (``Ticket.then`` runs the caller's release at the real end, never earlier).
* **Lane.** At most ``lane`` calls are in flight, late ones included; a call
  beyond that fails at once (``lane_full``) instead of queueing behind a dead
  master.
* **Breaker.** ``breaker_failures`` failures in a row (a timeout, or a call
  that raised ``RemoteUnavailable``: Mooncake's RPC or transfer failures)
  open it: calls then fail at once (``down``) for ``breaker_cooldown_s``,
  after which exactly one call goes through as a probe (half open); its
  success closes the breaker, its failure opens it again for another cooldown.

Outcomes are ``Outcome.reason``: ``ok``, ``timeout``, ``lane_full``,
``down``, ``unavailable`` (the call raised ``RemoteUnavailable``) or
``error`` (it raised anything else: a bug, counted and a miss).
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from saria.errors import SariaError

__all__ = ["Guard", "Ticket", "Outcome", "BreakerState", "RemoteUnavailable"]

log = logging.getLogger(__name__)


class RemoteUnavailable(SariaError, RuntimeError):
    """The cluster did not answer (RPC or transfer failure): counts against the breaker."""


class BreakerState(enum.IntEnum):
    CLOSED = 0      # calls go through
    OPEN = 1        # the tier is down: calls fail at once
    HALF_OPEN = 2   # one probe call is out


@dataclass(slots=True)
class Outcome:
    ok: bool
    reason: str
    value: Any = None
    seconds: float = 0.0


class Ticket:
    """One submitted call: ``wait()`` for its outcome within the deadline,
    ``then(fn)`` to run ``fn`` once the call has really ended (at once if it
    has, else on the lane's thread when it does)."""

    __slots__ = ("_lock", "_done", "_event", "_value", "_exc", "_after", "outcome", "_t0")

    def __init__(self, outcome: Outcome | None = None) -> None:
        self._lock = threading.Lock()
        self._event = threading.Event()
        self._done = outcome is not None
        self._value: Any = None
        self._exc: BaseException | None = None
        self._after: list[Callable[[], None]] = []
        self.outcome = outcome
        self._t0 = time.monotonic()
        if self._done:
            self._event.set()

    @property
    def done(self) -> bool:
        return self._done

    def _finish(self, value: Any, exc: BaseException | None) -> None:
        with self._lock:
            self._value, self._exc, self._done = value, exc, True
            after, self._after = self._after, []
        self._event.set()
        for fn in after:
            _run(fn)

    def then(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if not self._done:
                self._after.append(fn)
                return
        _run(fn)

    def wait_settled(self, timeout: float | None = None) -> bool:
        """Waits for the call's real end (tests, close)."""
        return self._event.wait(timeout)


def _run(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception:  # a release must not kill the lane's thread
        log.exception("remote tier: a release after a call failed")


class Guard:
    """Deadline, lane and breaker over one client (see the module docstring)."""

    def __init__(self, *, deadline_s: float, lane: int, breaker_failures: int,
                 breaker_cooldown_s: float, on_outcome: Callable[[str, Outcome], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.deadline_s = float(deadline_s)
        self.lane = int(lane)
        self.breaker_failures = int(breaker_failures)
        self.breaker_cooldown_s = float(breaker_cooldown_s)
        self._clock = clock
        self._on_outcome = on_outcome
        self._lock = threading.Lock()
        self._in_flight = 0
        self._state = BreakerState.CLOSED
        self._failures = 0          # in a row
        self._opened_at = 0.0
        self._probe_out = False
        self.transitions = 0        # breaker state changes, for stats
        self._pool = ThreadPoolExecutor(max_workers=self.lane, thread_name_prefix="saria-remote")
        self._closed = False

    # ------------------------------------------------------------ breaker

    @property
    def state(self) -> BreakerState:
        with self._lock:
            return self._state

    @property
    def down(self) -> bool:
        """The breaker is open and its cooldown not over: a call would be refused."""
        with self._lock:
            return self._closed or (self._state == BreakerState.OPEN and
                                    self._clock() - self._opened_at < self.breaker_cooldown_s)

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def _admit(self) -> tuple[str | None, bool]:
        """(refusal reason or None, whether this call is the probe); under the lock."""
        if self._closed:
            return "down", False
        if self._state == BreakerState.OPEN:
            if self._clock() - self._opened_at < self.breaker_cooldown_s:
                return "down", False
            if self._in_flight >= self.lane:  # late calls hold the lane: no room for a probe
                return "down", False
            self._set(BreakerState.HALF_OPEN)
        if self._state == BreakerState.HALF_OPEN:
            if self._probe_out:
                return "down", False
            if self._in_flight >= self.lane:
                return "lane_full", False
            self._probe_out = True
            return None, True
        if self._in_flight >= self.lane:
            return "lane_full", False
        return None, False

    def _set(self, state: BreakerState) -> None:
        if state != self._state:
            self._state = state
            self.transitions += 1
            log.warning("remote tier: breaker %s", state.name.lower())

    def _record(self, success: bool, probe: bool) -> None:
        with self._lock:
            if probe:
                self._probe_out = False
            if success:
                self._failures = 0
                if probe or self._state == BreakerState.HALF_OPEN:
                    self._set(BreakerState.CLOSED)
                return
            self._failures += 1
            if probe or self._failures >= self.breaker_failures:
                self._opened_at = self._clock()
                self._set(BreakerState.OPEN)

    # ------------------------------------------------------------ calls

    def submit(self, op: str, fn: Callable[[], Any], *, deadline_s: float | None = None,
               meanwhile: Callable[[], None] | None = None) -> Ticket:
        """Runs ``fn()`` on the lane and waits for it at most the deadline;
        the returned ticket holds the outcome (``ticket.outcome``).
        ``meanwhile`` runs on the caller's thread once the call is under way
        (work that overlaps the call's first round trip); the deadline counts
        from the start. It is not run when the call is refused."""
        with self._lock:
            refused, probe = self._admit()
            if refused is None:
                self._in_flight += 1
        if refused is not None:
            ticket = Ticket(Outcome(False, refused))
            self._report(op, ticket.outcome)
            return ticket
        ticket = Ticket()

        def work() -> None:
            value, exc = None, None
            try:
                value = fn()
            except BaseException as e:  # noqa: BLE001 -- reported through the outcome
                exc = e
            finally:
                with self._lock:
                    self._in_flight -= 1
            ticket._finish(value, exc)

        try:
            self._pool.submit(work)
        except RuntimeError:  # the pool shut down under us
            with self._lock:
                self._in_flight -= 1
                if probe:
                    self._probe_out = False
            ticket._finish(None, None)
            ticket.outcome = Outcome(False, "down")
            return ticket
        limit = self.deadline_s if deadline_s is None else deadline_s
        if meanwhile is not None:
            try:
                meanwhile()
            except BaseException:
                self._record(True, probe)  # the caller's fault, not the cluster's
                raise
        settled = ticket._event.wait(max(0.0, limit - (time.monotonic() - ticket._t0)))
        seconds = time.monotonic() - ticket._t0
        if not settled:
            outcome = Outcome(False, "timeout", seconds=seconds)
        elif ticket._exc is None:
            outcome = Outcome(True, "ok", ticket._value, seconds)
        elif isinstance(ticket._exc, RemoteUnavailable):
            outcome = Outcome(False, "unavailable", ticket._exc, seconds)
        else:
            log.error("remote tier: %s raised %r", op, ticket._exc)
            outcome = Outcome(False, "error", ticket._exc, seconds)
        self._record(outcome.ok or outcome.reason == "error", probe)
        ticket.outcome = outcome
        self._report(op, outcome)
        return ticket

    def _report(self, op: str, outcome: Outcome) -> None:
        if self._on_outcome is not None:
            self._on_outcome(op, outcome)

    def close(self, wait: bool = False) -> None:
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=wait)
