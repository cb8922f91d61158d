"""Who is on the other end of a ``saria serve`` socket.

A shared KV cache is a shared input of every model it serves, so the server
knows each peer before it reads a frame, and a client knows the server
before it maps a byte:

* **IPC** (the default): the socket lives in a folder that only its owner
  can change (``secure_dir``: created with ``mkdir``, never adopted from
  another user; checked with ``lstat`` by the server and by the client
  before connecting). The peer's uid comes from ``SO_PEERCRED`` (libzmq puts
  it in the ZAP request's address); the server's own uid and ``--allow-uid``
  uids are let in, nobody else.
* **TCP**: CurveZMQ. The server has a key pair; clients' public keys are an
  allowlist (``--curve-clients DIR``). A ``tcp://`` listener without keys
  refuses to start unless ``--insecure-tcp`` is given (loopback included:
  every local user reaches it).

The ZAP handler (``Gate``) answers libzmq's authentication requests on its own
thread and names each peer (``uid:N`` or ``key:NAME``) in the messages'
``User-Id``; the server maps that to a tenant (``saria.serve.tenants``).

Keys are CurveZMQ's z85 text in ZeroMQ's certificate files (``NAME.key``
public, ``NAME.key_secret`` secret, 0600), which ``saria serve keygen`` writes
and ``zmq.auth.load_certificate`` reads.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from dataclasses import dataclass

import zmq

from saria.errors import ConfigError

log = logging.getLogger("saria.serve")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
DOMAIN = b"saria"


class UnsafePath(ConfigError):
    """A folder or file another user could have placed or can change."""


# ------------------------------------------------------------ files and folders


def check_dir(path: str, *, owner: int | None = None, strict: bool = True) -> None:
    """Refuses `path` unless it is a real folder (not a symlink) owned by
    `owner` (our uid) with no group/other bits (`strict`) or at least no
    group/other write bits (an operator's folder another uid may traverse)."""
    owner = os.getuid() if owner is None else owner
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise UnsafePath("listen", f"{path} does not exist") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePath("listen", f"{path} is not a folder (a symlink or a file): refusing it")
    if st.st_uid != owner:
        raise UnsafePath("listen", f"{path} belongs to uid {st.st_uid}, not {owner}: another user "
                         "may have placed it; remove it or choose another folder")
    bad = 0o077 if strict else 0o022
    if st.st_mode & bad:
        raise UnsafePath("listen", f"{path} has mode {stat.S_IMODE(st.st_mode):04o}; it must "
                         f"have no group/other {'bits' if strict else 'write bits'} "
                         f"(chmod {'700' if strict else 'go-w'} {path})")


def check_ancestors(path: str, owner: int | None = None) -> None:
    """Refuses `path` if a folder above it could let another user replace it:
    each must belong to us or root and, if group/other may write to it, be
    sticky (as /tmp is: nobody renames another user's entries there)."""
    trusted = {os.getuid(), 0, os.getuid() if owner is None else owner}
    p = os.path.dirname(os.path.realpath(path))
    while True:
        st = os.lstat(p)
        if st.st_uid not in trusted or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
            raise UnsafePath("listen", f"{p}, above {path}, may be changed by another user "
                             f"(uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})")
        if p == "/":
            return
        p = os.path.dirname(p)


def secure_dir(path: str, *, strict: bool = True) -> None:
    """Creates `path` (and missing parents) owner-only with ``mkdir`` -- never
    adopting a folder someone else made -- and checks it (``check_dir``: a
    folder of ours; `strict`: no group/other bits at all) and the folders
    above it (``check_ancestors``)."""
    missing = []
    p = os.path.abspath(path)
    while not os.path.lexists(p):
        missing.append(p)
        p = os.path.dirname(p)
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass  # raced: the checks below decide whether it is ours
        check_dir(d, strict=True)
    check_dir(os.path.abspath(path), strict=strict)
    check_ancestors(path)


def ipc_dir(address: str) -> str | None:
    """The folder of an ``ipc://`` address (None for other transports)."""
    if not address.startswith("ipc://"):
        return None
    return os.path.dirname(os.path.abspath(address[len("ipc://"):])) or "/"


def check_ipc_server(address: str, *, owner: int | None = None, strict: bool = False) -> None:
    """A client's check before it connects to an ``ipc://`` server: the socket's
    folder and the socket belong to the server's uid (ours unless told)."""
    d = ipc_dir(address)
    if d is None:
        return
    owner = os.getuid() if owner is None else owner
    check_dir(d, owner=owner, strict=strict)
    check_ancestors(d, owner)
    sock = address[len("ipc://"):]
    try:
        st = os.lstat(sock)
    except FileNotFoundError:
        return  # not up yet: ZMQ reconnects, and the folder (ours) decides who can create it
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != owner:
        raise UnsafePath("server", f"{sock} is not a socket of uid {owner}: refusing to connect")


def check_pool(path: str, *, owner: int | None = None, prefix: str = "saria-serve-") -> None:
    """Refuses a pool file a server names unless it is a regular file (not a
    symlink) in /dev/shm named ``saria-serve-UID-...``, owned by the server's
    uid, with no group/other bits. (/dev/shm is sticky: once checked, the
    name cannot be swapped by another user.)"""
    owner = os.getuid() if owner is None else owner
    name = os.path.basename(path)
    if os.path.dirname(path) != "/dev/shm" or not name.startswith(f"{prefix}{owner}-"):
        raise UnsafePath("server", f"the server named the pool {path!r}, not a "
                         f"/dev/shm/{prefix}{owner}-* file: refusing to map it")
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != owner or st.st_mode & 0o077:
        raise UnsafePath("server", f"the pool {path} is not a uid-{owner} owner-only regular "
                         f"file (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}): "
                         "refusing to map it")


def check_ssd_dirs(dirs, roots=(), *, owner: int | None = None) -> None:
    """Refuses SSD folders a server names unless each is ``ROOT/saria-NS`` for
    a configured root (the connector's ``server_ssd_roots``), or -- no roots
    configured -- a real folder of the server's uid with no group/other write bits."""
    for d in dirs:
        if roots:
            parent = os.path.dirname(os.path.abspath(d))
            if not os.path.basename(d).startswith("saria-") or \
                    parent not in {os.path.abspath(r) for r in roots}:
                raise UnsafePath("server_ssd_roots", f"the server named the SSD folder {d!r}, "
                                 "not under a configured root: refusing it")
        elif os.path.lexists(d):
            check_dir(d, owner=owner, strict=False)


# ------------------------------------------------------------------ keys


def write_keypair(folder: str, name: str) -> tuple[str, str]:
    """``NAME.key`` (public, 0644) and ``NAME.key_secret`` (0600) in
    `folder`, ZeroMQ's certificate format; refuses to overwrite."""
    if not name or "/" in name or name.startswith("."):
        raise ConfigError("name", f"{name!r} is not a plain file name")
    secure_dir(folder, strict=False)
    public, secret = zmq.curve_keypair()
    out = []
    for suffix, body, mode in (("key", f"    public-key = \"{public.decode()}\"\n", 0o644),
                               ("key_secret", f"    public-key = \"{public.decode()}\"\n"
                                f"    secret-key = \"{secret.decode()}\"\n", 0o600)):
        path = os.path.join(folder, f"{name}.{suffix}")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        except FileExistsError:
            raise ConfigError("name", f"{path} exists; choose another name") from None
        with os.fdopen(fd, "w") as f:
            f.write(f"#   saria serve keygen: CurveZMQ {'secret ' if mode == 0o600 else ''}"
                    f"certificate\nmetadata\ncurve\n{body}")
        out.append(path)
    return out[0], out[1]


def load_public(path: str) -> bytes:
    public, _ = _load(path)
    return public


def load_secret(path: str) -> tuple[bytes, bytes]:
    """(public, secret) of a ``.key_secret`` file, which must be owner-only."""
    st = os.stat(path)
    if st.st_mode & 0o077:
        raise UnsafePath("curve", f"{path} has mode {stat.S_IMODE(st.st_mode):04o}; a secret key "
                         f"must be owner-only (chmod 600 {path})")
    public, secret = _load(path)
    if secret is None:
        raise ConfigError("curve", f"{path} holds no secret key")
    return public, secret


def _load(path: str):
    import zmq.auth

    try:
        return zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:
        raise ConfigError("curve", f"cannot read the key file {path}: {e}") from None


def load_allowlist(folder: str) -> dict[bytes, str]:
    """Every ``NAME.key`` in `folder`: z85 public key -> ``NAME``."""
    try:
        names = sorted(os.listdir(folder))
    except OSError as e:
        raise ConfigError("curve_clients", f"{folder}: {e.strerror}") from None
    keys = {load_public(os.path.join(folder, n)): n[:-len(".key")]
            for n in names if n.endswith(".key")}
    if not keys:
        raise ConfigError("curve_clients", f"{folder} holds no NAME.key public key")
    return keys


def curve_client(sock: zmq.Socket, secret_file: str | None, server_key_file: str | None) -> None:
    """Makes `sock` a CURVE client (before it connects) when both files are
    given: the engine's secret key and the server's public key."""
    if secret_file is None and server_key_file is None:
        return
    if secret_file is None or server_key_file is None:
        raise ConfigError("server_curve_secret", "CURVE needs both server_curve_secret (this "
                          "engine's NAME.key_secret) and server_curve_key (the server's NAME.key)")
    public, secret = load_secret(secret_file)
    sock.curve_publickey, sock.curve_secretkey = public, secret
    sock.curve_serverkey = load_public(server_key_file)


# ------------------------------------------------------------------ the gate


class Gate:
    """libzmq's ZAP handler for the server's sockets: lets in IPC peers of
    allowed uids and CURVE peers with listed keys; names each one in
    ``User-Id``. Counts refusals (``refused``)."""

    def __init__(self, ctx: zmq.Context, *, ipc: bool, allow_uids=(),
                 client_keys: dict[bytes, str] | None = None, insecure_tcp: bool = False) -> None:
        self.ipc = ipc  # the listener's transport: an IPC peer's address carries its uid
        self.allow_uids = {os.getuid(), *allow_uids}
        self.client_keys = client_keys or {}  # z85 public key -> name
        self.insecure_tcp = insecure_tcp
        self.refused = 0
        self._sock = ctx.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(ZAP_ENDPOINT)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="saria-zap", daemon=True)
        self._thread.start()

    def decide(self, mechanism: bytes, address: bytes, credentials: list[bytes]) -> str | None:
        """The peer's name, or None to refuse it."""
        if mechanism == b"CURVE":
            name = self.client_keys.get(zmq.utils.z85.encode(credentials[0]))
            return None if name is None else f"key:{name}"
        if mechanism == b"NULL":
            if self.ipc:
                uid = _ipc_uid(address.decode(errors="replace"))
                return f"uid:{uid}" if uid in self.allow_uids else None
            return "tcp:insecure" if self.insecure_tcp else None
        return None

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                if not poller.poll(100):
                    continue
                msg = self._sock.recv_multipart()
            except zmq.ZMQError:
                return  # the context is closing
            version, rid, _domain, address, _ident, mechanism, *creds = msg
            try:
                who = self.decide(mechanism, address, creds)
            except Exception:  # a malformed request refuses, never kills the gate
                who = None
            if who is None:
                self.refused += 1
                log.warning("saria serve: refused a %s peer at %s", mechanism.decode(errors="?"),
                            address.decode(errors="replace"))
                reply = [version, rid, b"400", b"not allowed", b"", b""]
            else:
                reply = [version, rid, b"200", b"OK", who.encode(), b""]
            try:
                self._sock.send_multipart(reply)
            except zmq.ZMQError:
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sock.close(0)


