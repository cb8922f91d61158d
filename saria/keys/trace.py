"""Block keys for trace replay: trace hash ids -> engine-block keys.

Traces carry no tokens, only one prefix-chained id per trace block (64 tokens for WEKA,
512 for Mooncake). The engine's block size differs, so engine blocks are named from the
trace ids by one rule that covers splitting (engine < trace block), grouping
(engine > trace block) and equality:

    engine block j covers tokens [j*eb, (j+1)*eb); let end = (j+1)*eb.
    It is named by the trace block k that holds its last token, k = (end - 1) // tb,
    and by where it ends inside that block, end_offset = end - k*tb  (1 <= end_offset <= tb).

Key format (fixed; 32 bytes, the width of a sha256 block key, so trace keys and content
keys share one index): four little-endian uint64 words

    [MAGIC, namespace, trace_id, (engine_block_size << 32) | end_offset]

with MAGIC = int.from_bytes(b"sariatrc", "little") so a trace key can never equal a real
content key by accident of layout, ``namespace`` separating traces/sessions whose ids are
local, and ``engine_block_size`` separating replays at different block sizes.

Why it is injective: ids are prefix-chained, so ``trace_id`` fixes the token prefix up to
the end of trace block k, and ``end_offset`` fixes where inside it the engine block ends;
together they fix the whole prefix [0, end), which is exactly what a chained content key
names. When grouping, the last id of the group names the group (it chains all before).
The converse is weaker: an engine block that ends inside a trace block is named by that
block's id, which also covers the tokens after it, so two requests that share the engine
block but diverge later in the same trace block get different keys: a conservative miss
(the trace cannot tell), never a false hit. With engine_block_size a multiple of
trace_block_size, equal prefixes always get equal keys.

Only full engine blocks get keys: n_full = min(len(hash_ids)*tb, num_tokens) // eb.
WEKA's unlisted tail tokens (floor) and Mooncake's partial last block (ceil) never make a
key; an engine block that ends inside Mooncake's partial last trace block does get one,
named by that block's id (the id stands for the partial content, which is all we know).
"""

from __future__ import annotations

import numpy as np

KEY_BYTES = 32
MAGIC = int.from_bytes(b"sariatrc", "little")
_U64_MAX = (1 << 64) - 1
_U32_MAX = (1 << 32) - 1


def trace_key_count(num_ids: int, *, trace_block_size: int, engine_block_size: int, num_tokens: int) -> int:
    """How many full engine blocks (keys) a request with ``num_ids`` trace ids has."""
    _check_sizes(trace_block_size, engine_block_size)
    if num_ids < 0 or num_tokens < 0:
        raise ValueError(f"num_ids and num_tokens must be >= 0, got {num_ids}, {num_tokens}")
    return min(num_ids * trace_block_size, num_tokens) // engine_block_size


def trace_block_keys(
    hash_ids: np.ndarray,
    *,
    namespace: int,
    trace_block_size: int,
    engine_block_size: int,
    num_tokens: int,
) -> np.ndarray:
    """Keys of the full engine blocks of one request: uint8 array (n_full, 32), C order.

    ``hash_ids`` is the request's 1-D id array (any integer dtype, values in [0, 2**64)),
    ``num_tokens`` its input length. Vectorised: no Python loop over blocks.
    """
    ids = _as_ids(hash_ids)
    if not (isinstance(namespace, (int, np.integer)) and 0 <= namespace <= _U64_MAX):
        raise ValueError(f"namespace must be an integer in [0, 2**64), got {namespace!r}")
    n = trace_key_count(
        len(ids), trace_block_size=trace_block_size, engine_block_size=engine_block_size, num_tokens=num_tokens
    )
    words = np.empty((n, 4), dtype="<u8")
    end = np.arange(1, n + 1, dtype=np.uint64) * np.uint64(engine_block_size)
    k = (end - np.uint64(1)) // np.uint64(trace_block_size)
    words[:, 0] = MAGIC
    words[:, 1] = namespace
    words[:, 2] = ids[k]
    words[:, 3] = (np.uint64(engine_block_size) << np.uint64(32)) | (end - k * np.uint64(trace_block_size))
    return words.view(np.uint8).reshape(n, KEY_BYTES)


def decode_trace_key(key: bytes | np.ndarray) -> tuple[int, int, int, int]:
    """(namespace, trace_id, engine_block_size, end_offset) of one trace key."""
    raw = bytes(key)
    if len(raw) != KEY_BYTES:
        raise ValueError(f"a trace key has {KEY_BYTES} bytes, got {len(raw)}")
    magic, ns, tid, last = (int.from_bytes(raw[i : i + 8], "little") for i in range(0, 32, 8))
    if magic != MAGIC:
        raise ValueError("not a trace key (magic differs)")
    return ns, tid, last >> 32, last & _U32_MAX


def is_trace_key(key: bytes | np.ndarray) -> bool:
    raw = bytes(key)
    return len(raw) == KEY_BYTES and int.from_bytes(raw[:8], "little") == MAGIC


def _check_sizes(tb: int, eb: int) -> None:
    for name, v in (("trace_block_size", tb), ("engine_block_size", eb)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or not 0 < v <= _U32_MAX:
            # end_offset <= tb and eb must each fit the 32-bit halves of the last word.
            raise ValueError(f"{name} must be an integer in [1, 2**32), got {v!r}")


def _as_ids(hash_ids: np.ndarray) -> np.ndarray:
    arr = np.asarray(hash_ids)
    if arr.ndim != 1:
        raise ValueError(f"hash_ids must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        return arr.astype(np.uint64)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"hash_ids must be integers, got dtype {arr.dtype}")
    if arr.dtype.kind == "i" and int(arr.min()) < 0:
        raise ValueError(f"hash_ids must be non-negative, got {int(arr.min())}")
    return arr.astype(np.uint64, copy=False)
