"""How a node reaches the cluster tier: one validated settings object.

``RemoteSettings`` names the Mooncake master (``mooncake://HOST:PORT``), the
metadata server the transfer engines meet at, the protocol, this client's
contribution to the cluster's memory (``segment_bytes``) and its local
transfer buffer, and saria's own limits on every remote call: the deadline
the engine waits at most, the lane (how many calls may be in flight at once)
and the breaker (how many failures in a row mark the tier down, how long it
stays down before one probe).

Every value is checked here, once; a bad one raises ``ConfigError`` naming
the key (``remote.deadline: must be > 0 s, got 0``). ``from_mapping`` takes
the keys a connector's or server's configuration carries, with sizes and
durations as people write them (``"256MB"``, ``"50ms"``) and unknown keys
refused by name.

Every configured cluster tier needs the fleet's key (``fleetkey.py``):
``fleet_key_file`` (a file of this user, mode 0600) or ``fleet_key_env``
(an environment variable), optionally ``fleet_key_id`` (the key it writes
with); without one ``from_mapping`` refuses, naming ``remote.fleet_key_file``.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from saria.errors import ConfigError
from saria.tiers.remote.fleetkey import FleetKeys
from saria.units import parse_duration, parse_size

__all__ = ["RemoteSettings", "parse_master_url", "PROTOCOLS"]

PROTOCOLS = ("tcp", "rdma")
MIN_SEGMENT_BYTES = 16 << 20  # Mooncake refuses a smaller segment
_SCHEME = "mooncake://"


def parse_master_url(url: str, *, key: str = "remote") -> tuple[str, int]:
    """``mooncake://HOST:PORT`` (or ``HOST:PORT``) -> (host, port)."""
    text = str(url).strip()
    if text.startswith(_SCHEME):
        text = text[len(_SCHEME):]
    elif "://" in text:
        raise ConfigError(key, f"{url!r}: the scheme must be mooncake://")
    host, sep, port = text.rstrip("/").rpartition(":")
    if not sep or not host:
        raise ConfigError(key, f"{url!r}: expected mooncake://HOST:PORT")
    try:
        p = int(port)
    except ValueError:
        raise ConfigError(key, f"{url!r}: port {port!r} is not a number") from None
    if not 0 < p < 65536:
        raise ConfigError(key, f"{url!r}: port {p} outside 1..65535")
    return host.strip("[]"), p


