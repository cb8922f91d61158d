"""Runs the whole-stack fault simulation (tests/whole_stack).

    python tests/sim.py --seeds 1000              # seeds 0..999
    python tests/sim.py --seed 4711               # one seed, its shrunk event log if it fails
    python tests/sim.py --seeds 300 --mutation tp-store-first-failure
    python tests/sim.py --mutation-table --seeds 300

A failing seed prints its failure and a minimal event list that still fails
the same way (replay it with ``--events FILE``). Exit status 1 when any seed failed.
"""

from __future__ import annotations

import argparse
import ast
import logging
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from whole_stack import mutations  # noqa: E402
from whole_stack.events import SCENARIOS, draw, run, shrink  # noqa: E402


def first_failure(seeds, *, events: int, scenarios, stop: bool = True):
    """Yields (seed, scenario, events, failure) for failing runs (only the first with `stop`)."""
    for seed in seeds:
        for name in scenarios:
            sc = SCENARIOS[name]
            ev = draw(seed, events, engines=len(sc["engines"]),
                      **{k: v for k, v in sc.items() if k != "engines"})
            f = run(ev, **sc)
            if f is not None:
                yield seed, name, ev, f
                if stop:
                    return


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=int(os.environ.get("SARIA_SIM_SEEDS", "200")))
    ap.add_argument("--first", type=int, default=0, help="first seed (default 0)")
    ap.add_argument("--seed", type=int, help="run this one seed")
    ap.add_argument("--events", type=int, default=120, help="events per seed")
    ap.add_argument("--replay", help="a file with an event list (Python literal) to run")
    ap.add_argument("--mutation", choices=sorted(mutations.MUTATIONS), help="put a known bug back")
    ap.add_argument("--mutation-table", action="store_true",
                    help="for each mutation: the first seed that finds it, in how many events")
    ap.add_argument("--all", action="store_true", help="go on past the first failing seed")
    ap.add_argument("--scenario", action="append", choices=sorted(SCENARIOS),
                    help="the worlds each seed runs in (default: all)")
    ap.add_argument("--no-shrink", action="store_true")
    args = ap.parse_args(argv)
    logging.disable(logging.ERROR)  # injected faults log errors by design
    scenarios = args.scenario or list(SCENARIOS)

    if args.mutation_table:
        print(f"{'mutation':34} {'found at seed':>14} {'events':>7} {'shrunk':>7}  failure")
        for name in sorted(mutations.MUTATIONS):
            hit = _found(name, range(args.first, args.first + args.seeds), args.events, scenarios)
            if hit is None:
                print(f"{name:34} {'not found':>14}", flush=True)
                continue
            seed, sc, ev, f = hit
            small = ev[:getattr(f, "at", len(ev) - 1) + 1]
            if not args.no_shrink:
                with mutations.applied(name):
                    small = shrink(small, f.kind, **SCENARIOS[sc])
            print(f"{name:34} {f'{seed} ({sc})':>14} {getattr(f, 'at', len(ev) - 1) + 1:>7} "
                  f"{len(small):>7}  {f.kind}", flush=True)
        return 0

    ctx = mutations.applied(args.mutation) if args.mutation else _null()
    failed = 0
    t0 = time.perf_counter()
    with ctx:
        if args.replay:
            with open(args.replay) as fh:
                ev = ast.literal_eval(fh.read())
            f = run(ev, **SCENARIOS[scenarios[0]])
            print(f or "ok")
            return 1 if f else 0
        seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
        for seed, sc, ev, f in first_failure(seeds, events=args.events, scenarios=scenarios,
                                             stop=not args.all):
            failed += 1
            at = getattr(f, "at", len(ev) - 1)
            print(f"seed {seed} ({sc}): {f}\n  (after event {at + 1} of {len(ev)})", flush=True)
            if not args.no_shrink:
                small = shrink(ev[:at + 1], f.kind, **SCENARIOS[sc])
                print(f"  minimal event list ({len(small)} events, still {f.kind}):")
                print("  " + repr(small))
    n = 1 if args.seed is not None else args.seeds
    print(f"{n} seed(s), {failed} failing, {time.perf_counter() - t0:.1f} s")
    return 1 if failed else 0


def _found(name: str, seeds, events: int, scenarios):
    """The first run that fails with mutation `name` and passes without it."""
    for seed in seeds:
        for sc in scenarios:
            kw = SCENARIOS[sc]
            ev = draw(seed, events, engines=len(kw["engines"]),
                      **{k: v for k, v in kw.items() if k != "engines"})
            with mutations.applied(name):
                f = run(ev, **kw)
            if f is not None and run(ev, **kw) is None:
                return seed, sc, ev, f
    return None


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    sys.exit(main())
