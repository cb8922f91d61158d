"""Trace loaders, statistics and the ``saria traces stats`` command, on the bundled data
and on malformed files written here."""

from __future__ import annotations

import argparse
import io
import json
import tarfile

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from budgets import examples

from saria.errors import ConfigError, TraceFormatError
from saria.traces import (
    Trace,
    TraceRequest,
    TraceSession,
    bundled_trace,
    detect_format,
    load_azure,
    load_mooncake,
    load_trace,
    load_weka,
    trace_stats,
    traces_dir,
)

# --- bundled data ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def mooncake():
    return load_trace(bundled_trace("mooncake"))


def test_mooncake_bundled_stats(mooncake):
    s = trace_stats(mooncake)
    assert (s.requests, s.blocks, s.unique_blocks) == (12_031, 288_500, 182_790)
    assert s.hit_ratio_blocks == pytest.approx(0.366, abs=5e-4)
    assert s.hit_ratio_tokens == pytest.approx(0.374, abs=5e-4)
    # prefix-chained ids: "seen anywhere before" equals prefix-contiguous
    assert s.prefix_hit_ratio_blocks == s.hit_ratio_blocks
    assert s.tokens_without_ids == 0 and s.input_tokens == 144_793_823
    assert s.time_span_s == pytest.approx(3537.0, abs=0.01)


