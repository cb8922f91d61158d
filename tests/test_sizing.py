"""Honest sizing: the replay's lifetime and write budget are those of the drive
replayed (``--ssd``, ``--drives``), agree with ``saria endurance`` at the
replay's own rate, and the replay says which policy fits the drive and when
the GPU queue saturated."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, strategies as st

from saria.endurance import EnduranceReport
from saria.sim.engine import ReplayStats
from saria.sim.report import SATURATION_BUSY_S, gpu_queue
from saria.sim.verdict import fits, recommend

SARIA_CLI = shutil.which("saria")
pytestmark = pytest.mark.skipif(SARIA_CLI is None, reason="the saria entry point is not installed")

GB = 1_000_000_000


def _saria(*args: str) -> subprocess.CompletedProcess:
    r = subprocess.run([SARIA_CLI, *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r


@pytest.fixture(scope="module")
def small_ssd(tmp_path_factory):
    """One replay on a 200 GB drive, then ``saria endurance`` on its JSON."""
    d = tmp_path_factory.mktemp("sizing")
    out = _saria("replay", "--sessions", "12", "--dram", "16GB", "--ssd", "200GB", "--jobs", "1",
                 "--policy", "full-duplicate", "--policy", "saria", "--json", str(d / "r.json"))
    _saria("endurance", "--replay-json", str(d / "r.json"), "--json", str(d / "e.json"))
    return out.stdout, json.loads((d / "r.json").read_text()), json.loads((d / "e.json").read_text())


def test_lifetime_and_budget_are_the_200gb_drives(small_ssd):
    """Before: the report used the preset's 3.84 TB drive whatever --ssd said
    (19.2x the lifetime, 1/19.2 the budget)."""
    stdout, replay, _ = small_ssd
    assert replay["config"]["ssd_bytes_per_drive"] == 200 * GB
    assert "SSD 1 x 200 GB at 1 DWPD over 5 y" in stdout
    for name, rep in replay["policies"].items():
        ref = EnduranceReport(200 * GB, 1.0, 5.0, rep["ssd_write_rate_Bps"])
        assert rep["ssd_bytes_written"] > 0
        assert rep["ssd_lifetime_days"] == pytest.approx(ref.days_to_exhaustion, rel=1e-12)
        assert rep["write_budget_fraction"] == pytest.approx(ref.budget_fraction, rel=1e-12)


def test_replay_and_endurance_agree_at_the_replays_rate(small_ssd):
    """``saria endurance --replay-json`` (no --capacity: the replay's drive)
    prints what the replay printed."""
    _, replay, endurance = small_ssd
    by_label = {e["label"]: e for e in endurance}
    assert set(by_label) == set(replay["policies"])
    for name, rep in replay["policies"].items():
        e = by_label[name]
        assert e["capacity_bytes"] == 200 * GB
        assert e["days_to_exhaustion"] == pytest.approx(rep["ssd_lifetime_days"], rel=1e-12)
        assert e["budget_fraction"] == pytest.approx(rep["write_budget_fraction"], rel=1e-12)


def test_two_drives_share_the_writes_and_endurance_sees_both(tmp_path):
    _saria("replay", "--sessions", "6", "--dram", "16GB", "--ssd", "200GB", "--drives", "2",
           "--policy", "full-duplicate", "--json", str(tmp_path / "r.json"))
    _saria("endurance", "--replay-json", str(tmp_path / "r.json"), "--json", str(tmp_path / "e.json"))
    rep = json.loads((tmp_path / "r.json").read_text())["policies"]["full-duplicate"]
    e = json.loads((tmp_path / "e.json").read_text())[0]
    assert rep["ssd_drives"] == 2 and e["drives"] == 2
    per_drive = [b / rep["duration_s"] for b in rep["ssd_bytes_written_per_drive"]]
    ref = EnduranceReport(200 * GB, 1.0, 5.0, drives=2, per_drive_rates=tuple(per_drive))
    assert rep["ssd_lifetime_days"] == pytest.approx(ref.days_to_exhaustion, rel=1e-12)
    assert e["days_to_exhaustion"] == pytest.approx(ref.days_to_exhaustion, rel=1e-12)
    assert e["budget_fraction"] == pytest.approx(rep["write_budget_fraction"], rel=1e-12)


def test_bad_drive_count_is_one_line(tmp_path):
    r = subprocess.run([SARIA_CLI, "replay", "--drives", "0"], capture_output=True, text=True)
    assert r.returncode != 0 and "--drives" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_saturation_warning_when_arrivals_outrun_the_gpu(tmp_path):
    """30 sessions starting within 10 minutes on one GPU without an SSD tier:
    the queue never drains for hours. The default 12 h slice: no warning."""
    r = _saria("replay", "--sessions", "30", "--dram", "16GB", "--policy", "dram-only",
               "--arrivals", "window:10m", "--json", str(tmp_path / "r.json"))
    q = json.loads((tmp_path / "r.json").read_text())["policies"]["dram-only"]["gpu_queue"]
    assert q["saturated"] and q["busy_longest_s"] >= SATURATION_BUSY_S
    assert "Warning: the GPU queue saturated under dram-only" in r.stdout
    r = _saria("replay", "--sessions", "12", "--dram", "16GB", "--policy", "dram-only",
               "--json", str(tmp_path / "q.json"))
    assert "saturated" not in r.stdout


def _stats(arrivals, queued) -> ReplayStats:
    s = ReplayStats()
    s.arrival_s, s.queue_s = list(arrivals), list(queued)
    s.requests = len(arrivals)
    return s


def test_gpu_queue_rising_for_hours_is_saturated_draining_is_not():
    t = np.arange(0, 2 * 3600, 60.0)  # an arrival a minute for two hours
    rising = _stats(t, 10 + t / 10)
    assert gpu_queue(rising, t[-1])["saturated"]
    falling = _stats(t, 10 + (t[-1] - t) / 10)  # a backlog that drains
    assert not gpu_queue(falling, t[-1])["saturated"]
    gaps = _stats(t, np.where(np.arange(len(t)) % 30 == 0, 0.0, 10 + t / 10))  # idle twice an hour
    q = gpu_queue(gaps, t[-1])
    assert q["busy_longest_s"] < SATURATION_BUSY_S and not q["saturated"]


_report = st.fixed_dictionaries({
    "ttft_mean_s": st.floats(0.01, 1e4),
    "write_budget_fraction": st.one_of(st.none(), st.floats(0, 5)),
    "ssd_lifetime_days": st.one_of(st.none(), st.floats(1, 1e5)),
})


@given(st.dictionaries(st.sampled_from(["a", "b", "c", "d", "e"]), _report, min_size=1))
def test_recommendation_is_the_fastest_that_fits(results):
    """Against a brute force: the policy within the rating with the lowest mean
    TTFT; the runner-up the next; `faster` the fastest overall when it does not fit."""
    rec = recommend(results)
    ok = [n for n, r in results.items() if r["write_budget_fraction"] is not None
          and r["write_budget_fraction"] <= 1]
    if not ok:
        assert rec is None
        return
    ranked = sorted(ok, key=lambda n: (results[n]["ttft_mean_s"], n))
    assert rec.policy == ranked[0] and fits(results[rec.policy])
    assert rec.runner_up == (ranked[1] if len(ranked) > 1 else None)
    fastest = min(results, key=lambda n: (results[n]["ttft_mean_s"], n))
    quicker = results[fastest]["ttft_mean_s"] < rec.ttft_mean_s
    assert rec.faster == (fastest if quicker and fastest not in ok else None)
