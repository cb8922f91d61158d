"""saria.endurance and ``saria endurance``: the DWPD budget arithmetic."""

from __future__ import annotations

import argparse
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from saria.cli import endurance_cmd
from saria.endurance import (
    DGX_H100_DRIVE_BYTES,
    EnduranceReport,
    allowed_write_rate,
    budget_fraction,
    daily_budget_bytes,
    days_to_exhaustion,
    min_capacity_bytes,
    replay_write_rates,
    reports_from_replay,
    writable_bytes,
)
from saria.errors import ConfigError, SariaError

TB, GB = 1e12, 1e9


def test_the_70_day_example():
    # SARIA §1 / the brief: a 4 TB 1-DWPD drive dies in ~70 days at ~1.2 GB/s.
    assert writable_bytes(4 * TB, 1, 5) == 7300 * TB
    days = days_to_exhaustion(4 * TB, 1, 5, 1.21 * GB)
    assert 69 <= days <= 71
    assert days == pytest.approx(7300e12 / (1.21e9 * 86400))


def test_dgx_h100_drive_tbw():
    assert writable_bytes(DGX_H100_DRIVE_BYTES, 1, 5) == pytest.approx(7008 * TB)


@pytest.mark.parametrize(("rate_gbps", "dwpd", "tb"), [(1, 1, 86.4), (1.21, 1, 104.544), (1, 3, 28.8),
                                                       (0.5, 0.5, 86.4), (0, 1, 0)])
def test_min_capacity_is_86_4_B_over_dwpd_TB(rate_gbps, dwpd, tb):
    assert min_capacity_bytes(rate_gbps * GB, dwpd) == pytest.approx(tb * TB)


def test_min_capacity_for_a_target_life_scales_with_the_life():
    five_years = min_capacity_bytes(1 * GB, 1)
    assert min_capacity_bytes(1 * GB, 1, years=5, lifetime_days=365) == pytest.approx(five_years / 5)
    with pytest.raises(ConfigError, match="years"):
        min_capacity_bytes(1 * GB, 1, lifetime_days=365)


def test_min_capacity_lasts_exactly_the_rated_life():
    c = min_capacity_bytes(1.21 * GB, 1)
    assert days_to_exhaustion(c, 1, 5, 1.21 * GB) == pytest.approx(5 * 365)


def test_zero_rate_never_wears_out():
    assert days_to_exhaustion(4 * TB, 1, 5, 0) == math.inf
    assert budget_fraction(0, 4 * TB, 1) == 0


def test_budget_fraction_and_daily_budget():
    assert daily_budget_bytes(4 * TB, 1) == 4 * TB
    assert budget_fraction(4 * TB / 86400, 4 * TB, 1) == pytest.approx(1.0)
    assert budget_fraction(1.21 * GB, 4 * TB, 1) == pytest.approx(1.21e9 * 86400 / 4e12)
    assert budget_fraction(1, 0, 1) == math.inf


def test_allowed_write_rate_default_is_the_daily_budget():
    assert allowed_write_rate(3.84 * TB, 1) == pytest.approx(3.84e12 / 86400)  # ~44.4 MB/s
    assert allowed_write_rate(3.84 * TB, 1, years=5) == allowed_write_rate(3.84 * TB, 1)
    with pytest.raises(ConfigError, match="years"):
        allowed_write_rate(4 * TB, 1, lifetime_days=70)


@given(cap=st.floats(1e9, 1e15), dwpd=st.floats(0.1, 10), years=st.floats(0.5, 10),
       days=st.floats(1, 10_000))
def test_allowed_rate_round_trips_to_the_target_life(cap, dwpd, years, days):
    rate = allowed_write_rate(cap, dwpd, years)
    assert days_to_exhaustion(cap, dwpd, years, rate) == pytest.approx(365 * years)
    rate = allowed_write_rate(cap, dwpd, years, lifetime_days=days)
    assert days_to_exhaustion(cap, dwpd, years, rate) == pytest.approx(days)


@given(cap=st.floats(1e9, 1e15), dwpd=st.floats(0.1, 10), rate=st.floats(1e3, 1e11),
       k=st.floats(1.01, 100))
def test_monotonic_in_rate_and_capacity(cap, dwpd, rate, k):
    d = days_to_exhaustion(cap, dwpd, 5, rate)
    assert days_to_exhaustion(cap, dwpd, 5, rate * k) < d
    assert days_to_exhaustion(cap * k, dwpd, 5, rate) > d
    assert min_capacity_bytes(rate * k, dwpd) > min_capacity_bytes(rate, dwpd)
    assert budget_fraction(rate * k, cap, dwpd) > budget_fraction(rate, cap, dwpd)
    assert allowed_write_rate(cap * k, dwpd) > allowed_write_rate(cap, dwpd)
    # The fraction of the budget used is the rated life over the actual life.
    assert budget_fraction(rate, cap, dwpd) == pytest.approx(5 * 365 / d)


