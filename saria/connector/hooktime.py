"""What each connector hook costs vLLM's step, by hook and by kind of step.

Off by default (``hook_timing: true`` in the connector's settings turns it
on): then every hook of ``SariaConnector`` is wrapped, at construction, with
a monotonic clock (``time.perf_counter_ns``); off, nothing is wrapped, so an
engine pays nothing for the option.

Steps are told apart by the metadata that ends them: on the scheduler side
``build_connector_meta`` closes a step (the lookups and allocations since the
last one are charged to it; ``update_connector_output`` and
``request_finished``, which vLLM calls as it takes in a step's output, to
that step); on a worker
``get_transfer_results`` closes it (every hook of one step takes the same
metadata). A step is ``load`` when its metadata moves anything into the KV
cache (KV pages or a checkpoint), else ``store`` when it moves anything out
of it or completes a block to store (one the cache may hold already: the
scheduler asks), else ``idle`` -- the decode step with nothing to move, which
must cost nothing.

``HookClock.table()`` gives, per (side, kind, hook): calls, steps, total and
per-step microseconds; with ``saria serve``, the scheduler side also counts
the calls to the server each kind of step made (``RemoteCache.calls``: the
engine's own, not its heartbeat's). ``saria bench steps`` reads it off an
in-process engine's connectors.
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict

from saria.connector.meta import Medium

SCHEDULER_HOOKS = ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
                   "update_connector_output", "request_finished", "request_finished_all_groups",
                   "take_events", "get_kv_connector_stats")
WORKER_HOOKS = ("handle_preemptions", "start_load_kv", "wait_for_layer_load", "save_kv_layer",
                "wait_for_save", "get_finished", "get_transfer_results",
                "get_block_ids_with_load_errors", "build_connector_worker_meta",
                "get_kv_connector_stats")
KINDS = ("idle", "store", "load")  # saria.bench.steps.KINDS too


def step_kind(meta) -> str:
    """What a step's ``SariaMetadata`` moves (see the module's docstring)."""
    if meta.loads or any(s.dst == Medium.KV for s in meta.states):
        return "load"
    if meta.stores or meta.states or meta.delayed or meta.stores_due:
        return "store"
    return "idle"


class HookClock:
    """Per-hook time (and calls to the server) of one side of the connector,
    charged to kinds of steps."""

    # hooks vLLM calls while it takes in a step's output, after the next
    # step's metadata would not yet exist: they are that step's cost
    AFTER = frozenset({"update_connector_output", "request_finished",
                       "request_finished_all_groups"})

    def __init__(self, side: str, rpc_count=None) -> None:
        self.side = side
        self.rpc_count = rpc_count      # calls to ``saria serve`` so far (None: in process)
        self.open: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # calls, ns, rpcs
        self.totals: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
        self.steps: dict[str, int] = defaultdict(int)
        self.last: str | None = None    # the kind of the last step closed

    def reset(self) -> None:
        """Forgets what was measured (after a warm-up); open hooks included."""
        for cell in self.open.values():
            cell[:] = [0, 0, 0]
        self.totals.clear()
        self.steps.clear()
        self.last = None

    def wrap(self, obj, names) -> None:
        """Times each bound method `names` of `obj` (an instance attribute
        shadows the class's method: this instance only)."""
        for name in names:
            fn = getattr(obj, name, None)
            if fn is not None:
                setattr(obj, name, self._timed(name, fn))

    def _timed(self, name: str, fn):
        clock, rpcs, after = time.perf_counter_ns, self.rpc_count, name in self.AFTER

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            n0 = rpcs() if rpcs is not None else 0
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = clock() - t0
                dn = rpcs() - n0 if rpcs is not None else 0
                cell = (self.totals[(self.last, name)] if after and self.last is not None
                        else self.open[name])
                cell[0] += 1
                cell[1] += dt
                cell[2] += dn
        return timed

    def close_step(self, kind: str) -> None:
        """The step whose hooks ran since the last close was of `kind`."""
        self.steps[kind] += 1
        self.last = kind
        for name, cell in self.open.items():
            if cell[0]:
                tot = self.totals[(kind, name)]
                for i in range(3):
                    tot[i] += cell[i]
                cell[:] = [0, 0, 0]

    def table(self) -> list[dict]:
        """Rows of (side, kind, hook, calls, steps, us_total, us_per_step, rpcs)."""
        rows = []
        for (kind, name), (calls, ns, rpcs) in sorted(self.totals.items()):
            steps = self.steps[kind]
            rows.append({"side": self.side, "kind": kind, "hook": name, "calls": calls,
                         "steps": steps, "us_total": ns / 1e3,
                         "us_per_step": ns / 1e3 / steps if steps else 0.0, "rpcs": rpcs})
        return rows

    def rpcs_per_step(self) -> dict[str, float]:
        """Calls to the server per step, by kind (every hook of this side)."""
        out = {}
        for kind in KINDS:
            if self.steps[kind]:
                n = sum(v[2] for (k, _), v in self.totals.items() if k == kind)
                out[kind] = n / self.steps[kind]
        return out

    def per_step_us(self) -> dict[str, float]:
        """Connector microseconds per step, by kind (every hook together)."""
        out = {}
        for kind in KINDS:
            ns = sum(v[1] for (k, _), v in self.totals.items() if k == kind)
            out[kind] = ns / 1e3 / self.steps[kind] if self.steps[kind] else 0.0
        return out
