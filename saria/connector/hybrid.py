"""The scheduler's part for models with several KV-cache groups (``groups.py``).

Kept apart from ``scheduler.py`` so that a plain model's flow reads as before:
these functions take the scheduler and a request's state and do the
per-group bookkeeping.

* Block ids: vLLM gives one block table per group. ``_Req.block_ids`` stays
  the first attention group's (positions, lengths); ``_Req.groups`` holds
  every attention group's when there are several, and each transfer carries
  them (``Transfer.groups``), null blocks included (the movers skip them).
* Stores: a block is stored only while every attention group still holds it
  (a sliding-window group frees blocks that left the window).
* Hits of a hybrid model end at a recurrent-state checkpoint: the index
  (``RadixIndex(hybrid=True)``) answers with the deepest boundary that has
  one, so the hit is never an unaligned state.
* Checkpoints: the states vLLM computed this step at block boundaries
  (``boundary_state_offloads``, the prompt-tail checkpoint among them)
  become the core's checkpoints on their block's key (``prepare_checkpoint``);
  a state already held (a loaded one vLLM offers again) is not copied twice.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from saria.connector.groups import NULL_BLOCK
from saria.connector.meta import Medium, StateCopy
from saria.errors import ConfigError
from saria.index import Tier


def check_supported(cfg, geo) -> None:
    """One-line refusals for what hybrid models do not have yet."""
    if not geo.hybrid:
        return
    if cfg.server is not None:
        raise ConfigError("server", "saria serve does not hold recurrent-state checkpoints yet "
                          "(hybrid Mamba/GDN models): use an in-process cache (no 'server')")
    if cfg.remote is not None:
        raise ConfigError("remote", "the cluster tier does not publish recurrent-state "
                          "checkpoints (hybrid Mamba/GDN models): drop 'remote'")


def set_ids(st, geo, ids_by_group) -> None:
    if geo.groups is None:
        st.block_ids = list(ids_by_group[0])
        return
    attn = geo.groups.attn_ids(ids_by_group)
    st.block_ids = attn[0]
    st.groups = attn if len(attn) > 1 else None
    st.state_ids = [list(ids_by_group[g]) for g in geo.groups.state_group_ids]


def extend_ids(st, geo, ids_by_group) -> None:
    if geo.groups is None:
        st.block_ids.extend(ids_by_group[0])
        return
    attn = geo.groups.attn_ids(ids_by_group)
    for have, g in zip(st.state_ids, geo.groups.state_group_ids):
        have.extend(ids_by_group[g])
    if st.groups is None:
        st.block_ids.extend(attn[0])
        return
    for have, new in zip(st.groups, attn):
        have.extend(new)
    st.block_ids = st.groups[0]


def group_ids(st, positions) -> list[list[int]] | None:
    """Every attention group's block ids at `positions` (None: one group)."""
    if st.groups is None:
        return None
    pos = [int(p) for p in positions]
    return [[g[p] for p in pos] for g in st.groups]


def storable(st, full: int) -> int:
    """Blocks below this are held by every attention group from ``st.stored``
    on; a block some group already freed is never stored (its page is gone)."""
    if st.groups is None:
        return full
    for p in range(st.stored, min(full, min(len(g) for g in st.groups))):
        if any(g[p] == NULL_BLOCK for g in st.groups):
            return p
    return full


def state_load(sched, st, op_id: int, rid: str, spec, hit: int) -> StateCopy:
    """The checkpoint at the end of a hybrid hit, into the state block vLLM
    allocated at the boundary in every recurrent group."""
    ck = spec.checkpoint
    if ck is None or ck.boundary != hit:  # the index ends hybrid hits at a checkpoint
        raise RuntimeError(f"saria: a hybrid hit of {hit} blocks without its checkpoint ({ck})")
    tier, parts, keys = sched.cache.checkpoint_source(spec)
    kv = [st.state_ids[g][hit - 1] for g in range(len(st.state_ids))]
    src = Medium.DRAM if tier == Tier.DRAM else Medium.SSD
    return StateCopy(op_id, rid, src, Medium.KV, kv, parts.tolist(), keys.tobytes())


def state_failed(cache, spec, bad: np.ndarray) -> bool:
    """Whether the SSD handles `bad` that failed their read include the
    checkpoint of load `spec` (the worker reports them as it reports KV
    blocks'; a hybrid model runs in process, so the handles are the cache's)."""
    ck = spec.checkpoint
    if ck is None or ck.tier != Tier.SSD:
        return False
    _, parts, _ = cache.checkpoint_source(spec)
    return bool(np.isin(parts, bad).any())


def plan_checkpoints(sched, so) -> list[StateCopy]:
    """This step's boundary states as checkpoints, each copied after the forward."""
    block_state = getattr(so, "kv_connector_block_state", None)
    offers = getattr(block_state, "boundary_state_offloads", None) or {}
    gl = sched.geo.groups
    slot_of = {gid: i for i, gid in enumerate(gl.state_group_ids)}
    out = []
    for rid, entries in offers.items():
        st = sched.reqs.get(rid)
        if st is None or not st.cacheable:
            continue
        by_boundary: dict[int, dict[int, int]] = defaultdict(dict)
        for gid, block_id, tokens in entries:
            if gid in slot_of and block_id != NULL_BLOCK:
                by_boundary[int(tokens)][slot_of[gid]] = int(block_id)
        for tokens, blocks in sorted(by_boundary.items()):
            n = tokens // sched.block_size
            if tokens % sched.block_size or n == 0 or len(blocks) != len(slot_of):
                continue  # only whole-block boundaries of every recurrent group
            sched.hasher.extend(st.chain, st.request, n)
            if len(st.chain) < n:
                continue
            spec = sched.cache.prepare_checkpoint(st.chain.array[:n], keep=st.local)
            if spec is None:
                continue  # the boundary's block is in no tier: nothing to hang it on
            if spec.dram_handle is None:  # held already (or no room): nothing to copy
                sched.cache.complete_checkpoint(spec)
                continue
            op_id = sched.ops.start("state", rid, spec)
            slots = sched.cache.state_slots(spec)
            out.append(StateCopy(op_id, rid, Medium.KV, Medium.DRAM,
                                 [blocks[i] for i in range(len(slot_of))],
                                 np.asarray(slots).tolist()))
            sched.counters["checkpoint_ops"] = sched.counters.get("checkpoint_ops", 0) + 1
    return out
