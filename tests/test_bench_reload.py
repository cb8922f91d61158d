"""``saria bench reload`` on a small configuration: its tensor-parallel section
reports the bytes each rank read (its part of every block, half of the whole
slots at TP 2) and checks every rank's pages byte-exact."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="torch is not installed (the [vllm] extra)")

from saria.bench.io.config import BenchIoError  # noqa: E402
from saria.bench.reload import ReloadBenchConfig, run_reload_bench  # noqa: E402
from saria.tiers.ssd import slot_bytes_for  # noqa: E402


@pytest.mark.parametrize("tp", [2, 4])
def test_each_rank_reads_only_its_part(tmp_path, tp):
    cfg = ReloadBenchConfig(dir=tmp_path, page_bytes=8192, layers=3, blocks=8, repeat=1, tp=tp)
    res = run_reload_bench(cfg)
    t = res["tensor_parallel"]
    part = slot_bytes_for(cfg.slot_bytes, tp) // tp
    assert t["tp"] == tp and t["slot_bytes"] == tp * part
    assert t["bytes_read_per_rank"] == [8 * part] * tp
    assert t["whole_slot_bytes_read_per_rank"] == [8 * tp * part] * tp
    assert t["read_traffic_ratio"] == pytest.approx(1 / tp)
    assert len(t["part_s_per_rank"]) == tp and all(s > 0 for s in t["whole_slot_s_per_rank"])


def test_tp_must_divide_the_page(tmp_path):
    with pytest.raises(BenchIoError, match="--tp must be >= 1 and divide --page-bytes"):
        run_reload_bench(ReloadBenchConfig(dir=tmp_path, page_bytes=8192 + 512, layers=1, blocks=4, tp=3))
