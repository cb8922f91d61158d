"""Block identity: chained, reproducible block keys (see :mod:`saria.keys.hashing`).

``BlockHasher(block_size, algo="sha256_cbor", seed="0")`` turns token ids (plus
cache salt, LoRA adapter, multimodal features) into one key per full block, the
same keys vLLM computes with ``--prefix-caching-hash-algo sha256_cbor`` (or
``xxhash_cbor``) and ``PYTHONHASHSEED=<seed>``. ``keys_to_array`` packs keys into
the ``(n, KEY_BYTES)`` uint8 rows the index stores.

Trace hash-id adapters (``trace_block_keys``) live in :mod:`saria.keys.trace`;
import them from there. They are deliberately not re-exported here, so that
``saria.keys`` does not depend on them.
"""

from .hashing import (
    ALGORITHMS,
    DEFAULT_SEED,
    KEY_BYTES,
    VLLM_DEFAULT_SEED,
    BlockHasher,
    InsecureHashWarning,
    MMFeature,
    digest_bytes,
    get_hash_fn,
    keys_to_array,
    resolve_algo,
    sha256_cbor,
    xxhash_cbor,
)

__all__ = [
    "ALGORITHMS",
    "DEFAULT_SEED",
    "KEY_BYTES",
    "VLLM_DEFAULT_SEED",
    "BlockHasher",
    "InsecureHashWarning",
    "MMFeature",
    "digest_bytes",
    "get_hash_fn",
    "keys_to_array",
    "resolve_algo",
    "sha256_cbor",
    "xxhash_cbor",
]
