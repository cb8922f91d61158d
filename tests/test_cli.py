"""The installed ``saria`` command, run as a user runs it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

SARIA = shutil.which("saria") or ""
pytestmark = pytest.mark.skipif(not SARIA, reason="the saria entry point is not installed")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([SARIA, *args], capture_output=True, text=True, timeout=600)


def test_bench_index_reports_the_documented_keys(tmp_path):
    out = tmp_path / "bench.json"
    r = run("bench", "index", "--limit-sessions", "8", "--json", str(out))
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    for key in ("block_visits", "seconds", "block_visits_per_s", "peak_rss_bytes",
                "bytes_per_tracked_block"):
        assert key in d
    assert d["block_visits"] > 100_000 and d["block_visits_per_s"] > 0
    # 8 sessions, every block tracked: one node per unique block.
    assert d["tracked_blocks"] == d["unique_blocks"]
    assert 0 < d["hit_ratio_blocks"] <= 0.9634 + 1e-9
    assert "block visits / s" in r.stdout


def stats(*args: str, tmp_path) -> dict:
    out = tmp_path / "stats.json"
    r = run("traces", "stats", *args, "--json", str(out))
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text())[0]


def test_bench_index_finds_every_ideal_hit_when_dram_holds_everything(tmp_path):
    out = tmp_path / "bench.json"
    r = run("bench", "index", "--limit-sessions", "12", "--dram-fraction", "1",
            "--json", str(out))
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    s = stats("weka", "--limit-sessions", "12", tmp_path=tmp_path)
    # Computed independently (sets of ids per session): every repeat is a hit.
    assert d["hit_blocks"] == s["blocks"] - s["unique_blocks"]
    assert d["dram_evictions"] == 0


def test_bench_index_on_the_mooncake_trace(tmp_path):
    out = tmp_path / "bench.json"
    r = run("bench", "index", "--trace", "mooncake", "--dram-fraction", "1", "--json", str(out))
    assert r.returncode == 0, r.stderr
    d = json.loads(out.read_text())
    s = stats("mooncake", tmp_path=tmp_path)
    ideal = round(s["hit_ratio_blocks"] * s["blocks"])
    # Only full blocks get keys: a request can lose at most its partial last block.
    assert ideal - s["requests"] <= d["hit_blocks"] <= ideal
    assert d["dram_evictions"] == 0


@pytest.mark.parametrize("args, needle", [
    (("bench", "index", "--dram-fraction", "0"), "--dram-fraction"),
    (("bench", "index", "--trace", "/nonexistent/trace.jsonl"), "/nonexistent/trace.jsonl"),
    (("bench", "index", "--trace", "azure"), "no prefix identity"),
    (("traces", "stats", "--format", "weka", "/nonexistent.tar.xz"), "nonexistent"),
])
def test_bad_input_is_one_line_and_nonzero(args, needle):
    r = run(*args)
    assert r.returncode != 0
    assert needle in r.stderr
    assert "Traceback" not in r.stderr


def test_help_lists_commands():
    r = subprocess.run([sys.executable, "-m", "saria.cli.main", "--help"], capture_output=True,
                       text=True)
    assert r.returncode == 0 and "bench" in r.stdout and "traces" in r.stdout


def test_version_matches_the_package_metadata():
    """``saria --version`` prints the version pyproject.toml declares."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    import saria

    root = Path(__file__).resolve().parents[1]
    declared = re.search(r'^version = "([^"]+)"', (root / "pyproject.toml").read_text(), re.M)[1]
    r = subprocess.run([sys.executable, "-m", "saria.cli.main", "--version"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"saria {declared}" == f"saria {saria.__version__}"
    assert f"## {declared} " in (root / "CHANGELOG.md").read_text()
    assert "Apache License" in (root / "LICENSE").read_text()
