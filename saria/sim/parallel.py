"""Replays side by side: one forked worker process per job, up to the CPUs.

A replay is single-threaded and CPU-bound, and the replays of one command
(policies, grid points, fleet rows) share nothing but the loaded trace, so they
run in forked workers: module globals set before the call (a loaded trace) are
shared copy-on-write rather than pickled, and so are the items themselves --
a worker gets an index, never a pickled trace or setup. Only results travel
back, pickled.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

from saria.errors import SariaError

# Set in the parent just before the workers fork; read by them.
_FN: Callable | None = None
_ITEMS: Sequence = ()
_DONE = None  # a shared array: units of work done per item (item progress)


def available_cpus() -> int:
    """CPUs this process may run on (a container's or taskset's share, not
    the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def parallel_map(fn: Callable, items: Sequence, *, jobs: int | None = None,
                 progress: Callable[[int], None] | None = None,
                 item_progress: bool = False) -> list:
    """``[fn(x) for x in items]`` in forked worker processes; results in
    input order. One job (or one item) runs in-process.

    Progress: by default ``progress(items done)`` as items complete. With
    ``item_progress`` each call is ``fn(x, report)``, where ``report(n)``
    says n units of that item are done (a replay's requests), and
    ``progress(units done over all items)`` follows them as they move."""
    jobs = max(1, min(jobs or available_cpus(), len(items)))
    out: list = [None] * len(items)
    if jobs == 1:
        base = last = 0

        def report(n: int) -> None:
            nonlocal last
            last = n
            if progress:
                progress(base + n)
        for i, x in enumerate(items):
            out[i] = fn(x, report) if item_progress else fn(x)
            base, last = base + last, 0
            if progress and not item_progress:
                progress(i + 1)
        return out
    global _FN, _ITEMS, _DONE
    _FN, _ITEMS = fn, items
    _DONE = mp.get_context("fork").Array("q", len(items), lock=False) if item_progress else None
    try:
        with ProcessPoolExecutor(jobs, mp_context=mp.get_context("fork")) as pool:
            futures = {pool.submit(_run_item, i): i for i in range(len(items))}
            pending = set(futures)
            done = 0
            try:
                while pending:
                    finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                    for fut in finished:
                        out[futures[fut]] = fut.result()
                        done += 1
                    if progress:
                        progress(sum(_DONE) if _DONE is not None else done)
            except BaseException:
                pool.shutdown(wait=False, cancel_futures=True)  # the first error ends the map
                raise
    except BrokenProcessPool:
        raise SariaError("a worker process ended abruptly (killed, or out of memory?); "
                         "--jobs 1 runs one job at a time in this process") from None
    finally:
        _FN, _ITEMS, _DONE = None, (), None
    return out


def _run_item(i: int):
    assert _FN is not None
    if _DONE is None:
        return _FN(_ITEMS[i])

    def report(n: int) -> None:
        _DONE[i] = n
    return _FN(_ITEMS[i], report)
