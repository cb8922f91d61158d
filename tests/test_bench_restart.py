"""saria bench restart, quick mode: the figures it reports are the store's
own (bytes read at open per mode), every mode recovers every block, and the
CLI writes the JSON BENCHMARKS.md quotes. No timings are asserted."""

from __future__ import annotations

import json

from saria.bench.restart import RestartBenchConfig, run_restart_bench
from saria.cli.main import main
from saria.tiers.ssd import slot_bytes_for


def test_restart_bench_reads_per_mode(tmp_path):
    block = 64 << 10
    res = run_restart_bench(RestartBenchConfig(dir=tmp_path, sizes=(4 << 20, 8 << 20), block_bytes=block,
                                               repeat=2))
    slot = slot_bytes_for(block)
    assert [r["size_bytes"] for r in res["stores"]] == [4 << 20, 8 << 20]
    for row in res["stores"]:
        n = (row["size_bytes"] // slot)
        assert row["blocks"] == n
        m = row["modes"]
        assert m["journal"]["source"] == "journal"
        assert m["full"]["source"] == "full scan" and m["header"]["source"] == "header scan"
        # the journal: superblock, a checkpoint of n entries of 64 B, an empty segment
        assert m["journal"]["recovery_bytes_read"] == 4096 + 4096 + -(-n * 64 // 4096) * 4096 + 4096
        assert m["full"]["recovery_bytes_read"] == row["capacity_bytes"]
        assert m["header"]["recovery_bytes_read"] == 4096 + n * 4096  # one page per slot (> 64 KiB)
        assert len(m["journal"]["seconds"]) == 2 and row["full_vs_journal_seconds"] > 0
    assert not any(tmp_path.iterdir())  # the stores are removed


def test_restart_bench_cli(tmp_path):
    out = tmp_path / "r.json"
    assert main(["bench", "restart", "--dir", str(tmp_path / "w"), "--sizes", "2MiB", "--block", "64KiB",
                 "--repeat", "1", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["stores"][0]["blocks"] == (2 << 20) // slot_bytes_for(64 << 10) and set(res["stores"][0]["modes"]) == {"journal", "header", "full"}
    assert main(["bench", "restart", "--dir", str(tmp_path / "w"), "--sizes", "0"]) == 2
