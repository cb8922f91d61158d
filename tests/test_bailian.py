"""Bailian (Alibaba Qwen) loader: the bundled sample, format detection, malformed files."""

from __future__ import annotations

import json

import pytest

from saria.errors import TraceFormatError
from saria.traces import bundled_trace, detect_format, load_bailian, load_trace, trace_stats

BS = 16


@pytest.fixture(scope="module")
def sample_path():
    return bundled_trace("bailian")


@pytest.fixture(scope="module")
def records(sample_path):
    return [json.loads(line) for line in sample_path.read_text().splitlines() if line.strip()]


def test_sample_loads_as_sessions(sample_path, records):
    assert detect_format(sample_path) == "bailian"
    trace = load_trace(sample_path)
    assert (trace.format, trace.block_size, trace.partial_last_block, trace.has_sessions) == ("bailian", 16, True, True)
    assert trace.num_sessions == 6 and trace.num_requests == len(records) == 29
    assert [len(s.requests) for s in trace.sessions] == [6, 5, 4, 6, 4, 4]
    assert {s.namespace for s in trace.sessions} == {0}  # global ids
    by_line = {r.line: r for r in trace.requests()}
    for s in trace.sessions:
        times = [r.time for r in s.requests]
        assert times == sorted(times)
        prev = None
        for r in s.requests:
            rec = records[r.line - 1]
            assert (r.input_tokens, r.output_tokens, r.time) == (rec["input_length"], rec["output_length"], rec["timestamp"])
            assert r.hash_ids.tolist() == rec["hash_ids"] and len(rec["hash_ids"]) == -(-rec["input_length"] // BS)
            if prev is not None:  # each turn extends the previous turn's full blocks
                full = prev.input_tokens // BS
                assert r.hash_ids[:full].tolist() == prev.hash_ids[:full].tolist()
                assert by_line[r.line].session == prev.session
            prev = r


def test_sample_hit_ratio_matches_hand_count(sample_path, records):
    """By hand: a later turn hits exactly its parent's full blocks (its partial last block
    was re-hashed); first turns hit only a system prompt an earlier session already sent:
    sessions 2 and 4 reuse the 12-block assistant prompt of session 1, session 5 the
    2-block search prompt of session 3. Every hit block is a full 16-token block."""
    by_chat = {r["chat_id"]: r for r in records}
    hits = sum(by_chat[r["parent_chat_id"]]["input_length"] // BS for r in records if r["parent_chat_id"] != -1)
    hits += 12 + 12 + 2
    blocks = sum(len(r["hash_ids"]) for r in records)
    tokens = sum(r["input_length"] for r in records)
    assert (hits, blocks, tokens) == (822, 1199, 18983)
    st = trace_stats(load_trace(sample_path))
    assert st.blocks == blocks and st.unique_blocks == blocks - hits
    assert st.hit_ratio_blocks == pytest.approx(hits / blocks) == pytest.approx(0.68557, abs=1e-5)
    assert st.hit_ratio_tokens == pytest.approx(hits * BS / tokens) == pytest.approx(0.69283, abs=1e-5)
    assert st.prefix_hit_ratio_blocks == st.hit_ratio_blocks
    assert st.tokens_without_ids == 0


def rec(chat, parent=-1, t=0.0, n_in=40, ids=None, turn=1, **extra):
    r = {"chat_id": chat, "parent_chat_id": parent, "timestamp": t, "input_length": n_in,
         "output_length": 5, "type": "text", "turn": turn,
         "hash_ids": list(range(-(-n_in // BS))) if ids is None else ids}
    r.update(extra)
    return r


def write(tmp_path, rows, name="b.jsonl"):
    f = tmp_path / name
    f.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return f


def test_floor_files_and_detection(tmp_path):
    f = write(tmp_path, [rec(1, n_in=40, ids=[0, 1]), rec(2, 1, 1.0, n_in=70, ids=[0, 1, 2, 3], turn=2)], "x.txt")
    assert detect_format(f) == "bailian"
    trace = load_trace(f)
    assert trace.partial_last_block is False and trace.num_sessions == 1
    st = trace_stats(trace)
    assert st.tokens_without_ids == (40 - 32) + (70 - 64)
    # orphan parents: an error by default, a new session when not strict
    f = write(tmp_path, [rec(1), rec(2, 99, 1.0, turn=2)])
    assert load_bailian(f, strict_parents=False).num_sessions == 2


@pytest.mark.parametrize(
    ("rows", "line", "needle"),
    [
        ([rec(1), rec(2, 7, 1.0, turn=2)], 2, "unknown parent_chat_id 7"),
        ([rec(1), rec(2, 1, 1.0, turn=1)], 2, "turn 1 is not after its parent's turn 1"),
        ([rec(1), rec(1, t=2.0)], 2, "chat_id 1 already used on line 1"),
        ([rec(1, n_in=40, ids=[0, 1, 2, 3])], 1, "has 4 ids, expected 3 (ceil) or 2 (floor)"),
        ([rec(1, n_in=40), rec(2, n_in=40, ids=[5, 6])], 2, "line 1 selected ceil"),
        ([{k: v for k, v in rec(1).items() if k != "turn"}], 1, "missing field 'turn'"),
        ([rec(1, parent="none")], 1, "field 'parent_chat_id' must be an integer"),
        ([rec(1, t=-1.0)], 1, "field 'timestamp' must be finite and non-negative"),
        ([rec(1, type=3)], 1, "field 'type' must be a string"),
        ([rec(1, ids=[0, "a", 2])], 1, "field 'hash_ids' must be a list of integers"),
        ([rec(1), "{not json"], 2, "invalid JSON"),
    ],
)
def test_malformed_files_name_file_and_line(tmp_path, rows, line, needle):
    f = write(tmp_path, rows)
    with pytest.raises(TraceFormatError) as info:
        load_bailian(f)
    assert info.value.line == line and info.value.path == str(f)
    assert str(info.value).startswith(f"{f}:{line}: ") and needle in str(info.value)
