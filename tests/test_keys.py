"""Block keys: chain, seed, salt, extra keys, validation (numpy, cbor2, xxhash only)."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
import types
import warnings
from pathlib import Path

import cbor2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from budgets import examples

from saria.keys import hashing
from saria.keys import (
    KEY_BYTES,
    BlockHasher,
    InsecureHashWarning,
    MMFeature,
    keys_to_array,
    resolve_algo,
)

REPO = Path(__file__).resolve().parents[1]
B = 4


def xx(block_size: int = B, seed: str | int = "0") -> BlockHasher:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureHashWarning)
        return BlockHasher(block_size, "xxhash_cbor", seed)


# Known answers computed by vLLM 0.32.0 itself (PYTHONHASHSEED=0, hash_block_tokens
# chain and get_request_block_hasher agree), so vLLM compatibility is guarded here
# even without the [vllm] extra; tests/test_keys_vllm.py recomputes them live.
KAT_ARGS = dict(cache_salt="s", lora_name="l", lora_path="/p",
                mm_features=[MMFeature("img-a", 2, 7), MMFeature("img-b", 9, 2)])
KAT = {
    "sha256_cbor": ("4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e", [
        "1d302daeba4680ccc2dabc1ba38f2a6d09ed94520e260f2440c99cf4fdc5edbf",
        "de208ed94a3cf9a39d52d457a3025a940431b8e9cb00fbf337c94034150a7186",
        "cb7b2ea5cc6a06a0bf5b47b3da02be8a343fbe5b6f6de1d8861ae70d83be11ce"]),
    "xxhash_cbor": ("1ebe36576dcb573f26b99533a20aaeca", [
        "15825090217980d975601127242a443d",
        "6f2a8cc7572f058058d83f063450f019",
        "e97cb413b4156b90428995712cb58110"]),
}


@pytest.mark.parametrize("algo", sorted(KAT))
def test_known_answers_from_vllm(algo):
    h = BlockHasher(B, seed="0") if algo == "sha256_cbor" else xx()
    root, keys = KAT[algo]
    assert h.root.hex() == root
    assert [k.hex() for k in h.block_keys([9] * 12, **KAT_ARGS)] == keys


def test_root_is_hash_of_seed_string():
    h = BlockHasher(B)
    # The default seed is vLLM's own default, so unconfigured engines agree.
    assert h.seed == "vllm-none-hash" and h.algo == "sha256_cbor" and h.digest_size == 32
    assert h.root == hashlib.sha256(cbor2.dumps("vllm-none-hash", canonical=True)).digest()
    assert BlockHasher(B, seed=7).root == BlockHasher(B, seed="7").root
    assert BlockHasher(B, seed=7) == BlockHasher(B, seed="7")  # config equality


def test_hash_block_is_the_chain():
    h = BlockHasher(B)
    toks = list(range(10, 22))
    k0 = hashlib.sha256(cbor2.dumps((h.root, (10, 11, 12, 13), None), canonical=True)).digest()
    assert h.hash_block(None, toks[:4]) == k0
    chain, prev = [], None
    for i in range(0, 12, B):
        prev = h.hash_block(prev, toks[i:i + B], [("cache_salt", "x")] if i == 0 else None)
        chain.append(prev)
    assert h.block_keys(toks, cache_salt="x") == chain
    assert h.hash_block(k0, toks[4:8], ()) == h.hash_block(k0, toks[4:8])  # () == None


SUBPROCESS = """
import json, sys
from saria.keys import BlockHasher
h = BlockHasher(16, seed=sys.argv[1])
print(json.dumps([k.hex() for k in h.block_keys(list(range(100)), cache_salt="t")]))
"""


def test_deterministic_across_processes():
    keys = BlockHasher(16, seed="42").block_keys(list(range(100)), cache_salt="t")
    mine = [k.hex() for k in keys]
    for hashseed in ("1", "987654", "random"):
        env = dict(os.environ, PYTHONHASHSEED=hashseed, PYTHONPATH=str(REPO))
        out = subprocess.run([sys.executable, "-c", SUBPROCESS, "42"], env=env,
                             capture_output=True, text=True, check=True).stdout
        assert json.loads(out) == mine


def test_hasher_pickles():
    for h in (BlockHasher(B, seed=3), xx(seed=3)):
        h2 = pickle.loads(pickle.dumps(h))
        assert h2 == h and h2.block_keys(list(range(8))) == h.block_keys(list(range(8)))


def test_different_seeds_give_disjoint_keys():
    toks = list(range(64))
    a, b = BlockHasher(B, seed="0"), BlockHasher(B, seed="1")
    assert a.root != b.root
    assert not set(a.block_keys(toks)) & set(b.block_keys(toks))


def test_salt_isolation():
    h = BlockHasher(B)
    toks = [5] * 40
    salts = [None, "a", "b", "tenant-1", "tenant-2"]
    keysets = [set(h.block_keys(toks, cache_salt=s)) for s in salts]
    for i in range(len(salts)):
        for j in range(i + 1, len(salts)):
            assert not keysets[i] & keysets[j], (salts[i], salts[j])
    assert h.block_keys(toks, cache_salt="a") == h.block_keys(toks, cache_salt="a")
    assert h.block_keys(toks, cache_salt="") == h.block_keys(toks)  # as in vLLM


def _first_diff(a: list[bytes], b: list[bytes]) -> int:
    assert len(a) == len(b)
    diff = [x != y for x, y in zip(a, b)]
    first = diff.index(True) if True in diff else len(a)
    assert all(diff[first:]), "once keys differ they differ for every later block"
    return first


def test_lora_changes_every_block():
    h = BlockHasher(B)
    toks = list(range(20))
    base = h.block_keys(toks)
    assert _first_diff(base, h.block_keys(toks, lora_name="a")) == 0
    assert _first_diff(h.block_keys(toks, lora_name="a", lora_path="/x"),
                       h.block_keys(toks, lora_name="a", lora_path="/y")) == 0
    assert _first_diff(h.block_keys(toks, lora_name="a"), h.block_keys(toks, lora_name="b")) == 0


def test_mm_changes_keys_from_the_block_it_touches():
    h = BlockHasher(B)
    toks = [1] * 32  # placeholder tokens look identical; only the mm hash differs
    base = h.block_keys(toks)
    img1 = h.block_keys(toks, mm_features=[MMFeature("img1", 10, 12)])
    img2 = h.block_keys(toks, mm_features=[MMFeature("img2", 10, 12)])
    assert _first_diff(base, img1) == 10 // B
    assert _first_diff(img1, img2) == 10 // B
    # same item at a different offset inside the same block: different key
    assert _first_diff(img1, h.block_keys(toks, mm_features=[MMFeature("img1", 9, 13)])) == 2
    # vLLM MultiModalFeatureSpec-like objects are accepted
    pos = types.SimpleNamespace(offset=10, length=12)
    spec = types.SimpleNamespace(identifier="img1", mm_position=pos)
    assert h.block_keys(toks, mm_features=[spec]) == img1


def test_prompt_embeds_change_keys_from_the_changed_row():
    h = BlockHasher(B)
    emb = np.arange(16 * 3, dtype=np.float32).reshape(16, 3)
    base = h.block_keys([0] * 16, prompt_embeds=emb)
    emb2 = emb.copy()
    emb2[9, 1] += 1
    assert _first_diff(base, h.block_keys([0] * 16, prompt_embeds=emb2)) == 9 // B
    assert _first_diff(h.block_keys([0] * 16), base) == 0


def test_only_full_blocks():
    h = BlockHasher(16)
    assert h.block_keys([]) == []
    assert h.block_keys(list(range(15))) == []
    assert len(h.block_keys(list(range(47)))) == 2
    assert h.block_keys(list(range(47))) == h.block_keys(list(range(32)))


def test_continue_from_parent():
    h = BlockHasher(B)
    toks = list(range(30))
    mm = [MMFeature("m", 6, 9)]
    full = h.block_keys(toks, cache_salt="s", lora_name="l", mm_features=mm)
    rest = h.block_keys(toks[8:], cache_salt="s", lora_name="l", mm_features=mm,
                        parent=full[1], start=8)
    assert rest == full[2:]
    plain = h.block_keys(toks)
    assert h.block_keys(toks[8:], parent=plain[1]) == plain[2:]


def test_numpy_and_numpy_ints_accepted():
    h = BlockHasher(B)
    toks = list(range(100, 117))
    ref = h.block_keys(toks)
    assert h.block_keys(np.array(toks, dtype=np.int64)) == ref
    assert h.block_keys(np.array(toks, dtype=np.uint32)) == ref
    assert h.block_keys([np.int32(t) for t in toks]) == ref
    assert h.block_keys(tuple(toks)) == ref


tokens = st.lists(st.integers(0, 200_000), max_size=60)


@settings(max_examples=examples(60), deadline=None)
@given(tokens, tokens, st.sampled_from([None, "s1", "s2"]), st.integers(1, 8))
def test_prefix_property(prefix, suffix, salt, bs):
    h = BlockHasher(bs)
    mm = [MMFeature("x", 3, 5), MMFeature("y", 20, 30)]
    short = h.block_keys(prefix, cache_salt=salt, mm_features=mm)
    long = h.block_keys(prefix + suffix, cache_salt=salt, mm_features=mm)
    assert long[:len(short)] == short
    assert len(short) == len(prefix) // bs and len(long) == len(prefix + suffix) // bs


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.integers(0, 1000), min_size=1, max_size=60), st.data(), st.integers(1, 8))
def test_chain_property(toks, data, bs):
    i = data.draw(st.integers(0, len(toks) - 1))
    changed = list(toks)
    changed[i] = toks[i] + 1
    h = BlockHasher(bs)
    a, b = h.block_keys(toks), h.block_keys(changed)
    n_before = min(i // bs, len(a))
    assert a[:n_before] == b[:n_before]
    assert all(x != y for x, y in zip(a[i // bs:], b[i // bs:]))


def test_xxhash_opt_in_warns_and_pads():
    with pytest.warns(InsecureHashWarning, match="multi-tenant"):
        h = BlockHasher(B, "xxhash")
    assert h.algo == "xxhash_cbor" and h.digest_size == 16 and len(h.root) == 16
    keys = h.block_keys(list(range(12)))
    assert all(len(k) == 16 for k in keys)
    arr = keys_to_array(keys)
    assert arr.shape == (3, KEY_BYTES) and arr.dtype == np.uint8
    assert bytes(arr[1, :16]) == keys[1] and not arr[:, 16:].any()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # sha256 never warns
        s = BlockHasher(B, "sha256")
    assert s.algo == "sha256_cbor"
    s_keys = s.block_keys(list(range(12)))
    assert [bytes(r) for r in keys_to_array(s_keys)] == s_keys
    assert keys_to_array([]).shape == (0, KEY_BYTES)


def test_xxhash_missing_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "xxhash", None)
    monkeypatch.setattr(hashing, "_xxh3", None)  # forget an earlier successful import
    with pytest.raises(ImportError, match=r"saria\[xxhash\]"):
        BlockHasher(B, "xxhash_cbor")


@pytest.mark.parametrize("bs", [0, -4, 1.5, True, "16", None])
def test_bad_block_size(bs):
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        BlockHasher(bs)


def test_bad_algo_and_seed():
    valid = "sha256_cbor, xxhash_cbor, sha256, xxhash"
    with pytest.raises(ValueError, match=f"unknown algo 'md5'; valid names: {valid}$"):
        BlockHasher(B, "md5")
    with pytest.raises(TypeError, match="algo must be a str"):
        resolve_algo(None)
    with pytest.raises(TypeError, match="seed must be a str or an int"):
        BlockHasher(B, seed=1.5)
    with pytest.raises(TypeError, match="seed"):
        BlockHasher(B, seed=b"0")


@pytest.mark.parametrize("toks, exc, msg", [
    ([1, 2, "3", 4], TypeError, r"token_ids\[2\] must be an int, got str"),
    ([1, 2.0, 3, 4], TypeError, r"token_ids\[1\] must be an int, got float"),
    ([True, 1, 2, 3], TypeError, r"token_ids\[0\] must be an int, got bool"),
    ([1, 2, 3, -1], ValueError, r"token_ids\[3\] must be non-negative, got -1"),
    (np.array([1.0, 2, 3, 4]), TypeError, "token_ids must be a 1-D integer array"),
    (np.array([1, -2, 3, 4]), ValueError, "token_ids must be non-negative"),
    ("abcd", TypeError, "token_ids must be a sequence of ints, got str"),
    (5, TypeError, "token_ids must be a sequence of ints, got int"),
])
def test_bad_tokens(toks, exc, msg):
    h = BlockHasher(B)
    with pytest.raises(exc, match=msg):
        h.block_keys(toks)
    with pytest.raises(exc, match=msg):
        h.hash_block(None, toks)


def test_hash_block_errors():
    h = BlockHasher(B)
    with pytest.raises(ValueError, match="^wrong block length: got 3 tokens, block_size is 4$"):
        h.hash_block(None, [1, 2, 3])
    with pytest.raises(ValueError, match="wrong block length: got 5 tokens"):
        h.hash_block(None, [1, 2, 3, 4, 5])
    with pytest.raises(TypeError, match="parent must be bytes or None, got str"):
        h.hash_block("ab" * 32, [1, 2, 3, 4])
    with pytest.raises(ValueError, match="parent must be a 32-byte sha256_cbor key, got 16 bytes"):
        h.hash_block(b"\0" * 16, [1, 2, 3, 4])
    with pytest.raises(ValueError, match="parent must be a 16-byte xxhash_cbor key, got 32 bytes"):
        xx().hash_block(b"\0" * 32, [1, 2, 3, 4])
    with pytest.raises(TypeError, match="extra_keys is not CBOR-encodable"):
        h.hash_block(None, [1, 2, 3, 4], [object()])


def test_block_keys_argument_errors():
    h = BlockHasher(B)
    t = list(range(8))
    with pytest.raises(TypeError, match="cache_salt must be a str or None, got int"):
        h.block_keys(t, cache_salt=5)
    with pytest.raises(TypeError, match="cache_salt must be a str or None, got bytes"):
        h.block_keys(t, cache_salt=b"s")
    with pytest.raises(TypeError, match="lora_name must be a str"):
        h.block_keys(t, lora_name=3)
    with pytest.raises(ValueError, match="lora_path given without lora_name"):
        h.block_keys(t, lora_path="/p")
    with pytest.raises(TypeError, match="parent must be bytes or None"):
        h.block_keys(t, parent=123)
    with pytest.raises(ValueError, match="start must be a non-negative multiple of block_size 4"):
        h.block_keys(t, parent=h.root, start=3)
    with pytest.raises(ValueError, match="start > 0 needs the parent key"):
        h.block_keys(t, start=4)
    with pytest.raises(ValueError, match="start is 0 but a parent was given"):
        h.block_keys(t, parent=h.root, start=0)
    with pytest.raises(ValueError, match="start is required with parent"):
        h.block_keys(t, parent=h.root, mm_features=[MMFeature("m", 0, 1)])
    with pytest.raises(ValueError, match="sorted by offset and must not overlap"):
        h.block_keys(t, mm_features=[MMFeature("a", 4, 4), MMFeature("b", 2, 1)])
    with pytest.raises(ValueError, match="sorted by offset and must not overlap"):
        h.block_keys(t, mm_features=[MMFeature("a", 0, 4), MMFeature("b", 3, 1)])
    with pytest.raises(TypeError, match="mm_features items must be MMFeature"):
        h.block_keys(t, mm_features=[("a", 0, 4)])
    with pytest.raises(TypeError, match="prompt_embeds must be a numpy array"):
        h.block_keys(t, prompt_embeds=[[0.0]] * 8)
    with pytest.raises(ValueError, match="length >= 1"):
        MMFeature("a", 0, 0)
    with pytest.raises(TypeError, match="identifier must be a str"):
        MMFeature(b"a", 0, 1)


def test_keys_to_array_errors():
    with pytest.raises(TypeError, match=r"keys\[0\] must be bytes, got str"):
        keys_to_array(["ab"])
    with pytest.raises(ValueError, match=r"keys\[1\] must be 1..32 bytes, got 33"):
        keys_to_array([b"a", b"b" * 33])