def process_of(frame: zmq.Frame, ident: bytes) -> str:
    """The client process a request came from, for the per-process quotas:
    over ipc:// the pid the kernel gives libzmq (``SO_PEERCRED``, appended
    to the peer's address), which a client cannot forge; over tcp://, where
    no pid travels, the connection (a client that reconnects for every hello
    is bounded by its key's session cap, not by the per-process ones)."""
    try:
        address = frame.get("Peer-Address") or ""
    except zmq.ZMQError:
        address = ""
    cred = _peercred(address)
    return f"pid:{cred[2]}" if cred else f"conn:{ident.hex()}"


def _ipc_uid(address: str) -> int | None:
    """The uid libzmq appends to an IPC peer's address, or None when it is
    missing (then: refused)."""
    cred = _peercred(address)
    return cred[0] if cred else None


def _peercred(address: str) -> tuple[int, int, int] | None:
    """(uid, gid, pid) that libzmq appends to an IPC peer's address
    (``...:UID:GID:PID``, from ``SO_PEERCRED``), or None when absent."""
    parts = address.rsplit(":", 3)
    if len(parts) == 4 and all(p.isdigit() for p in parts[1:]):
        return int(parts[1]), int(parts[2]), int(parts[3])
    return None


# ------------------------------------------------------------------ clients


