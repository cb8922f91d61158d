"""What one client may ask of ``saria serve``: the layout check and the quotas.

A server shared by several engines (and, with tenants, several owners) must
not let one client take what the others need. Every limit here is checked
before anything is registered or allocated, and a refusal is one line that
names the limit and the flag that sets it.

* ``check_layout``: a hello's layout, type by type and within the bounds of
  slot size and slot count, BEFORE a namespace is opened -- a layout that
  fails registers nothing (all or nothing).
* ``Limits``: sessions in all, per peer (uid or client key) and per client
  process, specs (locks) per session and their maximum age (a heartbeat does
  not extend it), staging slots per session and per process, hellos per
  second per process; a namespace closes when no session has used it for a
  while. A peer's engines share its uid, so every per-peer cap one process
  could fill alone is also kept per process, and a cap that is full gives
  way to a hello by ending the idle sessions of the process that holds the
  most (``CacheServer._make_room``): one greedy client cannot lock the next
  engine out.

Invariant: a check either passes and changes nothing, or raises a
``QuotaError`` / ``ProtocolError``; no check has a side effect on refusal.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from saria.errors import ConfigError
from saria.serve.protocol import ProtocolError, RemoteError

LAYOUT_FIELDS = ("model", "dtype", "block_size", "page_bytes", "num_layers", "tp_size",
                 "kv_layout", "hash_algo", "hash_seed", "slot_bytes")
_STR = ("model", "dtype", "kv_layout", "hash_algo")
_POSITIVE = ("block_size", "page_bytes", "num_layers", "tp_size", "slot_bytes")


class QuotaError(RemoteError):
    """A call refused by a limit; the text names it and its flag."""

    def __init__(self, message: str) -> None:
        super().__init__("quota", message)


@dataclass(frozen=True, slots=True)
class Limits:
    """The server's quotas (``saria serve --max-*``); 0 means no limit."""

    max_frame: int = 8 << 20           # --max-frame: bytes of one request
    sessions: int = 256                # --max-sessions: open sessions in all
    sessions_per_peer: int = 64        # --max-sessions-per-peer: per uid / client key
    sessions_per_process: int = 16     # --max-sessions-per-process: per client process
    specs_per_session: int = 4096      # --max-specs: loads + stores held by one session
    spec_age_s: float = 120.0          # --max-lock-age: a held spec is ended after this
    staging_per_session: float = 0.5   # --max-staging-share: of the namespace's staging slots
    hellos_per_s: float = 50.0         # --max-hello-rate: per process, over the last second
    min_slot_bytes: int = 4096         # --min-slot: a layout's smallest block
    max_slot_bytes: int = 256 << 20    # --max-slot: a layout's largest block
    max_slots: int = 4 << 20           # --max-slots: slots one namespace's pool may have
    namespace_idle_s: float = 600.0    # --namespace-idle: a namespace no session used closes

    def __post_init__(self) -> None:
        for name in ("max_frame", "sessions", "sessions_per_peer", "sessions_per_process",
                     "specs_per_session",
                     "min_slot_bytes", "max_slot_bytes", "max_slots"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(name, f"must be a non-negative integer, got {v!r}")
        if self.max_frame and self.max_frame < 4096:
            raise ConfigError("max_frame", f"must be at least 4096 B, got {self.max_frame}")
        if not 0 <= self.staging_per_session <= 1:
            raise ConfigError("max_staging_share", f"must lie in [0, 1], got "
                              f"{self.staging_per_session}")
        for name in ("spec_age_s", "hellos_per_s", "namespace_idle_s"):
            if not getattr(self, name) >= 0:
                raise ConfigError(name, f"must not be negative, got {getattr(self, name)}")


def check_layout(layout: dict, limits: Limits, dram_share: int) -> None:
    """Refuses a hello's layout that is malformed or out of bounds, before
    anything is registered; `dram_share` is the DRAM one namespace gets."""
    for k in LAYOUT_FIELDS:
        if k not in layout:
            raise ProtocolError(f"layout lacks {k!r}")
    for k in _STR:
        v = layout[k]
        if not isinstance(v, str) or not v or len(v) > 1024:
            raise ProtocolError(f"layout {k!r} must be a non-empty string, got {v!r:.80}")
    for k in _POSITIVE:
        v = layout[k]
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise ProtocolError(f"layout {k!r} must be a positive integer, got {v!r:.80}")
    seed = layout["hash_seed"]
    if isinstance(seed, bool) or not isinstance(seed, (str, int)):
        raise ProtocolError(f"layout 'hash_seed' must be a string or an integer, got {seed!r:.80}")
    slot, tp = layout["slot_bytes"], layout["tp_size"]
    if slot % tp:
        raise ProtocolError("layout 'tp_size' must divide 'slot_bytes'")
    if limits.min_slot_bytes and slot < limits.min_slot_bytes:
        raise QuotaError(f"a block of {slot} B is below this server's --min-slot "
                         f"({limits.min_slot_bytes} B)")
    if limits.max_slot_bytes and slot > limits.max_slot_bytes:
        raise QuotaError(f"a block of {slot} B exceeds this server's --max-slot "
                         f"({limits.max_slot_bytes} B)")
    if limits.max_slots and dram_share // slot > limits.max_slots:
        raise QuotaError(f"blocks of {slot} B would make {dram_share // slot} DRAM slots, more "
                         f"than this server's --max-slots ({limits.max_slots})")


class HelloRate:
    """Hellos per process over the last second (a sliding window): per
    process, not per uid, or one process's flood would refuse every other
    engine of its uid."""

    def __init__(self, per_s: float) -> None:
        self.per_s = per_s
        self._seen: dict[str, deque[float]] = {}

    def check(self, peer: str, now: float | None = None) -> None:
        if not self.per_s:
            return
        now = time.monotonic() if now is None else now
        q = self._seen.setdefault(peer, deque())
        while q and q[0] <= now - 1.0:
            q.popleft()
        if len(q) >= self.per_s:
            raise QuotaError(f"more than {self.per_s:g} hellos in one second from {peer} "
                             "(--max-hello-rate)")
        q.append(now)
        if len(self._seen) > 4096:  # forget peers that went quiet
            self._seen = {p: d for p, d in self._seen.items() if d and d[-1] > now - 1.0}
