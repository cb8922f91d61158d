"""Typed values the cache core hands to whoever moves the bytes, and back.

A *spec* is the core's answer to a ``prepare_*`` call: which blocks, in which
slots, locked in the index until the matching ``complete_*`` call. The mover
(the replay's timing model, the real tiers, a vLLM worker) never decides
anything; it reads or fills exactly the slots a spec names and reports
whether it managed to.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from saria.index import CheckpointRef, Tier


@dataclass(slots=True)
class LoadSpec:
    """A cached prefix made readable by ``prepare_load``.

    Block ``i`` of ``path`` (for ``start <= i < num_blocks``) is read from
    tier ``tiers[i]`` (DRAM when it has a DRAM copy, else SSD; -1 for a block
    only the replay's GPU tier holds, which is never read) at
    ``slots[i]`` (a DRAM slot or an SSD handle). Blocks before ``start`` are
    held by the engine already: locked, not read. ``checkpoint`` is a hybrid
    model's state at the end of the prefix. The whole path stays locked until
    ``complete_load``, so no eviction can reuse a slot mid-read.
    """

    path: np.ndarray
    start: int
    tiers: np.ndarray
    slots: np.ndarray
    checkpoint: CheckpointRef | None = None
    # Positions only the cluster tier held (``Tier.REMOTE``): ``slots`` there
    # are DRAM slots the blocks are fetched into (filling until the core's
    # ``complete_fetch``; after it, verified DRAM blocks).
    remote: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def num_blocks(self) -> int:
        return int(self.path.shape[0])

    def positions(self, tier: Tier) -> np.ndarray:
        """Positions at or after ``start`` read from `tier`."""
        pos = np.flatnonzero(self.tiers == tier)
        return pos[pos >= self.start]

    def hits(self, served: int) -> tuple[int, int]:
        """``(DRAM, SSD)`` blocks read by a load that served its first
        `served` blocks (what ``complete_load`` returned)."""
        ssd = int(np.count_nonzero(self.tiers[self.start:served] == Tier.SSD))
        return max(0, served - self.start) - ssd, ssd

    def remote_hits(self, served: int) -> int:
        """Of the DRAM blocks of ``hits(served)``, those fetched from the cluster tier."""
        r = self.remote
        return int(np.count_nonzero((r >= self.start) & (r < served))) if r.size else 0


@dataclass(slots=True)
class StoreSpec:
    """DRAM slots handed out by ``prepare_store`` or ``prepare_promotion``.

    Block ``positions[i]`` of ``path`` goes to DRAM slot ``slots[i]``; its
    bytes are undefined until the mover fills the slot. ``masks`` are those
    blocks' residency masks before the call. ``path`` is locked until
    ``complete_store``; admission reads the slots (an SSD write) only after a
    successful completion. A promotion is not a new block: it skips
    write-through admission (the block is already on the SSD).
    """

    path: np.ndarray
    positions: np.ndarray
    slots: np.ndarray
    masks: np.ndarray
    promotion: bool = False
    # Write-through of new blocks DRAM could not take (``prepare_store(direct=True)``):
    # ``chain[direct]`` go straight to the SSD, their bytes given to ``complete_store``.
    direct: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    chain: np.ndarray = field(default_factory=lambda: np.zeros((0, 32), np.uint8))

    @property
    def num_blocks(self) -> int:
        return int(self.positions.size)

    @property
    def direct_keys(self) -> np.ndarray:
        return self.chain[self.direct]

    @property
    def keys(self) -> np.ndarray:
        return self.path[self.positions]


@dataclass(slots=True)
class StateSpec:
    """A hybrid model's state checkpoint kept by ``prepare_checkpoint`` at the
    end of ``path``. When ``dram_handle`` is set the mover must copy the
    state into that DRAM handle before ``complete_checkpoint``. ``path`` is
    locked until then."""

    path: np.ndarray
    dram_handle: int | None


@dataclass(slots=True)
class SsdWrite:
    """One batch of SSD writes the core asked a backend for: ``keys[i]``'s
    bytes are in DRAM at ``sources[i]`` (a block's slot, or a checkpoint's
    state handle when ``state``). The backend answers through the core's
    ``complete_ssd_write`` with one SSD handle per key (-1: not written)."""

    keys: np.ndarray
    sources: np.ndarray | None
    state: bool = False
    # A write of bytes in hand (not in DRAM): ``rows`` (None where the
    # backend needs no bytes) and the key chain ``path`` with the blocks'
    # ``positions`` in it, so blocks not yet indexed can be added.
    rows: np.ndarray | None = None
    path: np.ndarray | None = None
    positions: np.ndarray | None = None
    # ``held``: the core keeps the DRAM slots at ``sources`` (write-behind
    # victims, readable meanwhile) until the write completes, so an
    # asynchronous backend reads the bytes when it writes them.
    held: bool = False


@dataclass(slots=True)
class CacheStats:
    """What the core decided and saw, since it started."""

    lookups: int = 0
    hit_blocks: dict = field(default_factory=lambda: {"DRAM": 0, "SSD": 0})
    stored_blocks: int = 0
    promoted_blocks: int = 0
    dram_evictions: int = 0
    ssd_evictions: int = 0
    ssd_write_blocks: int = 0       # KV blocks whose SSD write completed
    ssd_write_states: int = 0       # checkpoints whose SSD write completed
    ssd_write_failures: int = 0
    ssd_read_failures: int = 0
    writes_dropped: int = 0         # no SSD room, or the backend's queue was full
    write_behind_full: int = 0      # victims written from a copy: not readable until they landed
    adopted_blocks: int = 0         # SSD blocks found after a restart, put back in the index
    # the cluster tier (``saria.core.remote``)
    remote_found_blocks: int = 0    # REMOTE copies a lookup found and indexed
    remote_hit_blocks: int = 0      # blocks a load served from the cluster (verified)
    remote_load_failures: int = 0   # fetches that did not arrive whole and verified
    remote_dropped_blocks: int = 0  # REMOTE copies that left the index (gone, or tier down)
    remote_published_blocks: int = 0  # puts the cluster holds now (stored or already there)
    remote_publish_failures: int = 0  # puts that failed (nothing local dropped)
    remote_publish_dropped: int = 0   # puts refused at submission (a full queue)
    ssd_writes_skipped_remote: int = 0  # victims not written to the SSD: the cluster holds them
