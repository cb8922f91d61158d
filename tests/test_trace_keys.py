"""saria.keys.trace: trace hash ids -> engine-block keys, checked against a per-block
Python reference and against the prefix semantics the keys stand for."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from budgets import examples

from saria.keys.trace import (
    KEY_BYTES,
    MAGIC,
    decode_trace_key,
    is_trace_key,
    trace_block_keys,
    trace_key_count,
)


def reference_keys(ids, namespace, tb, eb, num_tokens):
    """The documented rule, one block at a time."""
    out = []
    for j in range(min(len(ids) * tb, num_tokens) // eb):
        end = (j + 1) * eb
        k = (end - 1) // tb
        out.append(struct.pack("<4Q", MAGIC, namespace, int(ids[k]), (eb << 32) | (end - k * tb)))
    return out


def keys(ids, ns=0, tb=64, eb=16, n=None):
    ids = np.asarray(ids, dtype=np.uint64)
    n = len(ids) * tb if n is None else n
    return trace_block_keys(ids, namespace=ns, trace_block_size=tb, engine_block_size=eb, num_tokens=n)


block_sizes = st.sampled_from([1, 2, 3, 5, 16, 32, 48, 64, 100, 128, 512])


@settings(max_examples=examples(300), deadline=None)
@given(
    ids=st.lists(st.integers(0, 2**64 - 1), max_size=40),
    ns=st.integers(0, 2**64 - 1),
    tb=block_sizes,
    eb=block_sizes,
    extra=st.integers(-600, 600),
)
def test_matches_per_block_reference(ids, ns, tb, eb, extra):
    n = max(0, len(ids) * tb + extra)  # below: floor-like tails; above: more tokens than ids
    got = keys(ids, ns, tb, eb, n)
    assert got.dtype == np.uint8 and got.flags.c_contiguous
    assert got.shape == (trace_key_count(len(ids), trace_block_size=tb, engine_block_size=eb, num_tokens=n), 32)
    assert [bytes(row) for row in got] == reference_keys(ids, ns, tb, eb, n)


def test_split_engine_block_smaller_than_trace_block():
    k = keys([7, 8], tb=64, eb=16)
    assert [decode_trace_key(r) for r in k] == [(0, 7, 16, o) for o in (16, 32, 48, 64)] + [
        (0, 8, 16, o) for o in (16, 32, 48, 64)
    ]


def test_group_last_id_names_the_group():
    k = keys([1, 2, 3, 4, 5, 6], tb=16, eb=48)
    assert [decode_trace_key(r)[1:] for r in k] == [(3, 48, 16), (6, 48, 16)]
    # a group that does not end on a trace-block boundary: named by the block holding its end
    k = keys([1, 2, 3, 4, 5, 6], tb=16, eb=40)
    assert [decode_trace_key(r)[1:] for r in k] == [(3, 40, 8), (5, 40, 16)]


def test_equal_block_sizes_are_one_key_per_id():
    k = keys([9, 10, 11], tb=64, eb=64)
    assert [decode_trace_key(r) for r in k] == [(0, i, 64, 64) for i in (9, 10, 11)]


def test_only_full_engine_blocks():
    # WEKA-like floor: 200 tokens, 3 full 64-token ids, 8 tokens with no id.
    assert len(keys([1, 2, 3], tb=64, eb=16, n=200)) == 12
    assert len(keys([1, 2, 3], tb=64, eb=128, n=200)) == 1
    # Mooncake-like ceil: 600 tokens, 2 ids of 512 (the last covers 88 tokens).
    assert len(keys([1, 2], tb=512, eb=256, n=600)) == 2
    k = keys([1, 2], tb=512, eb=16, n=600)
    assert len(k) == 37 and decode_trace_key(k[-1])[1:] == (2, 16, 80)
    assert len(keys([], n=0)) == 0 and keys([], n=0).shape == (0, 32)


def test_keys_unique_across_namespaces_and_block_sizes():
    ids = np.arange(1, 101, dtype=np.uint64)
    sets = [
        {bytes(r) for r in keys(ids, ns=ns, tb=64, eb=eb)} for ns in (0, 1, 2**63) for eb in (16, 32, 64)
    ]
    assert sum(len(s) for s in sets) == len(set().union(*sets))
    assert all(is_trace_key(next(iter(s))) for s in sets)
    assert not is_trace_key(bytes(32))


@settings(max_examples=examples(150), deadline=None)
@given(
    prompts=st.lists(st.lists(st.integers(0, 2), min_size=0, max_size=60), min_size=1, max_size=8),
    tb=st.sampled_from([2, 3, 4, 8]),
    eb=st.sampled_from([1, 2, 3, 4, 6, 8, 12]),
    partial=st.booleans(),
)
def test_equal_keys_iff_equal_prefixes(prompts, tb, eb, partial):
    """Build prefix-chained ids from real token lists; keys must name token prefixes.

    Equal keys always mean equal prefixes (never a false hit). The converse holds when
    engine blocks end on trace-block boundaries; an engine block ending inside a trace
    block is named by that block's id, which also depends on the tokens after it.
    """
    registry: dict[tuple, int] = {}
    key_to_prefix: dict[bytes, tuple] = {}
    prefix_to_key: dict[tuple, bytes] = {}
    for toks in prompts:
        n_ids = -(-len(toks) // tb) if partial else len(toks) // tb
        ids = [registry.setdefault(tuple(toks[: min((k + 1) * tb, len(toks))]), len(registry)) for k in range(n_ids)]
        for j, row in enumerate(keys(ids, tb=tb, eb=eb, n=len(toks))):
            prefix = tuple(toks[: (j + 1) * eb])
            assert key_to_prefix.setdefault(bytes(row), prefix) == prefix  # injective
            if not partial and eb % tb == 0:  # aligned, full blocks: one key per prefix
                assert prefix_to_key.setdefault(prefix, bytes(row)) == bytes(row)


def test_accepts_lists_and_small_dtypes():
    a = trace_block_keys([3, 4], namespace=1, trace_block_size=4, engine_block_size=2, num_tokens=8)
    b = trace_block_keys(np.array([3, 4], np.uint32), namespace=1, trace_block_size=4, engine_block_size=2, num_tokens=8)
    assert np.array_equal(a, b) and a.shape == (4, KEY_BYTES)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(trace_block_size=0), "trace_block_size"),
        (dict(engine_block_size=-16), "engine_block_size"),
        (dict(engine_block_size=2**32), "engine_block_size"),
        (dict(namespace=-1), "namespace"),
        (dict(num_tokens=-1), "num_tokens"),
        (dict(hash_ids=np.array([1, -2])), "non-negative"),
        (dict(hash_ids=np.array([1.0, 2.0])), "integers"),
        (dict(hash_ids=np.zeros((2, 2), np.uint64)), "1-D"),
    ],
)
def test_invalid_arguments(kwargs, match):
    args = dict(hash_ids=np.array([1, 2]), namespace=0, trace_block_size=64, engine_block_size=16, num_tokens=128)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        trace_block_keys(args.pop("hash_ids"), **args)


def test_decode_rejects_foreign_keys():
    with pytest.raises(ValueError, match="magic"):
        decode_trace_key(bytes(32))
    with pytest.raises(ValueError, match="32 bytes"):
        decode_trace_key(b"short")


def test_key_width_matches_content_keys():
    """Trace keys go into the same index as content keys: same row width."""
    keys_pkg = pytest.importorskip("saria.keys")
    assert keys_pkg.KEY_BYTES == KEY_BYTES == 32
