"""saria.sim.parallel: forked workers give the serial answers, in order, with progress."""

from __future__ import annotations

import os

import pytest

from saria.errors import ConfigError, SariaError, TraceFormatError
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


def _bad_input(i: int) -> int:
    if i == 1:
        raise ConfigError("--dram", "too small")
    if i == 2:
        raise TraceFormatError("t.jsonl", 7, "invalid JSON")
    return i


@pytest.mark.parametrize("items, kind, text", [
    ([0, 1], ConfigError, "--dram: too small"), ([0, 2], TraceFormatError, "t.jsonl:7: invalid JSON")])
def test_a_saria_error_in_a_worker_arrives_whole(items, kind, text):
    """saria's one-line errors survive the trip from a worker (their own
    pickling), instead of breaking the pool."""
    with pytest.raises(kind) as info:
        parallel_map(_bad_input, items, jobs=2)
    assert str(info.value) == text


def _dies(i: int) -> int:
    if i == 1:
        os._exit(3)  # as the OOM killer would end it
    return i


def test_a_worker_that_dies_is_one_line():
    with pytest.raises(SariaError, match="worker process ended abruptly"):
        parallel_map(_dies, [0, 1, 2], jobs=2)


def test_available_cpus_is_positive():
    assert 1 <= available_cpus() <= (os.cpu_count() or 1)
