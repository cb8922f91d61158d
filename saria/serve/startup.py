"""What ``saria serve`` checks before it serves, and what it says when it stops.

A node server that starts on a bad setting fails later, at an engine's first
hello, where the engine gets an opaque error and the operator a traceback:
an unmounted ``/mnt/nvme0`` would have been created on the root disk and a
1 GB file preallocated there. So every setting that can be checked without an
engine is checked at start, and the first bad one is one line naming its
flag (``check``):

* each ``--ssd-dir`` exists (it is never created: a missing directory is most
  often a drive that is not mounted), is a directory, the process can create
  files in it, and its file system has room for ``--ssd-bytes`` beyond what
  saria's own store files there already hold (a restart reuses them);
* ``--ssd-bytes`` and ``--ssd-dir`` come together (one without the other
  used to mean "SSD off" in silence);
* ``--remote``: the master and the metadata server accept a TCP connection;
* ``--listen``: the address can be bound (tried, then released).
"""

from __future__ import annotations

import os
import socket
import tempfile
from urllib.parse import urlsplit

from saria.errors import ConfigError

CONNECT_TIMEOUT_S = 2.0


def check(cfg) -> None:
    """Every check of the module docstring, in flag order; raises ConfigError."""
    check_ssd(cfg.ssd_dirs, cfg.ssd_bytes)
    if cfg.remote is not None:
        check_remote(cfg.remote)
    check_listen(cfg.listen)


def check_ssd(dirs, ssd_bytes: int) -> None:
    if ssd_bytes and not dirs:
        raise ConfigError("--ssd-bytes", "needs at least one --ssd-dir (where the SSD tier lives)")
    if dirs and not ssd_bytes:
        raise ConfigError("--ssd-bytes", "must be set with --ssd-dir (bytes per directory, "
                          "e.g. 2TB); without it the SSD tier would be off")
    if len(set(map(os.path.realpath, dirs))) != len(dirs):
        raise ConfigError("--ssd-dir", "a directory is given twice")
    for d in dirs:
        check_ssd_dir(d, ssd_bytes)


def check_ssd_dir(d: str, ssd_bytes: int) -> None:
    """One SSD directory: exists, a directory, writable, room for `ssd_bytes`."""
    flag = "--ssd-dir"
    if not os.path.exists(d):
        raise ConfigError(flag, f"{d}: does not exist (saria never creates it: mount the drive, "
                          "or create the directory)")
    if not os.path.isdir(d):
        raise ConfigError(flag, f"{d}: is not a directory")
    try:  # access() says yes to root on a read-only mount's mode bits: try a real file
        fd, probe = tempfile.mkstemp(prefix=".saria-probe-", dir=d)
    except OSError as e:
        raise ConfigError(flag, f"{d}: cannot create files there ({e.strerror})") from None
    os.close(fd)
    os.unlink(probe)
    st = os.statvfs(d)
    free = st.f_bavail * st.f_frsize
    held = store_bytes(d)
    if free + held < ssd_bytes:
        raise ConfigError(flag, f"{d}: {_gb(free)} free (+ {_gb(held)} of saria's own files) "
                          f"is less than --ssd-bytes {_gb(ssd_bytes)}")


def store_bytes(d: str) -> int:
    """Bytes saria's store files under `d` already occupy (``saria-*`` subdirectories)."""
    total = 0
    for name in os.listdir(d):
        if not name.startswith("saria-"):
            continue
        for root, _, files in os.walk(os.path.join(d, name)):
            for f in files:
                try:
                    total += os.stat(os.path.join(root, f)).st_blocks * 512
                except FileNotFoundError:
                    pass
    return total


def check_remote(mapping: dict) -> None:
    """The cluster tier's master and metadata server accept a connection."""
    from saria.tiers.remote import RemoteSettings, parse_master_url

    settings = RemoteSettings.from_mapping(mapping)
    host, port = parse_master_url(settings.master, key="--remote")
    _connect(host, port, "--remote", f"the Mooncake master {settings.master}")
    meta = metadata_address(settings.metadata_server)
    if meta is not None:
        _connect(*meta, "--remote-metadata", f"the metadata server {settings.metadata_server}")


def metadata_address(server: str) -> tuple[str, int] | None:
    """(host, port) of a metadata server to try (None: P2PHANDSHAKE, nothing to reach)."""
    if server.upper() == "P2PHANDSHAKE":
        return None
    parts = urlsplit(server if "://" in server else f"etcd://{server}")
    if parts.hostname is None:
        raise ConfigError("--remote-metadata", f"{server!r}: no host to reach")
    default = 80 if parts.scheme == "http" else 2379
    return parts.hostname, parts.port or default


def _connect(host: str, port: int, flag: str, what: str) -> None:
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as e:
        why = "timed out" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise ConfigError(flag, f"cannot reach {what} at {host}:{port} ({why})") from None


def check_listen(address: str) -> None:
    """Binds `address` once and releases it: a bad or taken address fails here."""
    import zmq

    if address.startswith("ipc://"):  # the server makes its runtime directory (not an SSD dir)
        os.makedirs(os.path.dirname(address[len("ipc://"):]) or ".", mode=0o700, exist_ok=True)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.bind(address)
    except zmq.ZMQError as e:
        raise ConfigError("--listen", f"{address}: cannot bind ({e.strerror})") from None
    finally:
        sock.close(0)
        ctx.term()


def stop_summary(caches: dict) -> list[str]:
    """What a stop keeps for the next start (each namespace's SSD blocks,
    journaled) and what it does not (DRAM), one line per namespace."""
    lines = []
    for ns, cache in caches.items():
        g = cache.gauges()
        dram = int(g.get("dram_used_slots", 0))
        if "ssd_slots" in g:
            ssd = int(g["ssd_slots"] - g["ssd_free_slots"])
            kept = f"kept {ssd:,} SSD block(s) for the next start"
        else:
            kept = "kept nothing (no SSD tier)"
        lines.append(f"saria serve: namespace {ns}: {kept}; dropped the DRAM tier ({dram:,} "
                     "slot(s) in use; DRAM is not kept across restarts)")
    return lines


def _gb(n: float) -> str:
    from saria.units import format_size

    return format_size(n)
