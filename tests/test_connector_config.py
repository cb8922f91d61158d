"""kv_connector_extra_config validation: every bad value names its key."""

from __future__ import annotations

import json

import pytest

from saria.connector.config import KEYS, check_fits, parse_config
from saria.connector.layout import Geometry
from saria.errors import ConfigError


def test_defaults_and_sizes_with_units(tmp_path):
    c = parse_config({"dram_bytes": "2GiB", "ssd_dirs": [str(tmp_path)], "ssd_bytes": "1MB"})
    assert c.dram_bytes == 2 << 30 and c.ssd_bytes == 1_000_000 and c.has_ssd
    assert (c.admission, c.promotion, c.hash_algo, c.hash_seed) == \
        ("saria", "lazy", "sha256_cbor", "vllm-none-hash")


@pytest.mark.parametrize("extra, key, text", [
    ({}, "dram_bytes", "is required"),
    ({"dram_bytes": "1GB", "dram_bytez": 3}, "dram_bytez", "unknown key in kv_connector_extra_config; "
     "did you mean 'dram_bytes'?"),
    ({"dram_bytes": "lots"}, "dram_bytes", "cannot parse"),
    ({"dram_bytes": "1PB"}, "dram_bytes", "more than this machine"),
    ({"dram_bytes": -5}, "dram_bytes", ""),
    ({"dram_bytes": "1GB", "ssd_dirs": "/tmp"}, "ssd_dirs", "list"),
    ({"dram_bytes": "1GB", "ssd_dirs": ["/tmp/a", "/tmp/a"]}, "ssd_dirs", "twice"),
    ({"dram_bytes": "1GB", "ssd_dirs": ["/proc/no/such"], "ssd_bytes": "1GB"}, "ssd_dirs",
     "cannot create"),
    ({"dram_bytes": "1GB", "ssd_bytes": "-1GB"}, "ssd_bytes", ""),
    ({"dram_bytes": "1GB", "hash_algo": "md5"}, "hash_algo", ""),
    ({"dram_bytes": "1GB", "hash_seed": 1.5}, "hash_seed", ""),
    ({"dram_bytes": "1GB", "admission": "E0"}, "admission", ""),
    ({"dram_bytes": "1GB", "promotion": "eager"}, "promotion", ""),
    ({"dram_bytes": "1GB", "promotion_r": 2}, "promotion_r", ""),
    ({"dram_bytes": "1GB", "write_queue": 0}, "write_queue", ""),
    ({"dram_bytes": "1GB", "events": "yes"}, "events", ""),
    ({"dram_bytes": "1GB", "metrics_port": 70000}, "metrics_port", ""),
    ({"dram_bytes": "1GB", "dwpd": 0}, "dwpd", ""),
    ({"dram_bytes": "1GB", "config_file": "/no/such.json"}, "config_file", "cannot read"),
])
def test_bad_values_name_their_key(extra, key, text):
    with pytest.raises(ConfigError, match=f"^{key}: .*{text}"):
        parse_config(extra)


def test_ssd_that_cannot_fit_names_ssd_bytes(tmp_path):
    with pytest.raises(ConfigError, match="^ssd_bytes: .* does not fit"):
        parse_config({"dram_bytes": "1GB", "ssd_dirs": [str(tmp_path)], "ssd_bytes": "1000PB"})


def test_config_file_with_inline_override(tmp_path):
    f = tmp_path / "saria.json"
    f.write_text(json.dumps({"dram_bytes": "1GB", "admission": "E2"}))
    c = parse_config({"config_file": str(f), "admission": "full-duplicate"})
    assert c.dram_bytes == 10**9 and c.admission == "full-duplicate"
    f.write_text('{"dram_bytes": "1GB",\n "nope": }')
    with pytest.raises(ConfigError, match=r"^config_file: .*saria.json:2: not valid JSON"):
        parse_config({"config_file": str(f)})


def test_sizes_checked_against_the_models_block():
    c = parse_config({"dram_bytes": 1000})
    with pytest.raises(ConfigError, match="^dram_bytes: 1,000 B cannot hold one 16-token block"):
        check_fits(c, 65536, 16)


