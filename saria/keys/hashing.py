"""Chained block keys, bit-compatible with vLLM's prefix-caching block hashes.

A prompt is cut into blocks of ``block_size`` tokens. Block ``i`` gets the key::

    key_i = H((key_{i-1}, tuple(block_i_token_ids), extra_keys_i))     key_{-1} = root

so a key names the whole prefix up to and including its block (changing token
``t`` changes every key from block ``t // block_size`` on, and none before).
Only full blocks get keys: a trailing partial block has none.

Invariants (all tested, ``tests/test_keys.py`` and ``tests/test_keys_vllm.py``):

- ``H`` is a hash over **canonical CBOR** (``cbor2.dumps(obj, canonical=True)``):
  ``"sha256_cbor"`` (SHA-256, 32-byte keys, the default) or, only when asked for,
  ``"xxhash_cbor"`` (XXH3-128, 16-byte keys, non-cryptographic: warns). The names
  ``"sha256"`` and ``"xxhash"`` are accepted as aliases of the CBOR variants. vLLM's
  own plain ``sha256``/``xxhash`` hash a *pickle*, which is not reproducible across
  Python/vLLM versions, so saria never offers them.
- ``root = H(seed)`` with ``seed`` a string (ints go through ``str()``). This is
  exactly what vLLM's ``init_none_hash`` computes when ``PYTHONHASHSEED=<seed>``
  is set, so saria and vLLM agree key for key. The default seed is
  ``"vllm-none-hash"`` (:data:`VLLM_DEFAULT_SEED`), the seed an *unseeded* vLLM
  0.32 uses for sha256, so an engine left at its defaults (with
  ``--prefix-caching-hash-algo sha256_cbor``) and saria agree out of the box.
  The root never comes from ``os.urandom``: keys are reproducible across
  processes and restarts, which the SSD tier and cross-process sharing need.
  (Unseeded vLLM uses a random per-process seed for xxhash: set PYTHONHASHSEED.)
- Extra keys are built as in vLLM 0.32's ``generate_block_hash_extra_keys``, in
  this order, and are ``None`` (not an empty tuple) when there are none:

  1. ``("lora", lora_name, lora_path)`` on every block of a LoRA request (vLLM
     does not hash the adapter's int id);
  2. ``("mm", identifier, offset - block_start)`` for every multimodal feature
     whose placeholder range overlaps the block (the relative offset is negative
     when the feature began in an earlier block);
  3. ``("cache_salt", salt)`` on block 0 only, and only for a non-empty salt
     (``""`` is the same as no salt, as in vLLM); since every later key chains off
     block 0, the salt re-keys the whole chain and isolates tenants;
  4. ``("prompt_embeds", sha256(raw bytes of prompt_embeds[start:end]))`` when
     prompt embeddings are given (always SHA-256, whatever ``algo`` is).

Speed (``block_keys`` on a 16384-token prompt, best of 5, CPython 3.11.7, cbor2
C extension, 2-vCPU AMD EPYC VM): per 16-token block ``sha256_cbor`` 2.4 us,
``xxhash_cbor`` 2.1 us, about 0.9 us more with salt + LoRA + an mm feature; per
256-token block 16.5 us and 15.8 us. CBOR-encoding the token tuple dominates
(about 0.06 us per token), so xxhash buys little here: prefer sha256.
"""

from __future__ import annotations

import hashlib
import logging
import numbers
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import cbor2
import numpy as np

logger = logging.getLogger(__name__)

#: Width of a key in the index: shorter digests (xxh3-128: 16 bytes) are
#: zero-padded to this by :func:`keys_to_array`.
KEY_BYTES = 32
#: The seed an unseeded vLLM 0.32 uses for sha256 (``DEFAULT_NONE_HASH_SEED``).
VLLM_DEFAULT_SEED = "vllm-none-hash"
#: saria's default chain seed: vLLM's own default, so unconfigured engines agree.
DEFAULT_SEED = VLLM_DEFAULT_SEED
#: Canonical algorithm names; the first is the default.
ALGORITHMS = ("sha256_cbor", "xxhash_cbor")
_ALIASES = {"sha256": "sha256_cbor", "xxhash": "xxhash_cbor"}
_DIGEST_BYTES = {"sha256_cbor": 32, "xxhash_cbor": 16}


class InsecureHashWarning(UserWarning):
    """A non-cryptographic block hash was chosen (unsafe for multi-tenant use)."""


def sha256_cbor(obj: Any) -> bytes:
    """SHA-256 of the canonical CBOR encoding of ``obj`` (vLLM's ``sha256_cbor``)."""
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