def test_mooncake_model_invariants(mooncake):
    assert mooncake.partial_last_block and mooncake.block_size == 512 and not mooncake.has_sessions
    reqs = list(mooncake.requests())
    assert all(r.num_blocks == -(-r.input_tokens // 512) for r in reqs)
    assert all(r.hash_ids.dtype == np.uint32 and r.namespace == 0 for r in reqs)
    times = [r.time for r in reqs]
    assert times == sorted(times) and times[0] == 0.0
    assert reqs[0].line == 1 and reqs[-1].line == 12_031


@pytest.mark.slow
def test_weka_bundled_stats():
    trace = load_trace(bundled_trace("weka"))
    s = trace_stats(trace)
    assert (s.requests, s.sessions, s.blocks) == (49_334, 710, 94_310_647)
    assert s.subagent_requests == 676 and s.unique_blocks == 3_450_959
    assert s.hit_ratio_blocks == pytest.approx(0.963, abs=5e-4)
    assert s.hit_ratio_tokens == pytest.approx(0.963, abs=5e-4)
    assert s.prefix_hit_ratio_blocks == s.hit_ratio_blocks
    assert s.median_session_span_s == 3589.0
    assert s.tokens_without_ids == sum(r.input_tokens % 64 for r in trace.requests())
    assert all(r.num_blocks == r.input_tokens // 64 for r in trace.requests())


def test_weka_limit_sessions_and_namespaces():
    trace = load_weka(bundled_trace("weka"), limit_sessions=4)
    assert trace.num_sessions == 4 and not trace.partial_last_block and trace.block_size == 64
    for s in trace.sessions:
        assert s.namespace == int(s.name.split("_")[1])
        assert all(r.namespace == s.namespace and r.session == s.name for r in s.requests)
        times = [r.time for r in s.requests]
        assert times == sorted(times)
    assert load_weka(bundled_trace("weka"), limit_sessions=0).num_sessions == 0


def test_azure_bundled():
    trace = load_trace(bundled_trace("azure"))
    s = trace_stats(trace)
    assert s.requests == 19_366 and s.blocks == 0 and s.hit_ratio_blocks is None
    assert s.time_span_s == pytest.approx(3501.7, abs=0.05)
    first = next(trace.requests())
    assert first.time == 0.0 and (first.input_tokens, first.output_tokens) == (374, 44)


def test_bundled_dir_override(tmp_path, monkeypatch):
    assert (traces_dir() / "README.md").is_file()
    monkeypatch.setenv("SARIA_TRACES_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(TraceFormatError, match="nowhere"):
        bundled_trace("weka")
    monkeypatch.setenv("SARIA_TRACES_DIR", str(tmp_path))
    with pytest.raises(TraceFormatError, match="missing"):
        bundled_trace("mooncake")
    with pytest.raises(ConfigError, match="weka, mooncake, azure"):
        bundled_trace("alibaba")


# --- small WEKA documents -------------------------------------------------------------


def weka_doc(sid="trace_0007", requests=None):
    if requests is None:
        requests = [
            {"t": 0.0, "type": "n", "in": 130, "out": 5, "hash_ids": [1, 2], "think_time": 0.0, "api_time": 1.5},
            {"t": 10.0, "type": "subagent", "agent_id": "agent_001", "requests": [
                {"t": 0.0, "type": "n", "in": 70, "out": 3, "hash_ids": [1]},
                {"t": 4.5, "type": "s", "in": 64, "out": 3, "hash_ids": [1], "think_time": 1.0},
            ]},
            {"t": 12.0, "type": "s", "in": 200, "out": 9, "hash_ids": [1, 2, 3]},
        ]
    return {"id": sid, "block_size": 64, "hash_id_scope": "local", "requests": requests}


def write_tar(path, members: dict[str, bytes]):
    with tarfile.open(path, "w:xz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_weka_subagents_join_parent_with_absolute_times(tmp_path):
    f = tmp_path / "trace_0007.json"
    f.write_bytes(orjson.dumps(weka_doc()))
    trace = load_trace(f)
    assert trace.format == "weka" and trace.num_sessions == 1
    (s,) = trace.sessions
    assert s.namespace == 7
    assert [(r.time, r.is_subagent) for r in s.requests] == [(0.0, False), (10.0, True), (12.0, False), (14.5, True)]
    assert s.requests[1].agent_id == "agent_001" and (s.requests[3].line, s.requests[3].sub_index) == (1, 1)
    assert s.requests[0].api_time == 1.5 and s.requests[1].think_time is None
    st_ = trace_stats(trace)
    # blocks: [1,2] [1] [1,2,3] [1] in time order -> hits 0,1,2,1 of 7; tail tokens 2+6+8+0
    assert st_.blocks == 7 and st_.hit_ratio_blocks == pytest.approx(4 / 7)
    assert st_.tokens_without_ids == 16 and st_.hit_ratio_tokens == pytest.approx(4 * 64 / (130 + 70 + 200 + 64))


def test_weka_tar_directory_and_file_agree(tmp_path):
    docs = {f"weka_traces/trace_{i:04d}.json": orjson.dumps(weka_doc(f"trace_{i:04d}")) for i in (3, 1, 2)}
    write_tar(tmp_path / "b.tar.xz", docs)
    (tmp_path / "d").mkdir()
    for name, data in docs.items():
        (tmp_path / "d" / name.split("/")[1]).write_bytes(data)
    a, b = load_trace(tmp_path / "b.tar.xz"), load_trace(tmp_path / "d")
    assert [s.namespace for s in a.sessions] == [s.namespace for s in b.sessions] == [1, 2, 3]
    assert trace_stats(a).blocks == trace_stats(b).blocks == 21
    assert load_weka(tmp_path / "b.tar.xz", limit_sessions=2).num_sessions == 2


def test_weka_bad_tar_member_is_named(tmp_path):
    bad = weka_doc("trace_0002")
    bad["requests"][1]["requests"][1]["hash_ids"] = [1, 2]  # in=64 -> floor(64/64) = 1 id
    write_tar(
        tmp_path / "b.tar.xz",
        {"weka_traces/trace_0001.json": orjson.dumps(weka_doc("trace_0001")),
         "weka_traces/trace_0002.json": orjson.dumps(bad)},
    )
    with pytest.raises(TraceFormatError) as e:
        load_trace(tmp_path / "b.tar.xz")
    msg = str(e.value)
    assert e.value.path == str(tmp_path / "b.tar.xz")
    assert "member weka_traces/trace_0002.json" in msg and "requests[1].requests[1]" in msg
    assert "'hash_ids' has 2 ids, expected 1" in msg and "\n" not in msg


@pytest.mark.parametrize(
    "mutate, expect",
    [
        (lambda d: d["requests"][0].pop("in"), "requests[0]: missing field 'in'"),
        (lambda d: d["requests"][2].update({"in": -5}), "requests[2]: field 'in' is negative"),
        (lambda d: d["requests"][0].update({"hash_ids": [1, -2]}), "negative id"),
        (lambda d: d["requests"][0].update({"hash_ids": [1, 2.5]}), "list of integers"),
        (lambda d: d["requests"][2].update({"t": "soon"}), "requests[2]: field 't' must be a number"),
        (lambda d: d["requests"][2].update({"type": "x"}), "field 'type'"),
        (lambda d: d.update({"id": "nameless"}), "field 'id'"),
        (lambda d: d.pop("requests"), "missing field 'requests'"),
    ],
)
def test_weka_malformed_fields(tmp_path, mutate, expect):
    doc = weka_doc()
    mutate(doc)
    f = tmp_path / "trace_0007.json"
    f.write_bytes(orjson.dumps(doc))
    with pytest.raises(TraceFormatError, match=None) as e:
        load_weka(f)
    assert expect in str(e.value) and str(f) in str(e.value)


def test_weka_truncated_json_and_corrupt_xz(tmp_path):
    f = tmp_path / "trace_0001.json"
    f.write_bytes(orjson.dumps(weka_doc())[:-20])
    with pytest.raises(TraceFormatError, match="invalid JSON") as e:
        load_weka(f)
    assert e.value.line == 1
    write_tar(tmp_path / "b.tar.xz", {"weka_traces/trace_0009.json": orjson.dumps(weka_doc())[:50]})
    with pytest.raises(TraceFormatError, match="member weka_traces/trace_0009.json: invalid JSON"):
        load_weka(tmp_path / "b.tar.xz")
    raw = (tmp_path / "b.tar.xz").read_bytes()
    (tmp_path / "c.tar.xz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(TraceFormatError, match="cannot read tar bundle"):
        load_weka(tmp_path / "c.tar.xz")


# --- Mooncake and Azure malformed files -----------------------------------------------

GOOD_MC = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}'


@pytest.mark.parametrize(
    "bad, expect",
    [
        ('{"timestamp": 3000, "input_length": 600, "output_', "invalid JSON"),
        ('{"timestamp": 3000, "input_length": 600, "output_length": 5}', "missing field 'hash_ids'"),
        ('{"timestamp": 3000, "input_length": -1, "output_length": 5, "hash_ids": []}', "'input_length' is negative"),
        ('{"timestamp": "3s", "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}', "'timestamp' must be a number"),
        ('{"timestamp": -3, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}', "'timestamp' must be finite"),
        ('{"timestamp": 3000, "input_length": 600, "output_length": 5, "hash_ids": [0]}', "has 1 ids, expected 2"),
        ('[1, 2]', "expected a JSON object"),
    ],
)
def test_mooncake_malformed_line_is_named(tmp_path, bad, expect):
    f = tmp_path / "t.jsonl"
    f.write_text("\n".join([GOOD_MC, GOOD_MC, bad, GOOD_MC]) + "\n")
    with pytest.raises(TraceFormatError) as e:
        load_trace(f)
    assert (e.value.path, e.value.line) == (str(f), 3)
    assert str(e.value).startswith(f"{f}:3: ") and expect in str(e.value)


def test_mooncake_times_in_seconds(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(GOOD_MC.replace('"timestamp": 0', '"timestamp": 1500') + "\n\n" + GOOD_MC + "\n")
    trace = load_mooncake(f)
    assert [(r.time, r.line) for r in trace.requests()] == [(0.0, 3), (1.5, 1)]


@pytest.mark.parametrize(
    "row, expect",
    [
        ("2023-11-16 18:15:4x.1000000,374,44", "bad timestamp"),
        ("2023-11-16 18:15:50.1000000,-3,44", "'ContextTokens' is negative"),
        ("2023-11-16 18:15:50.1000000,374", "expected 3 fields"),
        ("2023-11-16 18:15:50.1000000,374,many", "'GeneratedTokens' must be an integer"),
    ],
)
def test_azure_malformed_line_is_named(tmp_path, row, expect):
    f = tmp_path / "a.csv"
    f.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n{row}\n")
    with pytest.raises(TraceFormatError) as e:
        load_azure(f)
    assert (e.value.path, e.value.line) == (str(f), 3) and expect in str(e.value)


def test_azure_truncates_seven_digit_fractions(tmp_path):
    f = tmp_path / "a.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:47.0000009,1,1\n2023-11-16 18:15:46.6805909,2,2\n")
    assert [r.time for r in load_azure(f).requests()] == [0.0, pytest.approx(0.319410)]
    f.write_text("TIME,Tokens\n1,2\n")
    with pytest.raises(TraceFormatError, match=r"a.csv:1: header lacks column 'TIMESTAMP'"):
        load_azure(f)


def test_detect_and_unknown_formats(tmp_path):
    assert detect_format(bundled_trace("weka")) == "weka"
    assert detect_format(bundled_trace("mooncake")) == "mooncake"
    assert detect_format(bundled_trace("azure")) == "azure"
    f = tmp_path / "trace.txt"
    f.write_text(GOOD_MC + "\n")
    assert detect_format(f) == "mooncake" and load_trace(f).num_requests == 1
    f.write_text("hello\n")
    with pytest.raises(TraceFormatError, match="weka, mooncake, azure"):
        load_trace(f)
    with pytest.raises(ConfigError, match="auto, weka, mooncake, azure"):
        load_trace(f, format="vidur")
    with pytest.raises(TraceFormatError, match="no such file"):
        load_trace(tmp_path / "absent.jsonl")


# --- statistics against a brute-force reference ---------------------------------------


def reference_hits(sessions, bs, partial):
    """Per-namespace sets, one request at a time: (hit, prefix hit) blocks and tokens."""
    hb = pb = ht = pt = 0
    for reqs in sessions:
        seen: set[int] = set()
        for n_in, ids in reqs:
            prefix_open = True
            for k, i in enumerate(ids):
                size = min(bs, n_in - k * bs) if partial else bs
                hit = i in seen
                prefix_open = prefix_open and hit
                hb, ht = hb + hit, ht + size * hit
                pb, pt = pb + prefix_open, pt + size * prefix_open
            seen.update(ids)
    return hb, pb, ht, pt


@settings(max_examples=examples(80), deadline=None)
@given(
    sessions=st.lists(st.lists(st.lists(st.integers(0, 12), max_size=8), max_size=6), min_size=1, max_size=4),
    partial=st.booleans(),
    big_ids=st.booleans(),
)
def test_stats_match_brute_force(sessions, partial, big_ids):
    bs = 4
    offset = 2**40 if big_ids else 0  # exercises the sort (np.unique) path
    built, ref_input = [], []
    for ns, reqs in enumerate(sessions):
        rs = []
        for t, ids in enumerate(reqs):
            n_in = len(ids) * bs - (1 if partial and ids else 0) + (0 if partial else 3)
            arr = np.array([i + offset for i in ids], dtype=np.uint64)
            rs.append(TraceRequest(namespace=ns, session=f"s{ns}", time=float(t), input_tokens=n_in,
                                   output_tokens=1, hash_ids=arr))
            ref_input.append((n_in, [i + offset for i in ids]))
        built.append(TraceSession(name=f"s{ns}", namespace=ns, requests=rs))
    trace = Trace("t", "-", "test", bs, partial, True, built)
    s = trace_stats(trace)
    ref = reference_hits([[(r.input_tokens, r.hash_ids.tolist()) for r in ses.requests] for ses in built], bs, partial)
    n_blocks = sum(len(ids) for _, ids in ref_input)
    n_in = sum(n for n, _ in ref_input)
    assert s.blocks == n_blocks
    assert s.unique_blocks == sum(len({i for ids in reqs for i in ids}) for reqs in sessions)
    if n_blocks:
        assert s.hit_ratio_blocks == pytest.approx(ref[0] / n_blocks)
        assert s.prefix_hit_ratio_blocks == pytest.approx(ref[1] / n_blocks)
    if n_in:
        assert s.hit_ratio_tokens == pytest.approx(ref[2] / n_in)
        assert s.prefix_hit_ratio_tokens == pytest.approx(ref[3] / n_in)


# --- CLI ------------------------------------------------------------------------------


def run_cli(argv):
    import saria.cli.traces_cmd as cmd

    parser = argparse.ArgumentParser()
    cmd.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_stats_json(tmp_path, capsys):
    out = tmp_path / "s.json"
    assert run_cli(["traces", "stats", "mooncake", str(bundled_trace("azure")), "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["format"] for r in rows] == ["mooncake", "azure"]
    assert rows[0]["hit_ratio_blocks"] == pytest.approx(0.3664, abs=1e-4)
    printed = capsys.readouterr().out
    assert "0.3664" in printed and "12,031" in printed and "19,366" in printed


def test_cli_errors_are_saria_errors(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"timestamp": 0}\n')
    with pytest.raises(TraceFormatError, match=r"t.jsonl:1: missing field"):
        run_cli(["traces", "stats", str(f)])
    with pytest.raises(SystemExit):
        run_cli(["traces", "stats", "--format", "vidur"])


def test_weka_empty_bundle_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceFormatError, match="no session"):
        load_weka(tmp_path / "empty")
    write_tar(tmp_path / "b.tar.xz", {"README.txt": b"hello"})
    with pytest.raises(TraceFormatError, match="no session"):
        load_weka(tmp_path / "b.tar.xz")


def _ids_by_inference(value: list) -> tuple[str, list] | str:
    """hash_ids_field's checking path alone (numpy's type inference), as it
    was before the array('q') fast path: the reference the fast path must
    agree with on every list."""
    from saria.traces.model import UINT32_LIMIT
    if not value:
        return ("uint32", [])
    try:
        arr = np.array(value)
    except (OverflowError, ValueError):
        return "error"
    if arr.dtype.kind not in "iu" or arr.ndim != 1:
        if arr.dtype == object and all(isinstance(v, int) and not isinstance(v, bool)
                                       and 0 <= v < 1 << 64 for v in value):
            return ("uint64", [int(v) for v in value])
        return "error"
    if arr.dtype.kind == "i" and int(arr.min()) < 0:
        return "error"
    dtype = "uint32" if int(arr.max()) < UINT32_LIMIT else "uint64"
    return (dtype, [int(v) for v in value])


_ID = (st.integers(0, 3) | st.integers(0, 2**32 + 5) | st.integers(-3, 2**64 + 3)
       | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=2))


@settings(max_examples=examples(400), deadline=None)
@given(st.lists(_ID, max_size=12))
def test_hash_ids_fast_path_agrees_with_type_inference(value):
    from saria.traces.model import FieldError, hash_ids_field
    try:
        arr = hash_ids_field({"hash_ids": value}, "hash_ids", None)
        got = (arr.dtype.name, [int(v) for v in arr])
    except FieldError:
        got = "error"
    assert got == _ids_by_inference(value)
