"""``saria bench io`` on a tiny workload: the JSON keys, the ratios, fio present or absent."""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys

import pytest

from saria.bench.io import fio as bench_fio
from saria.cli import bench_io_cmd

RATIOS = ("ssd_write_vs_fio", "ssd_read_vs_fio", "dram_vs_memcpy",
          "ssd_write_vs_lmcache", "ssd_read_vs_lmcache")
TINY = ["--size", "8MiB", "--block", "1MiB", "--qd", "4", "--repeat", "1"]


def store_importable() -> bool:
    try:
        return importlib.util.find_spec("saria.tiers.ssd") is not None
    except (ImportError, ValueError):
        return False


def run_cli(argv: list[str]) -> int:
    """Through the real ``saria`` parser; ``register`` adds ``bench io`` if bench_cmd has not."""
    from saria.cli import main as cli

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    bench_io_cmd.register(sub)
    return _main(parser, argv)


def _main(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    from saria.errors import SariaError

    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except SariaError as exc:
        print(f"saria: error: {exc}", file=sys.stderr)
        return 2


def check_common(d: dict, tmp_path) -> None:
    for key in RATIOS + ("params", "machine", "fio", "saria_ssd", "dram", "lmcache", "goals"):
        assert key in d, key
    assert d["params"]["size"] == 8 << 20 and d["params"]["block"] == 1 << 20
    assert d["params"]["qd"] == 4 and d["params"]["repeat"] == 1
    dram = d["dram"]
    for k in ("memcpy_gbps", "scatter_gbps", "gather_gbps"):
        assert dram[k] > 0
    assert d["dram_vs_memcpy"] == pytest.approx(
        min(dram["scatter_gbps"], dram["gather_gbps"]) / dram["memcpy_gbps"])
    assert d["lmcache"]["enabled"] is False and d["ssd_write_vs_lmcache"] is None
    ssd = d["saria_ssd"]
    if store_importable() and ssd["reason"] is None:
        assert ssd["write_gbps"] > 0 and ssd["read_gbps"] > 0
    else:
        assert ssd["write_gbps"] is None and ssd["reason"]
        assert d["ssd_write_vs_fio"] is None and d["ssd_read_vs_fio"] is None
    # Nothing left behind in the measured directory but the JSON.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "data"]
    assert list((tmp_path / "data").iterdir()) == []


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed (apt-get install fio)")
def test_bench_io_with_fio(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = run_cli(["bench", "io", "--dir", str(tmp_path / "data"), "--json", str(out), *TINY])
    assert rc == 0
    d = json.loads(out.read_text())
    check_common(d, tmp_path)
    fio = d["fio"]
    assert fio["available"] and fio["reason"] is None
    assert fio["write_gbps"] > 0 and fio["read_gbps"] > 0
    assert fio["ioengine"] in ("io_uring", "libaio", "psync")
    if d["saria_ssd"]["write_gbps"] is not None:
        assert d["ssd_write_vs_fio"] == pytest.approx(
            d["saria_ssd"]["write_gbps"] / fio["write_gbps"])
        assert d["ssd_read_vs_fio"] == pytest.approx(
            d["saria_ssd"]["read_gbps"] / fio["read_gbps"])
    assert "saria / fio" in capsys.readouterr().out


def test_bench_io_without_fio(tmp_path, capsys, monkeypatch):
    real_which = shutil.which
    monkeypatch.setattr(bench_fio.shutil, "which",
                        lambda name, *a, **k: None if name == "fio" else real_which(name, *a, **k))
    out = tmp_path / "bench.json"
    rc = run_cli(["bench", "io", "--dir", str(tmp_path / "data"), "--json", str(out), *TINY])
    assert rc == 0
    cap = capsys.readouterr()
    assert "apt-get install fio" in cap.err
    d = json.loads(out.read_text())
    check_common(d, tmp_path)
    assert d["fio"]["available"] is False and "apt-get install fio" in d["fio"]["reason"]
    assert d["fio"]["write_gbps"] is None and d["fio"]["read_gbps"] is None
    assert d["ssd_write_vs_fio"] is None and d["ssd_read_vs_fio"] is None
    assert d["dram_vs_memcpy"] > 0


def test_require_fio_fails_without_fio(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench_fio.shutil, "which", lambda name, *a, **k: None)
    rc = run_cli(["bench", "io", "--dir", str(tmp_path), "--require-fio", *TINY])
    assert rc == 2
    assert "apt-get install fio" in capsys.readouterr().err


@pytest.mark.parametrize("extra, match", [
    (["--block", "1000"], "multiple of 4096"),
    (["--size", "64KiB", "--block", "1MiB"], "at least one block"),
    (["--qd", "0"], "--qd must be at least 1"),
    (["--repeat", "0"], "--repeat must be at least 1"),
])
def test_bad_arguments(tmp_path, capsys, extra, match):
    rc = run_cli(["bench", "io", "--dir", str(tmp_path), *TINY, *extra])
    assert rc == 2
    assert match in capsys.readouterr().err
