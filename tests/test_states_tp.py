"""Recurrent-state checkpoints with tensor parallelism, without vLLM: two
ranks' ``StateMover``s over one shared DRAM pool (mapped twice, as by two
worker processes) and one 2-part SSD store. Each rank writes and reads only
its part of a checkpoint's slots (``states.py``), and the scheduler's op
ledger ends a checkpoint's copy only once every rank reported it."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from saria.connector.groups import GroupLayout
from saria.connector.layout import Geometry
from saria.connector.meta import Medium, StateCopy
from saria.connector.ops import OpTracker
from saria.connector.states import StateMover
from saria.runtime.backend import state_keys
from saria.tiers.dram import DramPool, private_dir
from saria.tiers.ssd import SsdStore

TP = 2
PAGE = 8192         # one attention page (one attention layer): a rank's part of a slot
STATE = 6000        # content bytes of one recurrent layer's state (per rank)
STRIDE = 8192       # vLLM's padded page of a state layer
BLOCKS = 8          # KV blocks per layer
# three recurrent layers in two groups; a rank's share (18000 B) spans 3 parts
# of 8192 B, its second layer across a part's end
GROUPS = GroupLayout(attn_group_ids=(0,), windows=(0,), attn_layers=(("attn",),),
                     page_bytes=PAGE, block_size=16, state_group_ids=(1, 2),
                     state_layers=(("gdn0",), ("gdn1", "gdn2")), state_page_bytes=STATE,
                     state_stride=STRIDE)
SLOTS = 8


def geo(rank: int) -> Geometry:
    return Geometry(16, PAGE, ("attn",), TP, rank, BLOCKS, "torch.bfloat16", "fake", "test",
                    groups=GROUPS)


UNITS = -(-geo(0).state_bytes // geo(0).slot_bytes)  # the core's state_units


def caches(seed: int | None) -> dict[str, torch.Tensor]:
    """State caches as vLLM registers them (bf16 pages): random bytes, or zeros."""
    out = {}
    for i, name in enumerate(GROUPS.state_layer_names):
        if seed is None:
            b = torch.zeros(BLOCKS, STRIDE, dtype=torch.uint8)
        else:
            g = torch.Generator().manual_seed(seed * 10 + i)
            b = torch.randint(0, 256, (BLOCKS, STRIDE), dtype=torch.uint8, generator=g)
        out[name] = b.view(torch.bfloat16)
    return out


def state_bytes(kv: dict[str, torch.Tensor], kv_ids: list[int]) -> list[bytes]:
    """Every recurrent layer's state content at its group's block of `kv_ids`."""
    return [kv[n].view(torch.uint8)[kv_ids[g], :STATE].numpy().tobytes()
            for n, g in zip(GROUPS.state_layer_names, GROUPS.state_layer_groups)]


@pytest.fixture
def pools(request):
    path = os.path.join(private_dir("/dev/shm"), f"saria-test-states-{os.getpid()}")
    made = [DramPool(SLOTS, geo(0).slot_bytes, shared=path, prefault=False) for _ in range(TP)]
    yield made
    made[0].unlink()


def test_each_rank_stores_and_loads_only_its_part_of_a_checkpoint(pools, tmp_path):
    assert UNITS == 3 and geo(0).state_rank_bytes > PAGE
    kv = [caches(seed=r + 1) for r in range(TP)]         # each rank's own states
    movers = [StateMover(kv[r], geo(r), pools[r], (str(tmp_path / "ssd"),)) for r in range(TP)]
    slots, stored_at = [5, 1, 6], [3, 7]                # the checkpoint's slots; its KV blocks
    pool = pools[0].array
    pool[:] = 0xA5                                      # nothing there yet
    movers[0].store(StateCopy(1, "r", Medium.KV, Medium.DRAM, stored_at, slots))
    # rank 0 wrote its part of the slots (the first 18000 B of them) and nothing else
    share0 = pool[slots, :PAGE].reshape(-1)
    assert share0[:3 * STATE].tobytes() == b"".join(state_bytes(kv[0], stored_at))
    untouched = np.ones(pool.shape, bool)
    untouched[slots, :PAGE] = False
    assert (pool[untouched] == 0xA5).all()
    before = pool[slots, :PAGE].copy()
    movers[1].store(StateCopy(1, "r", Medium.KV, Medium.DRAM, stored_at, slots))
    assert (pool[slots, :PAGE] == before).all()         # rank 1 left rank 0's part alone
    share1 = pool[slots, PAGE:].reshape(-1)
    assert share1[:3 * STATE].tobytes() == b"".join(state_bytes(kv[1], stored_at))

    # DRAM -> zeroed state caches, at other KV blocks: each rank gets its own bytes back
    load_at = [2, 4]
    for r in range(TP):
        fresh = caches(seed=None)
        mover = StateMover(fresh, geo(r), pools[r], ())
        assert mover.load(StateCopy(2, "r", Medium.DRAM, Medium.KV, load_at, slots))
        assert state_bytes(fresh, load_at) == state_bytes(kv[r], stored_at)
        for name in GROUPS.state_layer_names:       # only the state's content bytes moved
            page = fresh[name].view(torch.uint8)
            assert not page[:, STATE:].any() and not page[[0, 1, 3, 5, 6, 7]].any()

    # SSD: the checkpoint's slots written as 2-part blocks under its state keys
    # (as the cache's writer does), each rank reading back its part alone
    store = SsdStore(str(tmp_path / "ssd"), 64 * geo(0).slot_bytes, geo(0).slot_bytes, parts=TP)
    keys = state_keys(np.arange(32, dtype=np.uint8), UNITS)
    handles = store.write(keys, np.ascontiguousarray(pool[slots]))
    assert (handles >= 0).all()
    store.sync()
    try:
        for r in range(TP):
            fresh = caches(seed=None)
            mover = StateMover(fresh, geo(r), pools[r], (str(tmp_path / "ssd"),))
            c = StateCopy(3, "r", Medium.SSD, Medium.KV, load_at, handles.tolist(), keys.tobytes())
            assert mover.load(c)
            assert state_bytes(fresh, load_at) == state_bytes(kv[r], stored_at)
            # a block that fails its verification (not the key it was written
            # under): nothing is copied, the worker reports the read failed
            wrong = state_keys(np.ones(32, np.uint8), UNITS)
            zero = caches(seed=None)
            other = StateMover(zero, geo(r), pools[r], (str(tmp_path / "ssd"),))
            assert not other.load(StateCopy(4, "r", Medium.SSD, Medium.KV, load_at,
                                            handles.tolist(), wrong.tobytes()))
            assert all(not t.view(torch.uint8).any() for t in zero.values())
            mover.close()
            other.close()
    finally:
        store.close()
    for m in movers:
        m.close()


def test_a_checkpoint_copy_ends_only_when_every_rank_reported_it():
    """The scheduler's ledger: a state op waits for both ranks, one failed
    rank fails it (the checkpoint is dropped), and past its deadline it is
    quarantined like a store -- a rank may still write its part of the slots."""
    now = [0.0]
    ops = OpTracker(TP, timeout_s=30.0, clock=lambda: now[0])
    ok = ops.start("state", "r", None)
    assert ops.ack(ok, ok=True) is None                 # rank 0 only: not ready
    done = ops.ack(ok, ok=True)
    assert done is not None and done.ok
    bad = ops.start("state", "r", None)
    assert ops.ack(bad, ok=False) is None               # rank 0 failed: still waits for rank 1
    done = ops.ack(bad, ok=True)
    assert done is not None and not done.ok
    late = ops.start("state", "r", None)
    ops.ack(late, ok=True)
    now[0] = 31.0
    (expired,) = ops.expired()
    assert expired.op_id == late and expired.quarantined and ops.quarantined() == 1
    done = ops.ack(late, ok=True)                       # the last report, however late
    assert done is not None and not done.ok and len(ops) == 0
