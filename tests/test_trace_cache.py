"""The parsed-trace cache: a cached trace is the parsed trace, field by
field; edited, corrupt or unwritable entries never serve a stale or broken
parse."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from saria.errors import TraceFormatError
import saria.traces.cache as tc
from saria.traces import generate_agent_sessions, load_trace, resolve_trace
from saria.traces.cache import _read, _write, cache_dir
from saria.traces.model import Trace

REQUEST_FIELDS = ("namespace", "session", "time", "input_tokens", "output_tokens", "think_time",
                  "api_time", "is_subagent", "agent_id", "line", "sub_index")


def assert_same_trace(a: Trace, b: Trace, strict_types: bool = True) -> None:
    for f in ("name", "path", "format", "block_size", "partial_last_block", "has_sessions"):
        assert getattr(a, f) == getattr(b, f), f
    assert [(s.name, s.namespace, len(s.requests)) for s in a.sessions] == \
        [(s.name, s.namespace, len(s.requests)) for s in b.sessions]
    for ra, rb in zip(a.requests(), b.requests(), strict=True):
        for f in REQUEST_FIELDS:
            va, vb = getattr(ra, f), getattr(rb, f)
            assert va == vb and (type(va) is type(vb) or not strict_types), (f, va, vb)
        assert ra.hash_ids.dtype == rb.hash_ids.dtype
        np.testing.assert_array_equal(ra.hash_ids, rb.hash_ids)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SARIA_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "traces"


@pytest.mark.parametrize("name, sessions", [("weka", 25), ("mooncake", None), ("azure", None),
                                            ("bailian", None)])
def test_a_cached_trace_is_the_parsed_trace(cache, monkeypatch, name, sessions):
    p = resolve_trace(name)
    first = load_trace(p, limit_sessions=sessions)
    assert len(list(cache.glob("*.npz"))) == 1
    again = load_trace(p, limit_sessions=sessions)
    monkeypatch.setenv("SARIA_CACHE_DIR", "off")
    assert_same_trace(load_trace(p, limit_sessions=sessions), first)
    assert_same_trace(again, first)


def test_the_session_limit_is_part_of_the_key(cache):
    p = resolve_trace("weka")
    assert load_trace(p, limit_sessions=3).num_sessions == 3
    assert load_trace(p, limit_sessions=5).num_sessions == 5
    assert load_trace(p, limit_sessions=3).num_sessions == 3
    assert len(list(cache.glob("*.npz"))) == 2


def test_wide_ids_none_fields_and_subagents_round_trip(tmp_path):
    """Synthetic sessions (sub-agents, think times) with some requests' ids
    beyond 32 bits and missing optional fields: the entry reads back equal."""
    trace = generate_agent_sessions(6, seed=3)
    for i, r in enumerate(trace.requests()):
        if i % 3 == 0:
            r.hash_ids = r.hash_ids.astype(np.uint64) + np.uint64(1 << 40)
        if i % 4 == 0:
            r.think_time, r.api_time, r.agent_id, r.line = None, None, "agent-7", None
    trace.path = str(tmp_path / "synthetic.json")
    entry = tmp_path / "e.npz"
    _write(entry, trace)
    back = _read(entry, tmp_path / "synthetic.json")
    assert back is not None
    assert_same_trace(back, trace, strict_types=False)  # the generator's times are numpy floats
    assert any(r.hash_ids.dtype == np.uint64 for r in back.requests())
    assert any(r.is_subagent for r in back.requests())


def test_an_edited_trace_is_parsed_afresh(cache, tmp_path):
    src = resolve_trace("mooncake").read_text().splitlines(keepends=True)[:40]
    p = tmp_path / "t.jsonl"
    p.write_text("".join(src))
    before = load_trace(p, "mooncake")
    p.write_text("".join(src[:20]))
    after = load_trace(p, "mooncake")
    assert after.num_requests == 20 != before.num_requests
    assert len(list(cache.glob("*.npz"))) == 2


def test_a_corrupt_entry_is_ignored_and_rewritten(cache):
    p = resolve_trace("weka")
    good = load_trace(p, limit_sessions=4)
    (entry,) = cache.glob("*.npz")
    entry.write_bytes(entry.read_bytes()[:1000])  # a writer that died half-way
    assert_same_trace(load_trace(p, limit_sessions=4), good)
    assert _read(entry, p) is not None  # rewritten whole


def test_an_unwritable_cache_only_costs_time(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SARIA_CACHE_DIR", str(blocker))
    assert load_trace(resolve_trace("weka"), limit_sessions=2).num_sessions == 2


def test_off_writes_nothing_and_a_bad_trace_is_never_cached(cache, tmp_path, monkeypatch):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\nnot json\n')
    for _ in range(2):
        with pytest.raises(TraceFormatError, match=r"bad.jsonl:2: invalid JSON"):
            load_trace(bad, "mooncake")
    assert not cache.exists() or not list(cache.glob("*.npz"))
    monkeypatch.setenv("SARIA_CACHE_DIR", "off")
    assert cache_dir() is None
    load_trace(resolve_trace("azure"))
    assert not cache.exists()


def test_the_least_recently_used_entries_beyond_the_cap_go(cache, monkeypatch):
    monkeypatch.setattr(tc, "MAX_ENTRIES", 2)
    p = resolve_trace("weka")
    first = load_trace(p, limit_sessions=1)
    load_trace(p, limit_sessions=2)
    old = time.time() - 100
    for e in cache.glob("*.npz"):
        os.utime(e, (old, old))
    assert_same_trace(load_trace(p, limit_sessions=1), first)  # read: now the most recent
    load_trace(p, limit_sessions=3)                             # a third entry: one must go
    assert len(list(cache.glob("*.npz"))) == 2
    kept = {tc._key(p, "weka", n) for n in (1, 3)}
    assert {e.stem for e in cache.glob("*.npz")} == kept
