"""``saria serve`` fails at start, with one line naming the flag, on every
setting it can check without an engine (``saria.serve.startup``); it never
creates an SSD directory; its stop log says what the next start keeps."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys

import pytest

from saria.serve.client import RemoteCache
from saria.tiers.remote import MooncakeMaster, mooncake_available
from test_serve import LAYOUT, SLOT, Server, chain, store


# As root, mode bits do not stop a write: the server runs without the
# capability that lets root pass them, as a service user would.
_AS_USER = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search",
            "--inh-caps", "-dac_override,-dac_read_search", "--"]


def serve(*argv: str, drop_root: bool = False) -> subprocess.CompletedProcess:
    prefix = _AS_USER if drop_root and os.geteuid() == 0 else []
    return subprocess.run([*prefix, sys.executable, "-m", "saria.cli.main", "serve", *argv],
                          capture_output=True, text=True, timeout=60)


def one_line(r: subprocess.CompletedProcess, *words: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def _closed_port() -> int:
    with socket.socket() as s:  # bound, then released: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_missing_ssd_dir_fails_and_is_not_created(tmp_path):
    """Before: created at the first hello and a store file preallocated in it
    (an unmounted drive's mount point filled the root disk)."""
    missing = tmp_path / "nvme0" / "kv"
    one_line(serve("--listen", f"ipc://{tmp_path}/s.sock", "--ssd-dir", str(missing),
                   "--ssd-bytes", "1GB"), "--ssd-dir", str(missing), "does not exist")
    assert not (tmp_path / "nvme0").exists()


def test_a_file_is_not_an_ssd_dir(tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    one_line(serve("--listen", f"ipc://{tmp_path}/s.sock", "--ssd-dir", str(f),
                   "--ssd-bytes", "1MB"), "--ssd-dir", "is not a directory")


@pytest.mark.skipif(os.geteuid() == 0 and shutil.which("setpriv") is None,
                    reason="as root, needs setpriv to drop CAP_DAC_OVERRIDE")
def test_a_read_only_ssd_dir_fails(tmp_path):
    """Before: found at the first hello, which got RemoteError (internal)."""
    ro = tmp_path / "kv"
    ro.mkdir()
    ro.chmod(0o555)
    line = one_line(serve("--listen", f"ipc://{tmp_path}/s.sock", "--ssd-dir", str(ro),
                          "--ssd-bytes", "1MB", drop_root=True),
                    "--ssd-dir", str(ro), "cannot create files there")
    assert "ermission" in line or "ead-only" in line
    assert os.listdir(ro) == []


def test_an_ssd_dir_without_the_space_fails(tmp_path):
    (tmp_path / "kv").mkdir()
    one_line(serve("--listen", f"ipc://{tmp_path}/s.sock", "--ssd-dir", str(tmp_path / "kv"),
                   "--ssd-bytes", "1PB"), "--ssd-dir", "free", "less than --ssd-bytes")
    assert os.listdir(tmp_path / "kv") == []


@pytest.mark.parametrize("argv, flag", [
    (["--ssd-bytes", "1GB"], "--ssd-bytes: needs at least one --ssd-dir"),
    (["--ssd-dir", "{d}"], "--ssd-bytes: must be set with --ssd-dir"),
])
def test_ssd_bytes_and_ssd_dir_come_together(tmp_path, argv, flag):
    """Before: either one alone meant "SSD off", in silence."""
    argv = [a.format(d=tmp_path) for a in argv]
    one_line(serve("--listen", f"ipc://{tmp_path}/s.sock", *argv), flag)


def _fleet_key(tmp_path) -> str:
    """A fleet key file (mode 0600): a cluster tier refuses to start without one."""
    from saria.tiers.remote.fleetkey import generate

    path = tmp_path / "fleet.key"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(generate(1) + "\n")
    return str(path)


def test_an_unreachable_master_fails_at_start(tmp_path):
    """Before: the server started, and each engine's hello then timed out."""
    port = _closed_port()
    one_line(serve("--listen", f"ipc://{tmp_path}/s.sock", "--remote",
                   f"mooncake://127.0.0.1:{port}", "--remote-metadata", "P2PHANDSHAKE",
                   "--remote-fleet-key", _fleet_key(tmp_path)),
             "--remote:", f"127.0.0.1:{port}", "cannot reach the Mooncake master")


@pytest.mark.skipif(mooncake_available() is not None, reason=mooncake_available() or "")
def test_an_unreachable_metadata_server_fails_at_start(tmp_path):
    port = _closed_port()
    with MooncakeMaster() as master:
        one_line(serve("--listen", f"ipc://{tmp_path}/s.sock", "--remote", master.url,
                       "--remote-metadata", f"http://127.0.0.1:{port}/metadata",
                       "--remote-fleet-key", _fleet_key(tmp_path)),
                 "--remote-metadata:", "cannot reach the metadata server")


def test_a_taken_or_bad_listen_address_fails_at_start(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        one_line(serve("--listen", f"tcp://127.0.0.1:{port}", "--insecure-tcp"), "--listen", "cannot bind")
    one_line(serve("--listen", "tcp://no-such-host.invalid:1", "--insecure-tcp"), "--listen", "cannot bind")


def test_the_stop_log_says_what_the_next_start_keeps(tmp_path):
    """SSD blocks stay (journaled); DRAM does not. Before: "stopped, caches
    flushed", whatever was kept."""
    (tmp_path / "ssd").mkdir()
    conf = tmp_path / "serve.toml"  # the same server from a config file, flags over it
    conf.write_text(f'ssd-dir = ["{tmp_path / "ssd"}"]\nssd_bytes = {512 * SLOT}\n'
                    'admission = "write-back"\nlease = 30\n')
    srv = Server(tmp_path, "--config", str(conf), "--admission", "full-duplicate").start()
    c = RemoteCache(srv.address, LAYOUT, name="A")
    assert store(c, chain(7, 10)) == 10
    c.close()
    assert srv.stop() == 0
    srv.log.flush()
    log = (tmp_path / "serve.log").read_text()
    assert f"saria serve: SSD {tmp_path / 'ssd'}, {512 * SLOT} B, admission full-duplicate" in log
    assert "lease 1.0 s" in log  # Server's --lease 1 over the file's 30
    assert re.search(r"kept 10 SSD block\(s\) for the next start; dropped the DRAM tier "
                     r"\(\d+ slot\(s\) in use", log), log


def test_config_file_keys_and_flags_over_them(tmp_path):
    conf = tmp_path / "serve.toml"
    conf.write_text(f'ssd-dir = ["{tmp_path / "a"}"]\nssd-bytes = "1GB"\n')
    listen = f"ipc://{tmp_path}/s.sock"
    one_line(serve("--config", str(conf), "--listen", listen), str(tmp_path / "a"))
    one_line(serve("--config", str(conf), "--listen", listen, "--ssd-dir", str(tmp_path / "b")),
             str(tmp_path / "b"))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize("text, words", [
    ('ssd-dirs = ["/x"]\n', ["ssd-dirs: unknown key; did you mean 'ssd-dir'?"]),
    ('metrics_prot = 9400\n', ["metrics_prot: unknown key; did you mean 'metrics-port'?"]),
    ('dram = [1]\n', ["dram: expected one value"]),
    ('dram = \n', ["--config", "not valid TOML", "line 1"]),
])
def test_config_file_errors_are_one_line(tmp_path, text, words):
    conf = tmp_path / "serve.toml"
    conf.write_text(text)
    one_line(serve("--config", str(conf), "--listen", f"ipc://{tmp_path}/s.sock"), *words)
