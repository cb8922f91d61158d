"""vLLM's KV-cache groups as saria sees them (hybrid and sliding-window models).

With ``SupportsHMA`` vLLM keeps its hybrid KV cache manager: one group per
slice of layers of one type, each with its own block table, all in one block
pool of one block size. saria keeps one cache core for all of them and one
key per block (a block's key names the prefix, whatever the group):

* attention groups (full and sliding-window): their pages of block ``i`` are
  one saria block (a DRAM slot, an SSD block), as for a plain model. A
  sliding-window group needs only the blocks of the last window before a hit:
  vLLM allocates nothing below it (block id 0, the null block), and saria
  loads nothing there.
* recurrent groups (Mamba, GDN, linear attention: ``MambaSpec``): no page per
  block but a state after a block boundary, which exists only where vLLM
  computed one (``boundary_state_offloads``). These states are the core's
  hybrid *checkpoints* (``prepare_checkpoint``): the state after block ``i``
  hangs on block ``i``'s key, so KV blocks and their checkpoint share one
  admission history. A hit of a hybrid model ends at a checkpoint.

Only the content bytes of a state page are kept (vLLM pads Mamba pages to
the attention page size).
"""

from __future__ import annotations

from dataclasses import dataclass

from saria.errors import ConfigError

NULL_BLOCK = 0  # vLLM's null block: a group holds nothing at that position


@dataclass(frozen=True)
class GroupLayout:
    """Which vLLM groups hold attention pages and which recurrent states."""

    attn_group_ids: tuple[int, ...]      # vLLM group ids of attention groups
    windows: tuple[int, ...]             # per attention group: sliding window (0: full)
    attn_layers: tuple[tuple[str, ...], ...]
    page_bytes: int                      # one attention page (all groups share it)
    block_size: int
    state_group_ids: tuple[int, ...] = ()   # vLLM group ids of recurrent groups
    state_layers: tuple[tuple[str, ...], ...] = ()
    state_page_bytes: int = 0            # content bytes of one layer's state
    state_stride: int = 0                # vLLM's (padded) page of a state layer

    @property
    def hybrid(self) -> bool:
        return bool(self.state_group_ids)

    @property
    def layer_names(self) -> tuple[str, ...]:
        """Attention layers in slot order: group by group."""
        return tuple(n for g in self.attn_layers for n in g)

    @property
    def layer_groups(self) -> tuple[int, ...]:
        """Per attention layer (slot order): its index in ``attn_group_ids``."""
        return tuple(i for i, g in enumerate(self.attn_layers) for _ in g)

    @property
    def state_layer_names(self) -> tuple[str, ...]:
        return tuple(n for g in self.state_layers for n in g)

    @property
    def state_layer_groups(self) -> tuple[int, ...]:
        return tuple(i for i, g in enumerate(self.state_layers) for _ in g)

    def describe(self) -> tuple:
        """What makes stored bytes meaningful, for the store's namespace."""
        return (self.windows, tuple(len(g) for g in self.attn_layers),
                tuple(len(g) for g in self.state_layers), self.state_page_bytes)

    def window_blocks(self, g: int) -> int:
        """Blocks of attention group `g` a hit needs before its boundary (0: all)."""
        w = self.windows[g]
        return 0 if w == 0 else -(-(w - 1) // self.block_size)

    def attn_ids(self, ids_by_group) -> list[list[int]]:
        """The attention groups' block-id lists from vLLM's per-group tuple."""
        return [list(ids_by_group[g]) for g in self.attn_group_ids]


def group_layout(kv_cache_config) -> GroupLayout:
    """Reads vLLM's groups; ``ConfigError`` for kinds saria cannot hold."""
    from vllm.v1.kv_cache_interface import AttentionSpec, MambaSpec, SlidingWindowSpec

    attn, windows, attn_layers, pages, block_sizes = [], [], [], set(), set()
    states, state_layers, state_pages, strides = [], [], set(), set()
    for gid, g in enumerate(kv_cache_config.kv_cache_groups):
        spec = g.kv_cache_spec
        if getattr(g, "is_eagle_group", False):
            raise ConfigError("model", "saria does not hold EAGLE/MTP draft layers' KV")
        block_sizes.add(spec.block_size)
        if isinstance(spec, MambaSpec):
            if spec.mamba_cache_mode != "align":
                raise ConfigError("model", f"recurrent layers need mamba_cache_mode='align' "
                                  f"(prefix caching on), got {spec.mamba_cache_mode!r}")
            states.append(gid)
            state_layers.append(tuple(g.layer_names))
            state_pages.add(spec.state_content_size_bytes)
            strides.add(spec.page_size_bytes)
        elif isinstance(spec, AttentionSpec):  # pages are opaque: MLA, chunked-local too
            attn.append(gid)
            windows.append(spec.sliding_window if isinstance(spec, SlidingWindowSpec)
                           else 0)
            attn_layers.append(tuple(g.layer_names))
            pages.add(spec.page_size_bytes)
        else:
            raise ConfigError("model", f"saria holds attention and Mamba/linear-attention "
                              f"KV caches, not {type(spec).__name__} (group {gid})")
    if not attn:
        raise ConfigError("model", "saria needs at least one attention layer group")
    if len(pages) != 1 or len(block_sizes) != 1 or len(state_pages) > 1:
        raise ConfigError("model", f"saria needs one page size and block size over all KV "
                          f"groups, got pages {sorted(pages)}, blocks {sorted(block_sizes)}")
    return GroupLayout(tuple(attn), tuple(windows), tuple(attn_layers), pages.pop(),
                       block_sizes.pop(), tuple(states), tuple(state_layers),
                       state_pages.pop() if state_pages else 0,
                       strides.pop() if strides else 0)
