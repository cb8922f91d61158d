"""saria.sim.parallel: forked workers give the serial answers, in order, with progress."""

from __future__ import annotations

import os

import pytest

from saria.sim.parallel import available_cpus, parallel_map

_SHARED: dict = {}  # set before forking, read in the workers (never pickled)


def _square_of_shared(i: int) -> tuple[int, int]:
    return _SHARED[i] ** 2, os.getpid()


def _counted(n: int, report) -> int:
    for k in range(1, n + 1):
        report(k)
    return n


@pytest.mark.parametrize("jobs", [1, 2, 4])
def test_results_in_input_order_from_forked_workers(jobs):
    _SHARED.update({i: i + 10 for i in range(9)})
    out = parallel_map(_square_of_shared, list(range(9)), jobs=jobs)
    assert [v for v, _ in out] == [(i + 10) ** 2 for i in range(9)]
    pids = {pid for _, pid in out}
    assert (os.getpid() in pids) == (jobs == 1)


@pytest.mark.parametrize("jobs", [1, 3])
def test_item_progress_sums_the_units_of_every_item(jobs):
    seen: list[int] = []
    out = parallel_map(_counted, [5, 7, 3], jobs=jobs, progress=seen.append, item_progress=True)
    assert out == [5, 7, 3]
    assert seen[-1] == 15
    assert seen == sorted(seen)  # never goes back


def _fails(i: int) -> int:
    if i == 2:
        raise ValueError(f"item {i} is bad")
    return i


def test_a_worker_error_reaches_the_caller():
    with pytest.raises(ValueError, match="item 2 is bad"):
        parallel_map(_fails, [0, 1, 2, 3], jobs=2)


def test_available_cpus_is_positive():
    assert 1 <= available_cpus() <= (os.cpu_count() or 1)
