"""Settings of the vLLM connector, read from ``kv_connector_extra_config``.

Every key is checked at engine start-up; a bad value stops the engine with a
``ConfigError`` whose message starts with the key (``ssd_bytes: ...``).
Sizes accept bytes (an int) or text with a unit (``"64GB"``, ``"8GiB"``).

=================  ==========================================================
key                meaning (default)
=================  ==========================================================
dram_bytes         size of the shared DRAM pool (required)
ssd_dirs           list of directories, one per drive ([]: no SSD tier)
ssd_bytes          SSD capacity per drive (0: no SSD tier)
hash_seed          seed of the block-key chain ("vllm-none-hash", vLLM's)
hash_algo          "sha256_cbor" (default) or "xxhash_cbor"
admission          a ``saria replay`` policy name: saria, full-duplicate, ...,
                   budget or budget:<fraction> (spends the drives' rating)
promotion          none, full or lazy (lazy)
promotion_r        lazy promotion's DRAM share (0.8)
promotion_min_age_s  lazy promotion takes only DRAM slots idle this long: seconds,
                   or "auto" (longer than 99% of the return gaps seen; default)
write_queue        pending SSD write batches before writes are dropped (256)
op_timeout_s       seconds before a copy no worker acked counts as failed (300)
coordinator        how a worker runs a load's DRAM copies and SSD reads: serial,
                   overlap or paced (paced)
ingress_bytes_per_s  the GPU's ingress link for pacing (default: the DRAM copy
                   rate the worker measures, i.e. copies alone fill the link)
events             keep KV events for ``take_events`` (true)
log_interval_s     seconds between the one-line summaries in vLLM's log (hits by
                   tier, stores, SSD writes, failures; 60; 0: none)
hook_timing        time every connector hook, by kind of step (false;
                   ``hooktime.py``, ``saria bench steps``)
metrics_port       serve Prometheus metrics on this port (none; 0: a port the OS
                   picks, logged and kept as the scheduler's ``metrics_server.server_port``)
metrics_host       the address the metrics port listens on (127.0.0.1: this host
                   only, as ``saria serve``'s; 0.0.0.0 to let others scrape it)
dwpd               the drives' rated drive writes per day, for the budget (1)
config_file        a JSON file holding any of these keys (inline keys win)
server             the address of a ``saria serve`` (``ipc://...``, ``tcp://...``):
                   the node's shared cache; DRAM, SSD and policies are then the
                   server's, and dram_bytes / ssd_* / admission / promotion /
                   dwpd must not be set here (none: an in-process cache)
server_timeout_s   deadline of each call to the server; a miss past it (1.0)
server_start_s     how long an engine's start waits for its server's hello
                   reply, retrying (a server still starting, or busy) (10)
engine_name        this engine's name in the server's figures ("vllm")
server_curve_secret  this engine's CurveZMQ NAME.key_secret (``saria serve
                   keygen``), for a ``tcp://`` server (none)
server_curve_key   the server's public NAME.key, with server_curve_secret (none)
server_uid         the uid the server runs as: its ipc folder and the pool
                   it names must be that uid's (default: this process's)
server_ssd_roots   the SSD roots the server may name (its --ssd-dir list);
                   none: folders of server_uid without group/other write bits
remote             the cluster tier of an in-process cache: a mapping of
                   ``RemoteSettings.from_mapping`` keys ({"master":
                   "mooncake://HOST:PORT", "fleet_key_file": PATH (required,
                   or "fleet_key_env": VAR), "segment_bytes": "4GB", ...});
                   with ``server``, ``saria serve --remote`` owns it (none)
=================  ==========================================================

Keys for the same engine's SSD files: the store's files live under
``<ssd_dir>/saria-<namespace>``, where the namespace digests everything that
makes a stored page meaningful (model, dtype, block size, page layout,
layer count, tensor-parallel size, hash algorithm and seed), so a second
model on the same drives never reads the first one's pages.
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass, field
from typing import Any

import psutil

from saria.errors import ConfigError
from saria.keys.hashing import DEFAULT_SEED, resolve_algo
from saria.policy import make_admission, make_promotion
from saria.transfer import COORDINATOR_MODES
from saria.units import parse_size

KEYS = ("dram_bytes", "ssd_dirs", "ssd_bytes", "hash_seed", "hash_algo", "admission",
        "promotion", "promotion_r", "promotion_min_age_s", "write_queue", "op_timeout_s", "coordinator",
        "ingress_bytes_per_s", "events", "log_interval_s", "hook_timing", "metrics_port", "metrics_host", "dwpd", "config_file", "server",
        "server_timeout_s", "server_start_s", "engine_name", "remote", "server_curve_secret", "server_curve_key",
        "server_uid", "server_ssd_roots")


def key_docs() -> dict[str, str]:
    """Each key's meaning, from the table in this module's docstring (the one
    place it is written; the docs site's key table is generated from it)."""
    doc = __doc__.splitlines()
    rules = [i for i, line in enumerate(doc) if line.startswith("=" * 17)]
    lines = doc[rules[1] + 1:rules[2]]
    docs: dict[str, str] = {}
    key = None
    for line in lines:
        if line[:1].strip():  # a key starts its row (a long one runs into the text column)
            key, _, text = line.partition(" ")
            docs[key] = text.strip()
        elif key is not None:
            docs[key] += " " + line.strip()
    return docs


# the server's settings: an engine that uses a server cannot also set them
SERVER_OWNED = ("dram_bytes", "ssd_dirs", "ssd_bytes", "admission", "promotion", "promotion_r",
                "promotion_min_age_s", "write_queue", "dwpd", "remote")


@dataclass(frozen=True)
class ConnectorConfig:
    dram_bytes: int
    ssd_dirs: tuple[str, ...] = ()
    ssd_bytes: int = 0
    hash_seed: str = DEFAULT_SEED
    hash_algo: str = "sha256_cbor"
    admission: str = "saria"
    promotion: str = "lazy"
    promotion_r: float = 0.8
    promotion_min_age_s: float | str = "auto"
    write_queue: int = 256
    op_timeout_s: float = 300.0
    coordinator: str = "paced"
    ingress_bytes_per_s: float | None = None
    events: bool = True
    hook_timing: bool = False
    log_interval_s: float = 60.0
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    dwpd: float = 1.0
    server: str | None = None
    server_timeout_s: float = 1.0
    server_start_s: float = 10.0
    engine_name: str = "vllm"
    remote: dict | None = None  # RemoteSettings.from_mapping's keys (checked at parse)
    # what the engine checks of its server (saria.serve.auth.ClientSecurity)
    server_curve_secret: str | None = None
    server_curve_key: str | None = None
    server_uid: int | None = None
    server_ssd_roots: tuple[str, ...] = ()
    extra: dict = field(default_factory=dict, compare=False)

    def client_security(self):
        """The server checks of this engine (``saria.serve.auth.ClientSecurity``)."""
        from saria.serve.auth import ClientSecurity

        return ClientSecurity(self.server_curve_secret, self.server_curve_key, self.server_uid,
                              self.server_ssd_roots)

    @property
    def has_ssd(self) -> bool:
        return bool(self.ssd_dirs) and self.ssd_bytes > 0

    def store_dirs(self, geo) -> tuple[str, ...]:
        """The SSD store's drive directories for this engine's layout:
        ``<ssd_dir>/saria-<namespace>`` (empty without an SSD tier)."""
        if not self.has_ssd:
            return ()
        ns = geo.namespace(self.hash_algo, self.hash_seed)
        return tuple(os.path.join(d, f"saria-{ns}") for d in self.ssd_dirs)


def parse_config(extra: dict[str, Any] | None) -> ConnectorConfig:
    """Validates ``kv_connector_extra_config``; raises ``ConfigError`` naming the key."""
    raw = dict(extra or {})
    path = raw.pop("config_file", None)
    if path is not None:
        raw = {**_read_file(path), **raw}
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        close = difflib.get_close_matches(unknown[0], KEYS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(unknown[0], f"unknown key in kv_connector_extra_config; {hint}"
                          f"(known: {', '.join(KEYS)})")
    server = raw.get("server")
    if server is not None:
        if not isinstance(server, str) or "://" not in server:
            raise ConfigError("server", f"must be a ZMQ address such as 'ipc:///run/saria.sock', "
                              f"got {server!r}")
        owned = [k for k in SERVER_OWNED if k in raw]
        if owned:
            raise ConfigError(owned[0], "is the server's setting (saria serve --...); do not set "
                              "it beside 'server'")
        raw["dram_bytes"] = 1  # the server's pool; checked by nothing here
    stimeout, sstart = (_seconds(raw, k, d) for k, d in (("server_timeout_s", 1.0),
                                                           ("server_start_s", 10.0)))
    name = raw.get("engine_name", "vllm")
    if not isinstance(name, str) or not name:
        raise ConfigError("engine_name", f"must be a non-empty string, got {name!r}")
    if "dram_bytes" not in raw:
        raise ConfigError("dram_bytes", "is required (size of saria's DRAM pool, e.g. '8GB')")
    dram = _size(raw, "dram_bytes")
    if dram <= 0:
        raise ConfigError("dram_bytes", "must be positive")
    avail = psutil.virtual_memory().total
    if dram > avail:
        raise ConfigError("dram_bytes", f"{dram:,} B is more than this machine's "
                          f"{avail:,} B of memory")
    dirs = raw.get("ssd_dirs", [])
    if isinstance(dirs, str) or not isinstance(dirs, (list, tuple)) or \
            not all(isinstance(d, str) and d for d in dirs):
        raise ConfigError("ssd_dirs", f"must be a list of directory paths, got {dirs!r}")
    if len(set(dirs)) != len(dirs):
        raise ConfigError("ssd_dirs", "lists a directory twice")
    ssd = _size(raw, "ssd_bytes") if "ssd_bytes" in raw else 0
    if ssd < 0:
        raise ConfigError("ssd_bytes", "must not be negative")
    if dirs and ssd > 0:
        for d in dirs:
            _check_dir(d, ssd)
    seed = raw.get("hash_seed", DEFAULT_SEED)
    if isinstance(seed, bool) or not isinstance(seed, (str, int)):
        raise ConfigError("hash_seed", f"must be a string or an integer, got {seed!r}")
    try:
        algo = resolve_algo(str(raw.get("hash_algo", "sha256_cbor")))
    except ValueError as e:
        raise ConfigError("hash_algo", str(e)) from None
    admission = str(raw.get("admission", "saria"))
    promotion = str(raw.get("promotion", "lazy"))
    r = raw.get("promotion_r", 0.8)
    if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r <= 1:
        raise ConfigError("promotion_r", f"must be a number in [0, 1], got {r!r}")
    for key, make in (("admission", lambda: make_admission(admission)),
                      ("promotion", lambda: make_promotion(promotion, r=float(r)))):
        try:
            make()
        except ConfigError as e:
            raise ConfigError(key, str(e).split(": ", 1)[-1]) from None
        except (ValueError, KeyError) as e:
            raise ConfigError(key, str(e).strip("'\"")) from None
    age = raw.get("promotion_min_age_s", "auto")
    if age != "auto" and (isinstance(age, bool) or not isinstance(age, (int, float))
                          or not age >= 0):
        raise ConfigError("promotion_min_age_s",
                          f"must be 'auto' or a number of seconds >= 0, got {age!r}")
    wq = raw.get("write_queue", 256)
    if isinstance(wq, bool) or not isinstance(wq, int) or wq < 1:
        raise ConfigError("write_queue", f"must be an integer >= 1, got {wq!r}")
    timeout = raw.get("op_timeout_s", 300.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ConfigError("op_timeout_s", f"must be a positive number of seconds, got {timeout!r}")
    coordinator = raw.get("coordinator", "paced")
    if coordinator not in COORDINATOR_MODES:
        raise ConfigError("coordinator", f"must be one of {', '.join(COORDINATOR_MODES)}, "
                          f"got {coordinator!r}")
    ingress = raw.get("ingress_bytes_per_s")
    if ingress is not None:
        ingress = _size(raw, "ingress_bytes_per_s")
        if ingress <= 0:
            raise ConfigError("ingress_bytes_per_s", "must be positive")
    events = raw.get("events", True)
    if not isinstance(events, bool):
        raise ConfigError("events", f"must be true or false, got {events!r}")
    every = raw.get("log_interval_s", 60.0)
    if isinstance(every, bool) or not isinstance(every, (int, float)) or every < 0:
        raise ConfigError("log_interval_s", f"must be seconds (0: no summary), got {every!r}")
    timing = raw.get("hook_timing", False)
    if not isinstance(timing, bool):
        raise ConfigError("hook_timing", f"must be true or false, got {timing!r}")
    port = raw.get("metrics_port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int)
                             or not 0 <= port < 65536):
        raise ConfigError("metrics_port", f"must be a TCP port number, got {port!r}")
    mhost = raw.get("metrics_host", "127.0.0.1")
    if not isinstance(mhost, str) or not mhost:
        raise ConfigError("metrics_host", f"must be an address to listen on, got {mhost!r}")
    remote = raw.get("remote")
    if remote is not None:
        from saria.tiers.remote import RemoteSettings

        RemoteSettings.from_mapping(remote)  # every bad setting names its key (remote.lane: ...)
        remote = dict(remote)
    security = _server_security(raw)
    dwpd = raw.get("dwpd", 1.0)
    if isinstance(dwpd, bool) or not isinstance(dwpd, (int, float)) or not dwpd > 0:
        raise ConfigError("dwpd", f"must be a positive number, got {dwpd!r}")
    return ConnectorConfig(
        dram_bytes=dram, ssd_dirs=tuple(os.path.abspath(d) for d in dirs), ssd_bytes=ssd,
        hash_seed=str(seed), hash_algo=algo, admission=admission, promotion=promotion,
        promotion_r=float(r), promotion_min_age_s=age if age == "auto" else float(age), write_queue=wq,
        op_timeout_s=float(timeout), coordinator=coordinator,
        ingress_bytes_per_s=None if ingress is None else float(ingress), events=events,
        hook_timing=timing, log_interval_s=float(every),
        metrics_port=port, metrics_host=mhost, dwpd=float(dwpd), server=server, server_timeout_s=stimeout, server_start_s=sstart,
        engine_name=name, remote=remote, extra=dict(extra or {}), **security)


def _seconds(raw: dict, key: str, default: float) -> float:
    v = raw.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ConfigError(key, f"must be a positive number of seconds, got {v!r}")
    return float(v)


def _server_security(raw: dict) -> dict:
    """The ``server_curve_*`` / ``server_uid`` / ``server_ssd_roots`` keys, checked."""
    out: dict = {}
    curve = [k for k in ("server_curve_secret", "server_curve_key") if k in raw]
    if len(curve) == 1:
        raise ConfigError(curve[0], "needs its pair: server_curve_secret (this engine's "
                          "NAME.key_secret) and server_curve_key (the server's NAME.key)")
    for k in curve:
        if not isinstance(raw[k], str) or not os.path.isfile(raw[k]):
            raise ConfigError(k, f"must name a key file, got {raw[k]!r}")
        out[k] = raw[k]
    if "server_uid" in raw:
        uid = raw["server_uid"]
        if isinstance(uid, bool) or not isinstance(uid, int) or uid < 0:
            raise ConfigError("server_uid", f"must be a uid (an integer >= 0), got {uid!r}")
        out["server_uid"] = uid
    roots = raw.get("server_ssd_roots", [])
    if not isinstance(roots, list) or not all(isinstance(r, str) and r for r in roots):
        raise ConfigError("server_ssd_roots", f"must be a list of folders, got {roots!r}")
    out["server_ssd_roots"] = tuple(os.path.abspath(r) for r in roots)
    return out


def _size(raw: dict, key: str) -> int:
    v = raw[key]
    try:
        return int(parse_size(v, name=key))
    except (ValueError, TypeError) as e:
        msg = str(e)
        raise ConfigError(key, msg.split(": ", 1)[-1] if msg.startswith(key) else msg) from None


def _read_file(path: Any) -> dict:
    if not isinstance(path, str):
        raise ConfigError("config_file", f"must be a path, got {path!r}")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise ConfigError("config_file", f"cannot read {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ConfigError("config_file", f"{path}:{e.lineno}: not valid JSON: {e.msg}") from None
    if not isinstance(data, dict):
        raise ConfigError("config_file", f"{path}: must hold a JSON object")
    if "config_file" in data:
        raise ConfigError("config_file", f"{path}: a config file cannot name another")
    return data


def _check_dir(d: str, ssd_bytes: int) -> None:
    try:
        os.makedirs(d, exist_ok=True)
    except OSError as e:
        raise ConfigError("ssd_dirs", f"cannot create {d}: {e.strerror}") from None
    if not os.access(d, os.W_OK | os.X_OK):
        raise ConfigError("ssd_dirs", f"{d} is not writable")
    st = os.statvfs(d)
    free = st.f_bavail * st.f_frsize
    if ssd_bytes > free:
        # Existing store files are reused, so count what they already hold.
        held = sum(f.stat().st_size for sub in os.scandir(d)
                   if sub.is_dir() and sub.name.startswith("saria-")
                   for f in os.scandir(sub.path) if f.is_file())
        if ssd_bytes > free + held:
            raise ConfigError("ssd_bytes", f"{ssd_bytes:,} B per drive does not fit in {d} "
                              f"({free:,} B free)")


def check_fits(cfg: ConnectorConfig, slot_bytes: int, block_size: int) -> None:
    """Sizes against the model's block: a tier must hold at least one block."""
    what = f"one {block_size}-token block of this model ({slot_bytes:,} B, all layers)"
    if cfg.server is not None:
        return  # the server's tiers: it checks them at hello
    if cfg.dram_bytes < slot_bytes:
        raise ConfigError("dram_bytes", f"{cfg.dram_bytes:,} B cannot hold {what}")
    if cfg.ssd_dirs and 0 < cfg.ssd_bytes < slot_bytes + 4096:
        raise ConfigError("ssd_bytes", f"{cfg.ssd_bytes:,} B per drive cannot hold {what}")