@dataclass(frozen=True, slots=True)
class ClientSecurity:
    """What a client checks of the server it reaches (the connector's
    ``server_*`` keys): CURVE key files for ``tcp://``, the server's uid for
    ``ipc://`` and for the pool it names (None: ours), and the SSD roots it
    accepts (empty: folders of the server's uid without group/other write bits)."""

    curve_secret: str | None = None
    curve_server_key: str | None = None
    server_uid: int | None = None
    ssd_roots: tuple[str, ...] = ()

    def socket(self, ctx: zmq.Context, address: str) -> zmq.Socket:
        """A DEALER connected to `address` after the checks: an ipc:// folder of
        the server's uid; CURVE keys when configured; a tcp:// address without
        them connects only if the server is --insecure-tcp."""
        check_ipc_server(address, owner=self.server_uid)
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IMMEDIATE, 1)  # no queueing for a peer that is not there
        try:
            curve_client(sock, self.curve_secret, self.curve_server_key)
            sock.connect(address)
        except BaseException:
            sock.close(0)
            raise
        return sock

    def check_hello(self, info: dict) -> None:
        """The pool and SSD folders a hello names, before a worker maps them."""
        if info.get("pool") is not None:
            check_pool(info["pool"], owner=self.server_uid)
        check_ssd_dirs(info.get("ssd_dirs", ()), self.ssd_roots, owner=self.server_uid)