# Resolved on first use: xxhash is optional and imported only when asked for.
_xxh3: Callable[[bytes], bytes] | None = None


def _xxh3_128_digest() -> Callable[[bytes], bytes]:
    global _xxh3
    if _xxh3 is None:
        try:
            import xxhash
        except ImportError:
            xxhash = None
        digest = getattr(xxhash, "xxh3_128_digest", None)
        if digest is None:
            raise ImportError(
                "algo 'xxhash_cbor' needs the optional xxhash>=3.4 package: "
                "pip install 'saria[xxhash]'"
            )
        _xxh3 = digest
    return _xxh3


def xxhash_cbor(obj: Any) -> bytes:
    """XXH3-128 (unseeded) of the canonical CBOR of ``obj`` (vLLM's ``xxhash_cbor``)."""
    return (_xxh3 or _xxh3_128_digest())(cbor2.dumps(obj, canonical=True))


def resolve_algo(algo: str) -> str:
    """Return the canonical name for ``algo`` (aliases resolved) or raise ValueError."""
    if not isinstance(algo, str):
        raise TypeError(f"algo must be a str, got {type(algo).__name__}")
    name = _ALIASES.get(algo, algo)
    if name not in _DIGEST_BYTES:
        valid = ", ".join(ALGORITHMS + tuple(_ALIASES))
        raise ValueError(f"unknown algo {algo!r}; valid names: {valid}")
    return name


def digest_bytes(algo: str) -> int:
    """Bytes of a block key's digest under `algo` (32 for sha256, 16 for xxh3)."""
    return _DIGEST_BYTES[resolve_algo(algo)]


def get_hash_fn(algo: str) -> Callable[[Any], bytes]:
    """The hash function ``object -> digest`` for ``algo`` (canonical name or alias)."""
    name = resolve_algo(algo)
    if name == "sha256_cbor":
        return sha256_cbor
    _xxh3_128_digest()  # fail now, not at the first block
    return xxhash_cbor


@dataclass(frozen=True, slots=True)
class MMFeature:
    """One multimodal input item, as far as block keys are concerned.

    ``identifier`` is vLLM's ``MultiModalFeatureSpec.identifier`` (the encoder-cache
    hash, LoRA-prefixed when applicable; *not* ``mm_hash``). ``offset``/``length``
    are its placeholder token range in the prompt (vLLM's ``mm_position``).
    vLLM ``MultiModalFeatureSpec`` objects are accepted wherever an MMFeature is.
    """

    identifier: str
    offset: int
    length: int

    def __post_init__(self) -> None:
        if not isinstance(self.identifier, str):
            got = type(self.identifier).__name__
            raise TypeError(f"mm feature identifier must be a str, got {got}")
        for name in ("offset", "length"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"mm feature {name} must be an int, got {type(v).__name__}")
        if self.offset < 0 or self.length < 1:
            raise ValueError("mm feature needs offset >= 0 and length >= 1, "
                             f"got {self.offset}, {self.length}")


def _as_mm_features(features: Iterable[Any] | None) -> list[MMFeature]:
    """Normalise to MMFeatures, checking vLLM's assumption: sorted, non-overlapping."""
    out: list[MMFeature] = []
    for f in features or ():
        if not isinstance(f, MMFeature):
            pos = getattr(f, "mm_position", None)
            if pos is None or not hasattr(f, "identifier"):
                raise TypeError("mm_features items must be MMFeature or have .identifier and "
                                f".mm_position, got {type(f).__name__}")
            f = MMFeature(f.identifier, pos.offset, pos.length)
        if out and f.offset < out[-1].offset + out[-1].length:
            raise ValueError("mm_features must be sorted by offset and must not overlap")
        out.append(f)
    return out


def _as_token_list(token_ids: Any, what: str = "token_ids") -> list[int]:
    """Token ids as a list of non-negative Python ints (CBOR must see plain ints)."""
    if isinstance(token_ids, np.ndarray):
        if token_ids.ndim != 1 or token_ids.dtype.kind not in "iu":
            raise TypeError(f"{what} must be a 1-D integer array, "
                            f"got {token_ids.dtype} with shape {token_ids.shape}")
        if token_ids.size and token_ids.min() < 0:
            raise ValueError(f"{what} must be non-negative, got {int(token_ids.min())}")
        return token_ids.tolist()
    if isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, Iterable):
        raise TypeError(f"{what} must be a sequence of ints, got {type(token_ids).__name__}")
    tokens = list(token_ids)
    # Fast path: the common case is a list of plain ints.
    if all(type(t) is int for t in tokens):
        if tokens and min(tokens) < 0:
            i = next(i for i, t in enumerate(tokens) if t < 0)
            raise ValueError(f"{what}[{i}] must be non-negative, got {tokens[i]}")
        return tokens
    for i, t in enumerate(tokens):
        # bool is an int subclass but CBOR encodes it as true/false, not 1/0.
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise TypeError(f"{what}[{i}] must be an int, got {type(t).__name__}")
        if t < 0:
            raise ValueError(f"{what}[{i}] must be non-negative, got {t}")
        tokens[i] = int(t)
    return tokens