@dataclass(frozen=True, slots=True)
class RemoteSettings:
    """One node's client of the cluster tier (see the module docstring).

    ``metadata_server``: ``http://HOST:PORT/metadata`` (the master's own
    HTTP metadata server), ``P2PHANDSHAKE``, or an etcd address.
    ``local_hostname``: the address other nodes reach this client's segment
    at (``None``: this host's name; loopback in tests).
    """

    master: str
    metadata_server: str
    protocol: str = "tcp"
    rdma_devices: str = ""
    local_hostname: str | None = None
    segment_bytes: int = 1 << 30        # this node's share of the cluster's memory (0: none)
    local_buffer_bytes: int = 64 << 20  # Mooncake's own transfer buffer (non-zero-copy calls)
    staging_rows: int = 64              # registered rows saria encodes into and reads into
    deadline_s: float = 0.05            # the longest the engine waits for one remote call
    lane: int = 2                       # remote calls in flight at once (late ones included)
    breaker_failures: int = 3           # failures in a row that mark the tier down
    breaker_cooldown_s: float = 2.0     # down this long before one probe call
    exist_cache_s: float = 0.5          # how long a lookup's answer is reused
    max_lookup_keys: int = 64           # the most keys one lookup asks the cluster about
    fleet_keys: FleetKeys | None = None # signs and names rows (required by from_mapping)

    def __post_init__(self) -> None:
        parse_master_url(self.master, key="remote.master")
        if not self.metadata_server:
            raise ConfigError("remote.metadata_server", "must be set (http://HOST:PORT/metadata, "
                              "P2PHANDSHAKE or an etcd address)")
        if self.protocol not in PROTOCOLS:
            raise ConfigError("remote.protocol", f"must be one of {', '.join(PROTOCOLS)}, "
                              f"got {self.protocol!r}")
        if self.protocol == "rdma" and not self.rdma_devices:
            raise ConfigError("remote.rdma_devices", "protocol rdma needs the devices (e.g. mlx5_0)")
        seg = self.segment_bytes
        if isinstance(seg, bool) or not isinstance(seg, int) or seg < 0 or 0 < seg < MIN_SEGMENT_BYTES:
            raise ConfigError("remote.segment_bytes", f"must be 0 (this node holds none of the "
                              f"cluster's objects) or at least 16 MiB (Mooncake's least), got {seg!r}")
        for name in ("local_buffer_bytes", "staging_rows", "lane",
                     "breaker_failures", "max_lookup_keys"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"remote.{name}", f"must be a positive integer, got {v!r}")
        for name in ("deadline_s", "breaker_cooldown_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not v > 0:
                raise ConfigError(f"remote.{name}", f"must be > 0 s, got {v!r}")
        if not isinstance(self.exist_cache_s, (int, float)) or self.exist_cache_s < 0:
            raise ConfigError("remote.exist_cache_s", f"must be >= 0 s, got {self.exist_cache_s!r}")
        if self.fleet_keys is not None and not isinstance(self.fleet_keys, FleetKeys):
            raise ConfigError("remote.fleet_keys", f"must be FleetKeys, got {type(self.fleet_keys).__name__}")

    # ------------------------------------------------------------ derived

    @property
    def master_address(self) -> str:
        """``HOST:PORT`` as Mooncake's ``setup`` takes it."""
        host, port = parse_master_url(self.master)
        return f"{host}:{port}"

    @property
    def hostname(self) -> str:
        return self.local_hostname or socket.gethostname()

    def with_(self, **changes: Any) -> "RemoteSettings":
        return replace(self, **changes)

    # ------------------------------------------------------------ parsing

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any], *, prefix: str = "remote") -> "RemoteSettings":
        """Settings from configuration keys: ``master`` (``mooncake://HOST:PORT``),
        ``metadata_server`` (default: the master host's HTTP metadata server
        on ``metadata_port``, 8080), sizes as strings or bytes, durations as
        strings or seconds (``deadline``, ``breaker_cooldown``,
        ``exist_cache``: no ``_s`` needed). Unknown keys are refused."""
        if not isinstance(d, Mapping):
            raise ConfigError(prefix, f"must be a mapping of settings, not {type(d).__name__}")
        names = {f.name for f in fields(cls)} - {"fleet_keys"}
        aliases = {n[:-2]: n for n in names if n.endswith("_s")}
        kw: dict[str, Any] = {}
        metadata_port = None
        key_args: dict[str, Any] = {}
        for key, value in d.items():
            name = aliases.get(key, key)
            where = f"{prefix}.{key}"
            if key == "metadata_port":
                metadata_port = _int(value, where)
                continue
            if key in _KEY_ARGS:
                key_args[key] = _int(value, where) if key == "fleet_key_id" else value
                continue
            if name not in names:
                valid = sorted((names - set(aliases.values())) | set(aliases) | {"metadata_port"}
                               | set(_KEY_ARGS))
                raise ConfigError(where, f"unknown key; valid: {', '.join(valid)}")
            if name in ("segment_bytes", "local_buffer_bytes"):
                value = int(parse_size(value, name=where))
            elif name.endswith("_s"):
                value = float(parse_duration(value, name=where))
            elif name in ("staging_rows", "lane", "breaker_failures", "max_lookup_keys"):
                value = _int(value, where)
            elif not isinstance(value, str):
                raise ConfigError(where, f"must be a string, got {value!r}")
            kw[name] = value
        if "master" not in kw:
            raise ConfigError(f"{prefix}.master", "is required (mooncake://HOST:PORT)")
        if "metadata_server" not in kw:
            host, _ = parse_master_url(kw["master"], key=f"{prefix}.master")
            kw["metadata_server"] = f"http://{host}:{metadata_port or 8080}/metadata"
        try:
            return replace(cls(**kw), fleet_keys=_fleet_keys(key_args))  # other keys' errors first
        except ConfigError as e:  # re-key under the caller's prefix
            raise ConfigError(e.key.replace("remote", prefix, 1), str(e).partition(": ")[2]) from None


_KEY_ARGS = ("fleet_key_file", "fleet_key_env", "fleet_key_id")


def _fleet_keys(a: dict[str, Any]) -> FleetKeys:
    """The ring the configuration names: exactly one of a file or a variable."""
    path, env, kid = a.get("fleet_key_file"), a.get("fleet_key_env"), a.get("fleet_key_id")
    if path and env:
        raise ConfigError("remote.fleet_key_file", "give fleet_key_file or fleet_key_env, not both")
    if path:
        return FleetKeys.from_file(str(path), write_id=kid)
    if env:
        return FleetKeys.from_env(str(env), write_id=kid)
    raise ConfigError("remote.fleet_key_file", "a cluster tier needs the fleet's key (a file of "
                      "this user, mode 0600: saria fleet-key --out FILE) or fleet_key_env naming a "
                      "variable; rows are signed with it")


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(where, f"must be an integer, got {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(where, f"must be an integer, got {value!r}") from None
