"""A new engine process with the same SSD directory and hash seed hits what
the first one persisted; the first runs vLLM's real multi-process layout
(scheduler and worker in two processes), the second has DRAM for 8 blocks
and reads a 40-block prefix whole from the SSD."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

from vllm_harness import BS, SLOT, Greedy, engine, generate, model_dir, same_greedy

HERE = os.path.dirname(os.path.abspath(__file__))
LONG = [random.Random(11).randrange(3, 500) for _ in range(40 * BS + 5)]  # 40 full blocks
FULL = (len(LONG) - 1) // BS * BS


def _start(model: str, ssd: str, mp: str, **opts) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, os.path.join(HERE, "connector_child.py"), model, ssd,
                             mp, json.dumps({"prompt": LONG, **opts})],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(p: subprocess.Popen) -> dict:
    out, err = p.communicate(timeout=600)
    line = [x for x in out.splitlines() if x.startswith("RESULT ")]
    assert p.returncode == 0 and line, err[-3000:]
    return json.loads(line[-1][7:])


def test_new_process_hits_what_the_first_persisted(tmp_path_factory, tmp_path):
    model = model_dir(tmp_path_factory)
    with engine(model) as llm:
        want = generate(llm, LONG)[0]
    ssd = str(tmp_path / "ssd")
    first_done = tmp_path / "first-done"
    procs = [_start(model, ssd, "1"),      # scheduler and worker in separate processes
             # 8 blocks of DRAM: read from the SSD. Its process imports meanwhile; its
             # engine starts once the first one exited.
             _start(model, ssd, "0", dram_bytes=8 * SLOT, start_after=str(first_done))]
    try:
        first = _result(procs[0])
        first_done.touch()
        assert same_greedy(Greedy(*first["out"]), want) and first["cached"] == 0
        # a DRAM hit through the shared pool across processes
        assert same_greedy(Greedy(*first["again"]), want) and first["again_cached"] == FULL
        second = _result(procs[1])
        assert same_greedy(Greedy(*second["out"]), want) and second["cached"] == FULL
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