@pytest.mark.parametrize(
    ("call", "key"),
    [
        (lambda: writable_bytes(-1, 1, 5), "capacity"),
        (lambda: writable_bytes(4e12, 0, 5), "dwpd"),
        (lambda: writable_bytes(4e12, 1, -5), "years"),
        (lambda: writable_bytes(4e12, float("nan"), 5), "dwpd"),
        (lambda: days_to_exhaustion(4e12, 1, 5, -1), "write_rate"),
        (lambda: days_to_exhaustion(4e12, 1, 5, math.inf), "write_rate"),
        (lambda: allowed_write_rate(4e12, 1, 5, lifetime_days=0), "target_days"),
        (lambda: EnduranceReport(4e12, drives=0), "drives"),
        (lambda: EnduranceReport(4e12, drives=2, per_drive_rates=(1.0,)), "drives"),
    ],
)
def test_bad_values_raise_config_errors(call, key):
    with pytest.raises(ConfigError) as info:
        call()
    assert info.value.key == key


def test_report_single_drive():
    r = EnduranceReport(4 * TB, 1, 5, 1.21 * GB)
    assert 69 <= r.days_to_exhaustion <= 71
    assert r.years_to_exhaustion == pytest.approx(r.days_to_exhaustion / 365)
    assert r.min_capacity_bytes == pytest.approx(104.544 * TB)
    assert r.allowed_write_rate_Bps == pytest.approx(4e12 / 86400)
    d = r.to_dict()
    assert d["writable_bytes"] == 7300 * TB and d["drives"] == 1
    assert d["target_write_rate_Bps"] is None
    json.dumps(d)  # plain values only


def test_report_spreads_the_rate_over_drives():
    one = EnduranceReport(4 * TB, 1, 5, 1.21 * GB)
    two = EnduranceReport(4 * TB, 1, 5, 1.21 * GB, drives=2)
    assert two.drive_rates == (0.605 * GB, 0.605 * GB)
    assert two.days_to_exhaustion == pytest.approx(2 * one.days_to_exhaustion)
    assert two.writable_bytes == 2 * one.writable_bytes
    assert two.allowed_write_rate_Bps == pytest.approx(2 * one.allowed_write_rate_Bps)
    # The aggregate capacity needed does not depend on how it is split.
    assert two.min_capacity_bytes == one.min_capacity_bytes


def test_report_uneven_drives_first_to_wear_out_sets_the_life():
    r = EnduranceReport(4 * TB, 1, 5, drives=2, per_drive_rates=(1.0 * GB, 0.21 * GB))
    assert r.write_rate_Bps == pytest.approx(1.21 * GB)
    assert r.days_to_exhaustion == pytest.approx(days_to_exhaustion(4 * TB, 1, 5, 1.0 * GB))
    assert r.budget_fraction == pytest.approx(budget_fraction(1.0 * GB, 4 * TB, 1))


def test_report_target_days():
    r = EnduranceReport(4 * TB, 1, 5, 1.21 * GB, target_days=730)
    assert days_to_exhaustion(4 * TB, 1, 5, r.target_write_rate_Bps) == pytest.approx(730)
    assert days_to_exhaustion(r.target_min_capacity_bytes, 1, 5, 1.21 * GB) == pytest.approx(730)


def test_zero_rate_report_serialises_infinite_life_as_null():
    d = EnduranceReport(4 * TB).to_dict()
    assert d["days_to_exhaustion"] is None and d["budget_fraction"] == 0


# -- replay JSON -------------------------------------------------------------------------------

def write(tmp_path, data, name="replay.json"):
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


def test_replay_rates_from_every_accepted_form(tmp_path):
    data = {
        "config": {"duration_s": 1000.0, "trace": "weka"},
        "policies": {
            "saria": {"ssd_bytes_written": 1.21e12},                       # config duration
            "full": {"ssd_bytes_written": 3e12, "duration_s": 500.0},        # own duration
            "direct": {"ssd_write_rate_Bps": 7e8, "ssd_bytes_written": 1},  # rate wins
        },
    }
    rates = replay_write_rates(data)
    assert rates == {"saria": pytest.approx(1.21e9), "full": pytest.approx(6e9), "direct": 7e8}
    reports = reports_from_replay(write(tmp_path, data), capacity_bytes=4 * TB, dwpd=1, years=5)
    assert list(reports) == ["saria", "full", "direct"]
    assert 69 <= reports["saria"].days_to_exhaustion <= 71
    assert reports["saria"].label == "saria"