@dataclass(frozen=True, slots=True)
class BlockHasher:
    """Computes chained block keys; immutable and safe to share between threads.

    Args:
        block_size: tokens per block, a positive int.
        algo: ``"sha256_cbor"`` (default) or ``"xxhash_cbor"`` (aliases ``"sha256"``,
            ``"xxhash"``: saria always hashes canonical CBOR). xxhash warns.
        seed: chain seed, a str or an int (converted with ``str()``); default ``"vllm-none-hash"``.
            ``root == H(str(seed))``, vLLM's root under ``PYTHONHASHSEED=<seed>``.

    ``algo`` holds the canonical name after construction; ``root`` is the parent of
    block 0 and ``digest_size`` the key length in bytes (32 or 16).
    """

    block_size: int
    algo: str = "sha256_cbor"
    seed: str | int = DEFAULT_SEED
    root: bytes = field(init=False)
    digest_size: int = field(init=False)
    _fn: Callable[[Any], bytes] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        bs = self.block_size
        if isinstance(bs, bool) or not isinstance(bs, int) or bs <= 0:
            raise ValueError(f"block_size must be a positive int, got {bs!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, (str, int)):
            raise TypeError(f"seed must be a str or an int, got {type(self.seed).__name__}")
        name = resolve_algo(self.algo)
        fn = get_hash_fn(name)
        if name == "xxhash_cbor":
            msg = ("block hash 'xxhash_cbor' (XXH3-128) is non-cryptographic: colliding "
                   "keys can be crafted, so it is unsafe for multi-tenant use; use 'sha256_cbor'")
            warnings.warn(msg, InsecureHashWarning, stacklevel=3)
            logger.warning(msg)
        seed = str(self.seed)
        set_ = object.__setattr__  # frozen dataclass: fill derived fields once
        set_(self, "algo", name)
        set_(self, "seed", seed)
        set_(self, "_fn", fn)
        set_(self, "root", fn(seed))
        set_(self, "digest_size", _DIGEST_BYTES[name])

    def _check_parent(self, parent: Any) -> bytes:
        if parent is None:
            return self.root
        if not isinstance(parent, (bytes, bytearray, memoryview)):
            raise TypeError(f"parent must be bytes or None, got {type(parent).__name__}")
        parent = bytes(parent)
        if len(parent) != self.digest_size:
            raise ValueError(f"parent must be a {self.digest_size}-byte {self.algo} key, "
                             f"got {len(parent)} bytes")
        return parent

    def hash_block(self, parent: bytes | None, token_ids: Sequence[int],
                   extra_keys: Sequence[Any] | None = None) -> bytes:
        """Key of one full block: ``H((parent or root, tuple(token_ids), extra_keys))``.

        This is vLLM's ``hash_block_tokens``. ``extra_keys`` must be CBOR-encodable;
        an empty sequence is hashed as ``None``, the one encoding of "no extras".
        """
        parent = self._check_parent(parent)
        tokens = _as_token_list(token_ids)
        if len(tokens) != self.block_size:
            raise ValueError(f"wrong block length: got {len(tokens)} tokens, "
                             f"block_size is {self.block_size}")
        extra = tuple(extra_keys) if extra_keys else None
        try:
            return self._fn((parent, tuple(tokens), extra))
        except cbor2.CBOREncodeError as e:
            raise TypeError(f"extra_keys is not CBOR-encodable: {e}") from None

    def block_keys(self, token_ids: Sequence[int] | np.ndarray, *,
                   cache_salt: str | None = None,
                   lora_name: str | None = None, lora_path: str = "",
                   mm_features: Iterable[Any] | None = None,
                   prompt_embeds: np.ndarray | None = None,
                   parent: bytes | None = None, start: int | None = None) -> list[bytes]:
        """Keys of every full block of ``token_ids``; a trailing partial block gets none.

        Same keys as vLLM's ``get_request_block_hasher`` for a request with these
        token ids, ``cache_salt``, ``LoRARequest(lora_name, _, lora_path)`` and mm
        features. Prefix property: the keys of a prompt are a prefix of the keys of
        any extension of it.

        Args:
            cache_salt: tenant salt (a str) entering block 0; ``""`` means none.
            lora_name, lora_path: the LoRA adapter. vLLM hashes both and never has an
                empty path, so pass the path to match vLLM keys.
            mm_features: :class:`MMFeature` or vLLM ``MultiModalFeatureSpec`` items,
                sorted by offset, non-overlapping; offsets are absolute positions.
            prompt_embeds: array whose first axis is the absolute token position
                (a bf16 torch tensor ``t``: pass ``t.view(torch.uint8).numpy()``);
                its raw bytes per block are hashed as vLLM does. The ``token_ids``
                are then vLLM's placeholders (zeros).
            parent, start: continue a chain: ``parent`` is the key of the block
                before ``token_ids[0]``, ``start`` that token's absolute position (a
                multiple of block_size), needed only with mm_features or
                prompt_embeds. The salt belongs to block 0 and is ignored here.
        """
        if cache_salt is not None and not isinstance(cache_salt, str):
            raise TypeError(f"cache_salt must be a str or None, got {type(cache_salt).__name__}")
        if lora_name is not None and not isinstance(lora_name, str):
            raise TypeError(f"lora_name must be a str or None, got {type(lora_name).__name__}")
        if not isinstance(lora_path, str):
            raise TypeError(f"lora_path must be a str, got {type(lora_path).__name__}")
        if lora_path and lora_name is None:
            raise ValueError("lora_path given without lora_name")
        if start is not None and (isinstance(start, bool) or not isinstance(start, int)
                                  or start < 0 or start % self.block_size):
            raise ValueError("start must be a non-negative multiple of block_size "
                             f"{self.block_size}, got {start!r}")
        if parent is None and start:
            raise ValueError("start > 0 needs the parent key of the block before it")
        if parent is not None and start == 0:
            raise ValueError("start is 0 but a parent was given; block 0's parent is the root")
        features = _as_mm_features(mm_features)
        if prompt_embeds is not None and not isinstance(prompt_embeds, np.ndarray):
            got = type(prompt_embeds).__name__
            raise TypeError(f"prompt_embeds must be a numpy array, got {got}")
        if parent is not None and start is None and (features or prompt_embeds is not None):
            raise ValueError("start is required with parent when mm_features or "
                             "prompt_embeds are given")
        prev = self._check_parent(parent)
        tokens = _as_token_list(token_ids)

        bs, fn = self.block_size, self._fn
        base = start or 0
        lora_keys = [("lora", lora_name, lora_path)] if lora_name is not None else []
        salted = parent is None and bool(cache_salt)
        keys: list[bytes] = []
        fi = 0  # first feature that may still overlap the current block
        for i in range(0, len(tokens) - bs + 1, bs):
            s = base + i
            e = s + bs
            extra: list[Any] = list(lora_keys)
            while fi < len(features) and features[fi].offset + features[fi].length <= s:
                fi += 1
            j = fi
            while j < len(features) and features[j].offset < e:
                extra.append(("mm", features[j].identifier, features[j].offset - s))
                j += 1
            if salted and i == 0:
                extra.append(("cache_salt", cache_salt))
            if prompt_embeds is not None:
                rows = np.ascontiguousarray(prompt_embeds[s:e])
                extra.append(("prompt_embeds", hashlib.sha256(rows.tobytes()).digest()))
            prev = fn((prev, tuple(tokens[i:i + bs]), tuple(extra) if extra else None))
            keys.append(prev)
        return keys


def keys_to_array(keys: Iterable[bytes]) -> np.ndarray:
    """Stack keys into a ``(n, KEY_BYTES)`` uint8 array, zero-padding short digests.

    xxh3-128 keys (16 bytes) occupy the first 16 bytes of their row; sha256 keys
    fill it. The result is a fresh, writable, C-contiguous array.
    """
    rows = []
    for i, k in enumerate(keys):
        if not isinstance(k, (bytes, bytearray, memoryview)):
            raise TypeError(f"keys[{i}] must be bytes, got {type(k).__name__}")
        k = bytes(k)
        if not 0 < len(k) <= KEY_BYTES:
            raise ValueError(f"keys[{i}] must be 1..{KEY_BYTES} bytes, got {len(k)}")
        rows.append(k.ljust(KEY_BYTES, b"\0"))
    return np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), KEY_BYTES).copy()
