"""A request's saria block keys, computed once and extended as it grows.

vLLM hands the scheduler ``Request`` objects whose tokens grow while they
decode; saria needs the chained key of every full block. ``RequestHasher``
computes them with saria's own ``BlockHasher`` (algorithm, seed, cache salt,
LoRA and multimodal extra keys) -- or takes vLLM's ``request.block_hashes``
as they are when the engine hashes exactly as saria would (same CBOR
function, same root, same block size), which skips a second hashing pass.
That is decided at the first request: EngineCore seeds vLLM's hash root only
after it built the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from saria.keys.hashing import BlockHasher, keys_to_array


@dataclass
class KeyChain:
    """The keys of a request's first ``len(keys)`` blocks, as bytes and as
    one stacked array (each key converted once for the request's life)."""

    keys: list[bytes] = field(default_factory=list)
    array: np.ndarray = field(default_factory=lambda: keys_to_array([]))

    def __len__(self) -> int:
        return len(self.keys)


class RequestHasher:
    """Extends requests' key chains; see the module docstring."""

    def __init__(self, hasher: BlockHasher, vllm_config=None, kv_cache_config=None) -> None:
        self.hasher = hasher
        self.block_size = hasher.block_size
        self._configs = (vllm_config, kv_cache_config)
        self._engine_hashes: bool | None = None

    @property
    def engine_hashes(self) -> bool:
        """Whether vLLM's ``request.block_hashes`` are saria's keys."""
        if self._engine_hashes is None:
            self._engine_hashes = _engine_hashes_match(self.hasher, *self._configs)
        return self._engine_hashes

    def extend(self, chain: KeyChain, request, blocks: int) -> None:
        """Grows `chain` to the request's first `blocks` full blocks (fewer
        if the request has fewer tokens)."""
        have = len(chain.keys)
        if blocks <= have:
            return
        bs = self.block_size
        if self.engine_hashes and len(request.block_hashes) >= blocks:
            new = [bytes(h) for h in request.block_hashes[have:blocks]]
        else:
            tokens = request.all_token_ids[have * bs: blocks * bs]
            lora = getattr(request, "lora_request", None)
            new = self.hasher.block_keys(
                tokens, cache_salt=None if have else getattr(request, "cache_salt", None),
                lora_name=lora.lora_name if lora else None,
                lora_path=(lora.lora_path or "") if lora else "",
                mm_features=getattr(request, "mm_features", None) or None,
                parent=chain.keys[-1] if have else None, start=have * bs if have else None)
        if new:
            chain.keys.extend(new)
            chain.array = np.concatenate([chain.array, keys_to_array(new)])


def _engine_hashes_match(hasher: BlockHasher, vllm_config, kv_cache_config) -> bool:
    """True when vLLM's ``request.block_hashes`` are saria's keys: the engine
    hashes canonical CBOR with the same function and root (seed), per KV block."""
    if vllm_config is None or kv_cache_config is None:
        return False
    algo = getattr(vllm_config.cache_config, "prefix_caching_hash_algo", None)
    if algo != hasher.algo:
        return False
    if (kv_cache_config.hash_block_size or hasher.block_size) != hasher.block_size:
        return False
    try:
        from vllm.v1.core import kv_cache_utils

        return bytes(kv_cache_utils.NONE_HASH) == hasher.root
    except (ImportError, AttributeError, NameError):
        return False