def test_replay_per_drive_bytes(tmp_path):
    data = {"config": {"duration_s": 100}, "policies": {"p": {"ssd_bytes_written_per_drive": [1e11, 3e11]}}}
    r = reports_from_replay(data, capacity_bytes=4 * TB)["p"]
    assert r.drives == 2 and r.drive_rates == (1e9, 3e9)
    with pytest.raises(ConfigError, match="2 drives, not 3"):
        reports_from_replay(data, drives=3)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"config": {}, "policies": {"saria": {"ssd_bytes_written": 5}}}, "missing key 'duration_s'"),
        ({"policies": {"saria": {"ssd_bytes_written": 5}}}, "missing key 'duration_s'"),
        ({"config": {"duration_s": 1}, "policies": {"saria": {"hits": 5}}}, "missing key 'ssd_bytes_written'"),
        ({"config": {"duration_s": 0}, "policies": {"saria": {"ssd_bytes_written": 5}}}, "positive"),
        ({"config": {"duration_s": 1}, "policies": {"saria": {"ssd_bytes_written": -5}}}, "non-negative"),
        ({"config": {}}, "'policies'"),
        ([1, 2], "'policies'"),
    ],
)
def test_replay_errors_name_the_missing_key(tmp_path, data, message):
    with pytest.raises(ConfigError, match=message) as info:
        reports_from_replay(write(tmp_path, data))
    assert "replay.json" in str(info.value)
    if "policies" in message:
        return
    assert "policies.saria" in str(info.value)


def test_replay_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        reports_from_replay(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        reports_from_replay(bad)


# -- the CLI, in-process -----------------------------------------------------------------------

def cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    endurance_cmd.register(parser.add_subparsers())
    args = parser.parse_args(["endurance", *argv])
    return args.func(args)


def test_cli_70_day_example(capsys, tmp_path):
    out = tmp_path / "e.json"
    assert cli("--capacity", "4TB", "--dwpd", "1", "--years", "5", "--write-rate", "1.21GB/s",
               "--json", str(out)) == 0
    text = capsys.readouterr().out
    assert "69.8 days" in text
    assert "104.5 TB" in text  # 86.4 x 1.21 TB of SSD for five years
    assert "7.3 PB" in text
    [d] = json.loads(out.read_text())
    assert 69 <= d["days_to_exhaustion"] <= 71


def test_cli_defaults_are_a_dgx_h100_gpu(capsys, tmp_path):
    out = tmp_path / "e.json"
    cli("--write-rate", "1GB/s", "--target-days", "2y", "--json", str(out))
    [d] = json.loads(out.read_text())
    assert d["capacity_bytes"] == 3_840_000_000_000 and d["dwpd"] == 1 and d["years"] == 5
    assert d["min_capacity_bytes"] == pytest.approx(86.4e12)
    assert d["target_days"] == 730
    assert "write rate allowed for 730 days" in capsys.readouterr().out


def test_cli_replay_json(capsys, tmp_path):
    p = write(tmp_path, {"config": {"duration_s": 1000},
                         "policies": {"saria": {"ssd_bytes_written": 4e11},
                                      "full_duplicate": {"ssd_bytes_written": 1.21e12}}})
    assert cli("--capacity", "4TB", "--replay-json", str(p)) == 0
    text = capsys.readouterr().out
    assert "saria" in text and "full_duplicate" in text and "69.8 days" in text


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--capacity", "4XB", "--write-rate", "1GB/s"], "--capacity"),
        (["--capacity", "0", "--write-rate", "1GB/s"], "--capacity"),
        (["--capacity=-4TB", "--write-rate", "1GB/s"], "--capacity"),
        (["--write-rate", "10Gbps"], "--write-rate"),
        (["--write-rate", "fast"], "--write-rate"),
        (["--write-rate", "nan"], "--write-rate"),
        (["--dwpd", "0", "--write-rate", "1GB/s"], "--dwpd"),
        (["--dwpd", "one", "--write-rate", "1GB/s"], "--dwpd"),
        (["--years", "-5", "--write-rate", "1GB/s"], "--years"),
        (["--drives", "1.5", "--write-rate", "1GB/s"], "--drives"),
        (["--drives", "0", "--write-rate", "1GB/s"], "--drives"),
        (["--target-days", "soon", "--write-rate", "1GB/s"], "--target-days"),
        (["--target-days", "0", "--write-rate", "1GB/s"], "--target-days"),
    ],
)
def test_cli_bad_input_names_the_flag(argv, flag, capsys):
    with pytest.raises(ConfigError) as info:
        cli(*argv)
    assert info.value.key == flag
    assert isinstance(info.value, SariaError) and "\n" not in str(info.value)
    assert capsys.readouterr().out == ""


def test_cli_missing_replay_file_is_a_saria_error(tmp_path):
    with pytest.raises(SariaError, match="no such file"):
        cli("--replay-json", str(tmp_path / "absent.json"))


def test_cli_needs_exactly_one_source(capsys):
    with pytest.raises(SystemExit) as info:
        cli("--capacity", "4TB")
    assert info.value.code == 2
    with pytest.raises(SystemExit):
        cli("--write-rate", "1GB/s", "--replay-json", "x.json")
