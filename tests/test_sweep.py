"""saria sweep: a small grid in parallel, its CSV, JSON and PNG; closed loop."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess

import pytest

from saria.sim.plot import pareto
from saria.sim.presets import get_preset
from saria.sim.replay import make_setup, run_policy
from saria.sim.sweep import expand_grid, run_sweep
from saria.traces import bundled_trace, load_trace
from saria.traces.arrivals import ArrivalModel

SARIA_CLI = shutil.which("saria")


def test_grid_varies_r_only_for_saria():
    pts = expand_grid(["E2", "saria"], [None], ["window:2h"], [1, 2], [0.6, 0.8], [None])
    assert len(pts) == 2 * 1 + 2 * 2
    assert {p.r for p in pts if p.policy == "E2"} == {0.6}


def test_parallel_sweep_equals_serial_runs():
    trace = load_trace(bundled_trace("weka"), limit_sessions=6)
    preset = get_preset("qwen3-8b/h100-gen5-1ssd")
    pts = expand_grid(["full-duplicate", "E2"], [64e9], ["window:1h"], [1, 2], [None], [None])
    rows = run_sweep(trace, preset, pts, jobs=2)
    assert [(r["policy"], r["ssd_count"]) for r in rows] == \
        [("full-duplicate", 1), ("full-duplicate", 2), ("E2", 1), ("E2", 2)]
    one = run_policy(trace, make_setup("E2", preset.with_(ssd_count=2), dram_bytes=64e9),
                     ArrivalModel.from_spec("window:1h"))
    assert rows[3]["ssd_bytes_written"] == one["ssd_bytes_written"]
    assert rows[3]["ttft_mean_s"] == one["ttft_mean_s"]


def test_pareto_front():
    assert pareto([(3, 1), (1, 5), (2, 2), (2.5, 3)]) == [(1, 5), (2, 2), (3, 1)]


@pytest.mark.skipif(SARIA_CLI is None, reason="the saria entry point is not installed")
def test_sweep_cli_writes_csv_json_and_png(tmp_path):
    r = subprocess.run([SARIA_CLI, "sweep", "--sessions", "5", "--policy", "dram-only",
                        "--policy", "E2", "--policy", "saria", "--r", "0.5,0.9",
                        "--ssd-count", "1,2", "--out", str(tmp_path), "--jobs", "2"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader((tmp_path / "sweep.csv").open()))
    assert len(rows) == 2 + 2 + 4  # saria x 2 r values
    assert {row["policy"] for row in rows} == {"dram-only", "E2", "saria"}
    assert json.loads((tmp_path / "sweep.json").read_text())["rows"][0]["policy"] == "dram-only"
    png = (tmp_path / "frontier.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


@pytest.mark.skipif(SARIA_CLI is None, reason="the saria entry point is not installed")
def test_sweep_rejects_bad_lists_before_work(tmp_path):
    r = subprocess.run([SARIA_CLI, "sweep", "--ssd-count", "1,zero", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--ssd-count" in r.stderr
    assert not (tmp_path / "sweep.csv").exists()


def test_closed_loop_issues_each_request_after_the_previous_first_token():
    """One session, closed loop: request i+1 arrives when request i's first
    token is out plus i+1's think time, so the span is exactly the sum of the
    TTFTs and the (capped) think times -- never the trace's own t."""
    from saria.traces.arrivals import think_times
    trace = load_trace(bundled_trace("weka"), limit_sessions=1)
    preset = get_preset("qwen3-8b/h100-gen5-1ssd")
    model = ArrivalModel.from_spec("window:1h,closed")
    rep = run_policy(trace, make_setup("E2", preset), model)
    n = rep["requests"]
    assert n == trace.num_requests
    thinks = float(think_times(trace.sessions[0], model.max_idle_s).sum())
    assert rep["duration_s"] == pytest.approx(rep["ttft_mean_s"] * n + thinks, rel=1e-9)
    open_loop = run_policy(trace, make_setup("E2", preset), ArrivalModel.from_spec("window:1h"))
    assert open_loop["duration_s"] != pytest.approx(rep["duration_s"])


@pytest.mark.skipif(SARIA_CLI is None, reason="the saria entry point is not installed")
def test_sweep_over_ssd_capacity_sizes_each_drive(tmp_path):
    """--ssd 200GB,1TB: one row per drive size, each with that drive's
    lifetime (5x the writes' days on the 5x drive when the writes are equal)."""
    r = subprocess.run([SARIA_CLI, "sweep", "--sessions", "5", "--dram", "16GB",
                        "--policy", "full-duplicate", "--ssd", "200GB,1TB", "--out", str(tmp_path),
                        "--jobs", "1"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    rows = {float(row["ssd_bytes"]): row for row in csv.DictReader((tmp_path / "sweep.csv").open())}
    assert set(rows) == {200e9, 1e12}
    small, big = rows[200e9], rows[1e12]
    if small["ssd_bytes_written"] == big["ssd_bytes_written"]:  # neither drive filled up
        assert float(big["ssd_lifetime_days"]) == pytest.approx(5 * float(small["ssd_lifetime_days"]))
    assert float(small["write_budget_fraction"]) > float(big["write_budget_fraction"])
