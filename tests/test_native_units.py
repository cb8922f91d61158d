"""The SSD store's C++ parts that do no I/O (slot allocator, recovery's record
check and survivor choice, thread pool), tested in C++ against brute-force
models under AddressSanitizer and UBSan: native/tests, built with CMake and
run with ctest."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

NATIVE_TESTS = Path(__file__).resolve().parent.parent / "native" / "tests"


@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("ctest") is None,
                    reason="cmake is not installed (apt-get install cmake)")
def test_store_units_in_cpp(tmp_path):
    build = tmp_path / "build"

    # A library preloaded into this process (vLLM's CPU build sets LD_PRELOAD
    # when imported) must not reach the sanitized binary: ASan must come first.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}

    def run(*cmd: str) -> str:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
        assert p.returncode == 0, f"{' '.join(cmd)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        return p.stdout

    run("cmake", "-S", str(NATIVE_TESTS), "-B", str(build), "-DCMAKE_BUILD_TYPE=Debug")
    run("cmake", "--build", str(build), "-j", "2")
    out = run("ctest", "--test-dir", str(build), "--output-on-failure")
    assert "100% tests passed" in out
