"""The cluster tier's parts that need no Mooncake: settings, rows, guard."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings as hsettings, strategies as st

from budgets import examples

from saria import _store
from saria.errors import ConfigError
from saria.tiers.remote.fleetkey import generate
from saria.tiers.remote import (HEADER_BYTES, BreakerState, Guard, RemoteSettings, RemoteUnavailable,
                                RowCodec, crc32c_rows, object_key, parse_master_url)

BASE = dict(master="mooncake://127.0.0.1:50051", metadata_server="http://127.0.0.1:8080/metadata")
KEY_ENV = "SARIA_TEST_FLEET_KEY"


@pytest.fixture(autouse=True)
def _fleet_key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, generate(1))


# ---------------------------------------------------------------- settings

def test_settings_from_mapping_parses_sizes_and_durations():
    s = RemoteSettings.from_mapping({"master": "mooncake://10.0.0.5:50051", "segment_bytes": "4GiB",
                                     "deadline": "20ms", "metadata_port": 8081, "lane": "3",
                                     "fleet_key_env": KEY_ENV})
    assert s.segment_bytes == 4 << 30 and s.deadline_s == pytest.approx(0.02) and s.lane == 3
    assert s.metadata_server == "http://10.0.0.5:8081/metadata"
    assert s.master_address == "10.0.0.5:50051"


@pytest.mark.parametrize("mapping, key", [
    ({"master": "mooncake://h:1", "deadlin": "1s"}, "remote.deadlin"),
    ({"segment_bytes": "1GB"}, "remote.master"),
    ({"master": "http://h:1"}, "remote.master"),
    ({"master": "mooncake://h:99999"}, "remote.master"),
    ({"master": "mooncake://h:1", "protocol": "udp"}, "remote.protocol"),
    ({"master": "mooncake://h:1", "protocol": "rdma"}, "remote.rdma_devices"),
    ({"master": "mooncake://h:1", "deadline": 0}, "remote.deadline_s"),
    ({"master": "mooncake://h:1", "lane": 0}, "remote.lane"),
    ({"master": "mooncake://h:1", "segment_bytes": "4XB"}, "remote.segment_bytes"),
    ({"master": "mooncake://h:1", "segment_bytes": "1MiB"}, "remote.segment_bytes"),
    ({"master": "mooncake://h:1", "staging_rows": True}, "remote.staging_rows"),
])
def test_settings_errors_name_the_key(mapping, key):
    with pytest.raises(ConfigError) as e:
        RemoteSettings.from_mapping(mapping)
    assert e.value.key == key, str(e.value)
    assert "\n" not in str(e.value)


def test_settings_prefix_rekeys_errors():
    with pytest.raises(ConfigError, match=r"^kv\.remote\.lane: "):
        RemoteSettings.from_mapping({"master": "mooncake://h:1", "lane": -1}, prefix="kv.remote")


def test_parse_master_url():
    assert parse_master_url("mooncake://[::1]:7") == ("::1", 7)
    assert parse_master_url("host:7") == ("host", 7)
    with pytest.raises(ConfigError, match="port 'x'"):
        parse_master_url("mooncake://host:x")


# ---------------------------------------------------------------- rows

def _rows(rng, n, block):
    keys = rng.integers(0, 256, (n, 32), dtype=np.uint8)
    payload = rng.integers(0, 256, (n, block), dtype=np.uint8)
    return keys, payload


def test_crc32c_rows_equals_the_scalar_crc():
    rng = np.random.default_rng(1)
    buf = rng.integers(0, 256, (7, 300), dtype=np.uint8)
    view = buf[:, 10:250]  # strided rows
    got = crc32c_rows(view, [6, 0, 3], 5, 200)
    want = [_store.crc32c(view[i, 5:205].tobytes()) for i in (6, 0, 3)]
    assert got.tolist() == want
    with pytest.raises(ValueError):
        crc32c_rows(view, [0], 100, 200)
    with pytest.raises(IndexError):
        crc32c_rows(view, [7], 0, 10)


def test_object_keys_are_namespaced():
    k = bytes(range(32))
    assert object_key("a", k) != object_key("b", k)
    assert object_key("a", k).endswith(k.hex())
    keys = np.random.default_rng(0).integers(0, 256, (5, 32), dtype=np.uint8)
    codec = RowCodec("a", 10)
    assert codec.keys(keys) == [codec.key(x.tobytes()) for x in keys] == [object_key("a", x.tobytes()) for x in keys]


@hsettings(max_examples=examples(60), deadline=None)
@given(st.data())
def test_any_changed_byte_is_a_miss(data):
    """A row verifies for its key, namespace and format only: a flip of any
    header or payload byte, another key or another namespace fails it."""
    block = data.draw(st.integers(1, 300))
    n = data.draw(st.integers(1, 5))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    keys, payload = _rows(rng, n, block)
    codec = RowCodec("layoutA", block)
    heads = np.empty((n, HEADER_BYTES), np.uint8)
    codec.encode(heads, payload, np.arange(n), keys)
    assert codec.verify(heads, payload, np.arange(n), keys).all()
    i = data.draw(st.integers(0, n - 1))
    pos = data.draw(st.integers(0, HEADER_BYTES + block - 1))
    bit = np.uint8(1 << data.draw(st.integers(0, 7)))
    h2, p2 = heads.copy(), payload.copy()
    if pos < HEADER_BYTES:
        h2[i, pos] ^= bit
    else:
        p2[i, pos - HEADER_BYTES] ^= bit
    ok = codec.verify(h2, p2, np.arange(n), keys)
    assert not ok[i] and ok.sum() == n - 1
    other = keys.copy()
    other[i, 0] ^= 1
    assert not codec.verify(heads, payload, np.arange(n), other)[i]
    assert not RowCodec("layoutB", block).verify(heads, payload, np.arange(n), keys).any()
    if block > 1:  # another block size is another format
        assert not RowCodec("layoutA", block - 1).verify(heads, payload[:, :-1], np.arange(n), keys).any()


# ---------------------------------------------------------------- guard

class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _guard(clock=None, **kw):
    args = dict(deadline_s=0.2, lane=2, breaker_failures=2, breaker_cooldown_s=5.0)
    args.update(kw)
    return Guard(clock=clock or time.monotonic, **args)


def _fail():
    raise RemoteUnavailable("rpc failed")


def test_guard_returns_the_value_and_runs_then_at_once():
    g = _guard()
    t = g.submit("op", lambda: 42)
    assert t.outcome.ok and t.outcome.value == 42
    ran = []
    t.then(lambda: ran.append(1))
    assert ran == [1]
    g.close()


def test_guard_deadline_and_release_at_the_real_end():
    g = _guard(deadline_s=0.05)
    release = threading.Event()
    t0 = time.monotonic()
    t = g.submit("op", lambda: release.wait(5))
    assert t.outcome.reason == "timeout"
    assert time.monotonic() - t0 < 2.0  # the caller left long before the call ended
    ran = []
    t.then(lambda: ran.append(1))
    assert ran == [] and not t.done  # the call still owns its buffers
    release.set()
    assert t.wait_settled(5)
    deadline = time.monotonic() + 5
    while not ran and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ran == [1]
    g.close()


def test_guard_lane_full_refuses_at_once():
    g = _guard(deadline_s=0.01, lane=1, breaker_failures=100)
    release = threading.Event()
    assert g.submit("op", lambda: release.wait(5)).outcome.reason == "timeout"
    assert g.submit("op", lambda: 1).outcome.reason == "lane_full"
    release.set()
    deadline = time.monotonic() + 5
    while g.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert g.submit("op", lambda: 1).outcome.ok
    g.close()


def test_breaker_opens_probes_and_closes():
    clock = Clock()
    g = _guard(clock)
    assert g.submit("op", _fail).outcome.reason == "unavailable"
    assert g.state == BreakerState.CLOSED
    assert g.submit("op", _fail).outcome.reason == "unavailable"
    assert g.state == BreakerState.OPEN
    calls = []
    assert g.submit("op", lambda: calls.append(1)).outcome.reason == "down" and calls == []
    clock.t = 5.0  # cooldown over: one probe, and it fails
    assert g.submit("op", _fail).outcome.reason == "unavailable"
    assert g.state == BreakerState.OPEN
    assert g.submit("op", lambda: 1).outcome.reason == "down"
    clock.t = 10.0  # the next probe succeeds
    assert g.submit("op", lambda: 1).outcome.ok
    assert g.state == BreakerState.CLOSED
    assert g.submit("op", _fail).outcome.reason == "unavailable"  # one failure does not open it
    assert g.state == BreakerState.CLOSED
    g.close()


def test_a_bug_in_a_call_is_an_error_not_an_outage():
    g = _guard(breaker_failures=1)
    t = g.submit("op", lambda: 1 / 0)
    assert t.outcome.reason == "error" and isinstance(t.outcome.value, ZeroDivisionError)
    assert g.state == BreakerState.CLOSED
    g.close()


def test_no_probe_while_late_calls_hold_the_lane():
    clock = Clock()
    g = _guard(clock, deadline_s=0.02, lane=1, breaker_failures=1)
    release = threading.Event()
    assert g.submit("op", lambda: release.wait(5)).outcome.reason == "timeout"
    assert g.state == BreakerState.OPEN
    clock.t = 10.0  # cooldown over, but the late call still holds the only thread
    assert g.submit("op", lambda: 1).outcome.reason == "down"
    assert g.state == BreakerState.OPEN
    release.set()
    deadline = time.monotonic() + 5
    while g.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert g.submit("op", lambda: 1).outcome.ok and g.state == BreakerState.CLOSED
    g.close()


# ---------------------------------------------------------------- signed rows and the fleet key

def _ring(text: str, write_id=None):
    from saria.tiers.remote import FleetKeys
    return FleetKeys.parse(text, source="t", write_id=write_id)


def test_signed_rows_verify_only_unchanged_and_under_a_key_of_the_ring():
    from saria.tiers.remote import SignedRowCodec

    block, n = 4096, 6
    rng = np.random.default_rng(5)
    keys = rng.integers(0, 256, (n, 32), dtype=np.uint8)
    payload = rng.integers(0, 256, (n, block), dtype=np.uint8)
    k1, k2 = generate(1), generate(2)
    old, new = SignedRowCodec("ns", block, _ring(k1)), SignedRowCodec("ns", block, _ring(f"{k1}\n{k2}"))
    assert new.key_id == 2 and new.read_ids == [1]
    heads = np.zeros((n, HEADER_BYTES), np.uint8)
    old.encode(heads, payload, np.arange(n), keys)
    assert old.verify(heads, payload, np.arange(n), keys).all()
    assert new.verify(heads, payload, np.arange(n), keys).all()  # an old key of the ring
    assert not SignedRowCodec("ns", block, _ring(k2, 2)).verify(heads, payload, np.arange(n), keys).any()
    assert not SignedRowCodec("ns2", block, _ring(k1)).verify(heads, payload, np.arange(n), keys).any()
    assert not old.verify(heads, payload, np.arange(n), keys[::-1]).any()  # another block's row
    for pos in (0, 9, 13, 17, 22, 26, 40, 63):  # every header field, the MAC itself
        bad = heads.copy()
        bad[2, pos] ^= 1
        assert old.verify(bad, payload, np.arange(n), keys).tolist() == [i != 2 for i in range(n)]
    p = payload.copy()
    p[4, 4000] ^= 0x80
    assert old.verify(heads, p, np.arange(n), keys).tolist() == [i != 4 for i in range(n)]
    # names: secret per key and namespace, never the public v1 name
    names = old.keys(keys)
    assert names == [old.key(k.tobytes()) for k in keys] == new.names(keys, 1)
    assert new.keys(keys) != names and SignedRowCodec("ns2", block, _ring(k1)).keys(keys) != names
    assert not set(names) & {object_key("ns", k.tobytes()) for k in keys}
    assert "ns" not in names[0] and keys[0].tobytes().hex() not in names[0]


def test_fleet_key_file_must_be_ours_and_private(tmp_path, monkeypatch):
    from saria.tiers.remote import FleetKeys

    path = tmp_path / "fleet.key"
    path.write_text(f"# two keys\n{generate(7)}\n{generate(3)}\n")
    path.chmod(0o644)
    with pytest.raises(ConfigError, match=r"^remote\.fleet_key_file: .*mode 0644.*chmod 600"):
        FleetKeys.from_file(str(path))
    path.chmod(0o600)
    ring = FleetKeys.from_file(str(path))
    assert ring.write_id == 7 and sorted(ring.keys) == [3, 7] and "7" in repr(ring)
    assert ring.write_key.hex() not in repr(ring)
    assert FleetKeys.from_file(str(path), write_id=3).write_id == 3
    with pytest.raises(ConfigError, match=r"^remote\.fleet_key_id: 5 is not in"):
        FleetKeys.from_file(str(path), write_id=5)
    for text in ("1:abcd", "0:" + "00" * 32, "x:" + "00" * 32, f"{generate(1)},{generate(1)}", "# none"):
        with pytest.raises(ConfigError):
            FleetKeys.parse(text, source="t")
    s = RemoteSettings.from_mapping({"master": "mooncake://h:1", "fleet_key_file": str(path)})
    assert s.fleet_keys.write_id == 7
    with pytest.raises(ConfigError, match=r"^remote\.fleet_key_file: give .* not both"):
        RemoteSettings.from_mapping({"master": "mooncake://h:1", "fleet_key_file": str(path),
                                     "fleet_key_env": KEY_ENV})
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(ConfigError, match=r"^remote\.fleet_key_env: \$SARIA_TEST_FLEET_KEY is not set"):
        RemoteSettings.from_mapping({"master": "mooncake://h:1", "fleet_key_env": KEY_ENV})


def test_saria_fleet_key_writes_a_private_file_once(tmp_path, capsys):
    from saria.cli.main import main
    from saria.tiers.remote import FleetKeys

    path = tmp_path / "fleet.key"
    assert main(["fleet-key", "--id", "4", "--out", str(path)]) == 0
    assert (path.stat().st_mode & 0o777) == 0o600
    assert FleetKeys.from_file(str(path)).write_id == 4
    assert main(["fleet-key", "--out", str(path)]) == 2  # never over an existing file
    assert "--out: " in capsys.readouterr().err


def test_the_row_mac_is_hmac_sha256_of_the_documented_input():
    """The format the module docstring gives (another implementation -- the
    attack tests' raw client -- derives keys and MACs from it)."""
    import hashlib
    import hmac

    from saria.tiers.remote import SignedRowCodec

    line = generate(3)
    key = bytes.fromhex(line.split(":")[1])
    for block, n in ((4096, 1), (1 << 20, 3)):  # the caller's thread, and the pool's
        codec = SignedRowCodec("ns", block, _ring(line))
        rng = np.random.default_rng(block)
        keys = rng.integers(0, 256, (n, 32), dtype=np.uint8)
        payload = rng.integers(0, 256, (n, block), dtype=np.uint8)
        heads = np.zeros((n, HEADER_BYTES), np.uint8)
        codec.encode(heads, payload, np.arange(n), keys)
        mk = hmac.digest(key, b"saria-row-mac\0ns", "sha256")
        tag = hashlib.blake2b(b"ns", digest_size=8).digest()
        for i in range(n):
            h = heads[i].tobytes()
            assert h[:32] == b"SARIAROW" + np.array([2, block, 3, 0], "<u4").tobytes() + tag
            assert h[32:] == hmac.digest(mk, h[:32] + keys[i].tobytes() + payload[i].tobytes(), "sha256")
        nk = hmac.digest(key, b"saria-row-name\0ns", "sha256")
        assert codec.keys(keys)[0] == f"saria/r2/3/{hmac.digest(nk, keys[0].tobytes(), 'sha256').hex()}"
