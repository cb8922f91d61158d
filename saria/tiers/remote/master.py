"""A Mooncake master on this machine, for tests, benches and single-host runs.

``MooncakeMaster`` starts ``mooncake_master`` with its own HTTP metadata
server (no etcd), both on ``127.0.0.1`` by default, on free ports, and waits
until both listen. ``kill()`` SIGKILLs it (every key is lost: no HA),
``restart()`` starts it again on the same ports. ``settings(...)`` gives the
``RemoteSettings`` a client of it uses, signed with a fleet key made for
this master (``fleet_key_line``; ``key_env()`` hands it to a child process
as ``SARIA_FLEET_KEY``). Transfer engines bind where
``MC_TCP_BIND_ADDRESS`` says (``client_env()``: loopback), so nothing of a
test leaves the machine::

    with MooncakeMaster() as master:
        tier = RemoteTier(master.settings(segment_bytes=256 << 20), "ns", block_bytes)
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from saria.errors import ConfigError, SariaError
from saria.tiers.remote.fleetkey import FleetKeys, generate
from saria.tiers.remote.settings import RemoteSettings

__all__ = ["MooncakeMaster", "master_binary", "client_env", "mooncake_available"]


def mooncake_available() -> str | None:
    """None when ``mooncake.store`` imports here, else why not (one line)."""
    try:
        import mooncake.store  # noqa: F401
    except ImportError as e:
        return f"mooncake.store does not import: {e} (pip install 'saria[mooncake]'; it needs libibverbs1)"
    if master_binary() is None:
        return "mooncake_master not found (pip install 'saria[mooncake]')"
    return None


def master_binary() -> str | None:
    """The ``mooncake_master`` executable of the installed package, else on PATH."""
    spec = importlib.util.find_spec("mooncake")
    if spec is not None and spec.submodule_search_locations:
        for base in spec.submodule_search_locations:
            exe = Path(base) / "mooncake_master"
            if exe.is_file() and os.access(exe, os.X_OK):
                return str(exe)
    return shutil.which("mooncake_master")


def client_env(bind: str = "127.0.0.1") -> None:
    """Makes this process's Mooncake transfer engine bind to ``bind`` (before setup)."""
    os.environ["MC_TCP_BIND_ADDRESS"] = bind


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _listening(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


class MooncakeMaster:
    """One ``mooncake_master`` process (see the module docstring)."""

    def __init__(self, host: str = "127.0.0.1", *, rpc_port: int | None = None,
                 metadata_port: int | None = None, extra_args: tuple[str, ...] = (),
                 log_path: str | None = None, start_timeout_s: float = 20.0) -> None:
        exe = master_binary()
        if exe is None:
            raise ConfigError("mooncake_master", "not installed (pip install 'saria[mooncake]')")
        self.exe = exe
        self.host = host
        self.rpc_port = rpc_port or _free_port(host)
        self.metadata_port = metadata_port or _free_port(host)
        self.metrics_port = _free_port(host)  # its admin/metrics server (default 9003: shared)
        self.extra_args = tuple(extra_args)
        self.start_timeout_s = start_timeout_s
        # a log of our own goes with ``stop`` unless a failed start named it
        self._own_log = log_path is None
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="saria-mooncake-master-", suffix=".log")
            os.close(fd)
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.fleet_key_line = generate(1)
        self.fleet_keys = FleetKeys.parse(self.fleet_key_line, source="test key")

    @property
    def url(self) -> str:
        return f"mooncake://{self.host}:{self.rpc_port}"

    @property
    def metadata_server(self) -> str:
        return f"http://{self.host}:{self.metadata_port}/metadata"

    def settings(self, **changes) -> RemoteSettings:
        """Settings of a client of this master (loopback TCP)."""
        base = dict(master=self.url, metadata_server=self.metadata_server, protocol="tcp",
                    local_hostname=self.host, fleet_keys=self.fleet_keys)
        base.update(changes)
        return RemoteSettings(**base)

    def key_file(self) -> str:
        """A file (mode 0600, removed with the master's log folder) holding the fleet key."""
        if getattr(self, "_key_file", None) is None:
            fd, path = tempfile.mkstemp(prefix="saria-fleet-key-")  # mode 0600
            with os.fdopen(fd, "w") as f:
                f.write(self.fleet_key_line + "\n")
            self._key_file = path
        return self._key_file

    def key_env(self, name: str = "SARIA_FLEET_KEY") -> dict[str, str]:
        """This process's environment plus the fleet key, for a child node."""
        return dict(os.environ, **{name: self.fleet_key_line})

    def start(self) -> "MooncakeMaster":
        if self.running:
            return self
        args = [self.exe, f"--rpc_address={self.host}", f"--rpc_port={self.rpc_port}",
                "--enable_http_metadata_server=true", f"--http_metadata_server_host={self.host}",
                f"--http_metadata_server_port={self.metadata_port}",
                f"--metrics_host={self.host}", f"--metrics_port={self.metrics_port}",
                "--enable_metric_reporting=false", *self.extra_args]
        env = dict(os.environ, MC_TCP_BIND_ADDRESS=self.host)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        self.starts += 1
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._own_log = False
                raise SariaError(f"mooncake_master exited with {self.proc.returncode} at start; "
                                 f"see {self.log_path}")
            if _listening(self.host, self.rpc_port) and _listening(self.host, self.metadata_port):
                return self
            time.sleep(0.05)
        self._own_log = False
        self.stop()
        raise SariaError(f"mooncake_master did not listen within {self.start_timeout_s:g} s; "
                         f"see {self.log_path}")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: the master dies with every key it knew."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if getattr(self, "_key_file", None):
            try:
                os.unlink(self._key_file)
            except OSError:
                pass
            self._key_file = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()
        if self._own_log:
            try:
                os.unlink(self.log_path)
            except OSError:
                pass

    def restart(self) -> "MooncakeMaster":
        """A fresh master on the same ports (without HA it knows no key)."""
        self.kill()
        return self.start()

    def __enter__(self) -> "MooncakeMaster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
