"""Events drawn from a seed, a run of them, and shrinking a failing list.

A run is a pure function of its event list: every event names its engine
and its target by index (modulo what exists when it runs), so any sub-list
is a valid run too -- which is what lets a failing list shrink.
"""

from __future__ import annotations

import random
import traceback

from whole_stack.world import SimFailure, World

WEIGHTS = {
    "arrive": 14, "step": 30, "evict_local": 6, "alloc_fail": 2, "preempt": 3, "abort": 2,
    "rank_fail": 2, "rank_slow": 3, "late_land": 3, "ack_lost": 1, "ssd_read_fail": 3,
    "land": 6, "land_fail": 1, "clock": 2, "crash": 1,
}
# what a run's world holds: engines' TP sizes, a cluster tier (shared by the engines)
SCENARIOS = {
    "local": {"engines": (1, 2), "cluster": False},
    "cluster": {"engines": (1, 1, 2), "cluster": True},
    "server": {"engines": (1, 1, 2), "server": True},
    # the server always answers (lost replies and lease expiry only): what a
    # down server does is then not the first thing a run meets
    "server-up": {"engines": (1, 1, 2), "server": True, "server_events": ("srv_drop", "srv_expire")},
    # a hybrid model (attention + recurrent states as checkpoints): TP 1, in
    # process -- what saria holds them with today
    "hybrid": {"engines": (1, 1), "hybrid": True},
}
SERVER_WEIGHTS = {"srv_pause": 2, "srv_resume": 3, "srv_drop": 2, "srv_expire": 1, "srv_kill": 1,
                  "srv_start": 3, "srv_flap": 1}
CLUSTER_WEIGHTS = {"publish": 6, "cl_fail_get": 2, "cl_corrupt": 1, "cl_vanish": 1, "cl_late": 1,
                   "cl_land_late": 2, "cl_down": 1, "cl_up": 2}


def draw(seed: int, n: int = 120, engines: int = 2, cluster: bool = False,
         server: bool = False, server_events: tuple[str, ...] | None = None,
         hybrid: bool = False) -> list[tuple]:
    """`n` events from `seed`: prompts from three roots with branches (shared prefixes)."""
    rng = random.Random(seed)
    roots = [[r * 100_000 + t for t in range(4 * rng.randint(2, 7) + rng.randint(0, 3))]
             for r in range(3)]
    srv = {k: w for k, w in SERVER_WEIGHTS.items() if server_events is None or k in server_events}
    kinds, weights = zip(*{**WEIGHTS, **(CLUSTER_WEIGHTS if cluster else {}),
                           **(srv if server else {})}.items())
    out: list[tuple] = []
    for _ in range(n):
        k = rng.choices(kinds, weights)[0]
        e = rng.randrange(engines)
        if k == "arrive":
            root = rng.choice(roots)
            cut = rng.randint(len(root) // 2, len(root))
            branch = rng.randrange(4)
            tail = [900_000 + branch * 1000 + t for t in range(rng.randint(1, 10))]
            out.append((k, e, tuple(root[:cut] + tail), rng.randint(1, 6)))
        elif k == "evict_local":
            out.append((k, e, rng.randint(4, 40)))
        elif k == "land":
            out.append((k, e, rng.randint(1, 4)))
        elif k == "clock":
            out.append((k, e, rng.choice([1.0, 5.0, 25.0])))
        elif k in ("preempt", "abort", "rank_fail", "rank_slow", "ack_lost", "ssd_read_fail",
                   "cl_fail_get", "cl_corrupt", "cl_vanish"):
            out.append((k, e, rng.randrange(8)))
        else:
            out.append((k, e))
    return out


def run(events: list[tuple], *, engines: tuple[int, ...] = (1, 2), cluster: bool = False,
        server: bool = False, server_events=None, hybrid: bool = False) -> SimFailure | None:
    """Runs `events`, then drains, checks leaks and restarts; returns the first
    broken invariant (an unexpected exception is one too: kind ``crash:<type>``)."""
    w = World(engines=engines, cluster=cluster, server=server, hybrid=hybrid)
    try:
        for i, ev in enumerate(events):
            try:
                w.apply(ev)
            except SimFailure as f:
                f.at = i
                raise
        w.finish()
    except SimFailure as f:
        return f
    except Exception as e:  # noqa: BLE001 -- an engine would crash: that is a failure
        f = SimFailure(f"crash:{type(e).__name__}", "".join(
            traceback.format_exception_only(type(e), e)).strip() + "\n" +
            "".join(traceback.format_tb(e.__traceback__)[-3:]))
        return f
    finally:
        w.close()
    return None


def shrink(events: list[tuple], kind: str, *, budget: int = 300, **world) -> list[tuple]:
    """The shortest list found (greedy delta debugging) that still fails with `kind`."""
    cur = list(events)
    tries = 0
    chunk = max(1, len(cur) // 2)
    while chunk >= 1 and tries < budget:
        i, changed = 0, False
        while i < len(cur) and tries < budget:
            cand = cur[:i] + cur[i + chunk:]
            tries += 1
            f = run(cand, **world)
            if f is not None and f.kind == kind:
                cur, changed = cand, True
            else:
                i += chunk
        if not changed:
            chunk //= 2
    return cur
