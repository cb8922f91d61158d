"""The geometry both sides of the connector agree on, from vLLM's configs.

A saria block is one vLLM KV block of every layer (and every tensor-parallel
rank): a DRAM slot holds ``tp_size * num_layers`` pages of ``page_bytes``,
rank-major, then in the KV-cache group's layer order. Pages are opaque bytes
(the CPU backend stores K transposed inside a page; FlashAttention splits K
and V): saria only ever moves whole pages, so it never depends on what is
inside one -- but pages are not portable between layouts, which is why the
namespace below goes into the SSD store's directory name.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from saria.connector.groups import GroupLayout
from saria.errors import ConfigError


@dataclass(frozen=True)
class Geometry:
    block_size: int
    page_bytes: int
    layer_names: tuple[str, ...]
    tp_size: int
    tp_rank: int
    num_gpu_blocks: int
    dtype: str
    model: str
    kv_layout: str
    groups: GroupLayout | None = None  # vLLM's KV-cache groups (None: one attention group)

    @property
    def num_layers(self) -> int:
        return len(self.layer_names)

    @property
    def rank_bytes(self) -> int:
        return self.num_layers * self.page_bytes

    @property
    def slot_bytes(self) -> int:
        return self.tp_size * self.rank_bytes

    @property
    def num_layer_groups(self) -> int:
        """Attention groups with their own block tables (1 for a plain model)."""
        return 1 if self.groups is None else len(self.groups.attn_group_ids)

    def layer_group(self, layer: int) -> int:
        """The attention group (index into a transfer's ``groups``) of `layer`."""
        return 0 if self.groups is None else self.groups.layer_groups[layer]

    @property
    def hybrid(self) -> bool:
        """Recurrent layers: their states are checkpoints (``groups.py``)."""
        return self.groups is not None and self.groups.hybrid

    @property
    def async_loads(self) -> bool:
        """Whether loads are asynchronous in vLLM's sense: with several KV-cache
        groups vLLM takes no block-level load errors (block ids are unique
        only within a group; it raises), only a failed request
        (``failed_recving``), and only for a request that waits for its load
        (``WAITING_FOR_REMOTE_KVS``). So such a request waits one step for
        its load and, when any of it fails, is recomputed from vLLM's own hit
        -- and a failed load never leaves a block in vLLM's prefix cache
        (vLLM caches an async load's blocks only once it succeeded)."""
        g = self.groups
        return g is not None and len(g.attn_group_ids) + len(g.state_group_ids) > 1

    @property
    def state_rank_bytes(self) -> int:
        g = self.groups
        return len(g.state_layer_names) * g.state_page_bytes if self.hybrid else 0

    @property
    def state_bytes(self) -> int:
        """One checkpoint: every recurrent layer's state, every rank's share;
        in its slots each rank's share fills that rank's part (``states.py``)."""
        return self.tp_size * self.state_rank_bytes

    def namespace(self, hash_algo: str, hash_seed: str) -> str:
        """A digest of what makes a stored page meaningful to this engine."""
        parts = (self.model, self.dtype, self.block_size, self.page_bytes, self.num_layers,
                 self.tp_size, self.kv_layout, hash_algo, hash_seed)
        if self.groups is not None and (len(self.groups.attn_group_ids) > 1 or self.hybrid):
            parts += self.groups.describe()
        return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def geometry(vllm_config, kv_cache_config, *, rank: int | None = None) -> Geometry:
    """Reads the geometry; raises ``ConfigError`` for models saria cannot hold."""
    from saria.connector.groups import group_layout

    groups = group_layout(kv_cache_config)  # ConfigError for layers saria cannot hold
    spec = kv_cache_config.kv_cache_groups[groups.attn_group_ids[0]].kv_cache_spec
    par = vllm_config.parallel_config
    if par.pipeline_parallel_size != 1:
        raise ConfigError("pipeline_parallel_size", "saria does not support pipeline parallelism")
    if rank is None:
        rank = 0
    mc = vllm_config.model_config
    layout = kv_cache_config.kv_cache_layout or os.environ.get("VLLM_KV_CACHE_LAYOUT") or "default"
    return Geometry(block_size=spec.block_size, page_bytes=spec.page_size_bytes,
                    layer_names=groups.layer_names,
                    tp_size=par.tensor_parallel_size, tp_rank=rank,
                    num_gpu_blocks=kv_cache_config.num_blocks, dtype=str(spec.dtype),
                    model=str(mc.model), kv_layout=f"{layout}/{vllm_config.device_config.device_type}",
                    groups=groups)


def pool_path(vllm_config) -> str:
    """The shared DRAM pool's file: one per engine (``engine_id`` is per engine), in
    this user's private folder on ``/dev/shm`` (``private_dir``: no other user can
    plant or swap it; ``DramPool`` also checks the file's owner and mode)."""
    from saria.tiers.dram import private_dir

    engine = vllm_config.kv_transfer_config.engine_id
    return os.path.join(private_dir("/dev/shm"), f"saria-pool-{engine}")