def test_store_namespace_separates_what_pages_depend_on():
    g = Geometry(32, 16384, ("l0", "l1"), 1, 0, 100, "torch.bfloat16", "m", "LBHNC/cpu")
    ns = g.namespace("sha256_cbor", "s")
    assert ns == g.namespace("sha256_cbor", "s")
    for other in (g.namespace("sha256_cbor", "t"), g.namespace("xxhash_cbor", "s"),
                  Geometry(32, 16384, ("l0", "l1"), 1, 0, 100, "torch.float32", "m",
                           "LBHNC/cpu").namespace("sha256_cbor", "s"),
                  Geometry(32, 16384, ("l0", "l1"), 2, 0, 100, "torch.bfloat16", "m",
                           "LBHNC/cpu").namespace("sha256_cbor", "s")):
        assert other != ns
    assert set(KEYS) >= {"dram_bytes", "ssd_dirs", "ssd_bytes", "hash_seed", "admission",
                         "promotion", "hash_algo"}


def test_a_cache_server_owns_the_tiers_and_policies():
    """With ``server`` the engine sets no tier or policy of its own: each such
    key is refused by name; a malformed address and timeout are refused too."""
    cfg = parse_config({"server": "ipc:///tmp/x.sock", "engine_name": "gpu3",
                        "server_timeout_s": 0.25})
    assert cfg.server == "ipc:///tmp/x.sock" and cfg.engine_name == "gpu3"
    assert cfg.server_timeout_s == 0.25 and not cfg.has_ssd
    check_fits(cfg, 1 << 30, 16)  # the server checks sizes, not the engine
    for key, value in (("dram_bytes", "1GB"), ("ssd_dirs", ["/tmp"]), ("admission", "E2"),
                       ("dwpd", 3)):
        with pytest.raises(ConfigError, match=f"^{key}: is the server's"):
            parse_config({"server": "ipc:///tmp/x.sock", key: value})
    with pytest.raises(ConfigError, match="^server: must be a ZMQ address"):
        parse_config({"server": "localhost:5555"})
    with pytest.raises(ConfigError, match="^server_timeout_s:"):
        parse_config({"server": "ipc:///tmp/x.sock", "server_timeout_s": 0})
    with pytest.raises(ConfigError, match="^server_start_s: must be a positive number"):
        parse_config({"server": "ipc:///tmp/x.sock", "server_start_s": "10"})
    assert parse_config({"server": "ipc:///tmp/x.sock"}).server_start_s == 10.0


def test_the_remote_key_is_checked_by_its_own_keys(monkeypatch):
    """``remote``: the cluster tier's settings, each bad one named under
    ``remote.``; beside ``server`` it is the server's (``saria serve --remote``)."""
    from saria.tiers.remote.fleetkey import generate

    monkeypatch.setenv("SARIA_TEST_FLEET_KEY", generate(1))
    cfg = parse_config({"dram_bytes": "1GB", "remote": {"master": "mooncake://10.0.0.5:50051",
                                                        "segment_bytes": "4GB", "deadline": "20ms",
                                                        "fleet_key_env": "SARIA_TEST_FLEET_KEY"}})
    assert cfg.remote["master"] == "mooncake://10.0.0.5:50051"
    assert parse_config({"dram_bytes": "1GB"}).remote is None
    for remote, text in (({"segment_bytes": "4GB"}, "remote.master: is required"),
                         ({"master": "mooncake://h:1", "lane": 0}, "remote.lane:"),
                         ({"master": "mooncake://h:1", "protocol": "udp"}, "remote.protocol:"),
                         ({"master": "mooncake://h:1", "segmet_bytes": 1}, "remote.segmet_bytes: unknown"),
                         ({"master": "mooncake://h:1"}, "remote.fleet_key_file: a cluster tier needs"),
                         ("mooncake://h:1", "remote: must be a mapping")):
        with pytest.raises(ConfigError, match=f"^{text}"):
            parse_config({"dram_bytes": "1GB", "remote": remote})
    with pytest.raises(ConfigError, match="^remote: is the server's"):
        parse_config({"server": "ipc:///tmp/x.sock", "remote": {"master": "mooncake://h:1"}})


def test_saria_log_lines_appear_in_vllms_log():
    """The plugin hands saria's records to vLLM's logger, configured after
    plugins load. Before: the line went nowhere (no handler)."""
    import subprocess
    import sys

    pytest.importorskip("vllm")
    code = ("import logging, vllm.logger\n"
            "from saria.connector.vllm import register_vllm_plugin\n"
            "register_vllm_plugin()\n"
            "vllm.logger._configure_vllm_root_logger()\n"
            "logging.getLogger('saria.connector').info('saria: a line for the operator')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if "a line for the operator" in ln]
    assert len(lines) == 1 and "INFO" in lines[0], r.stdout + r.stderr
