"""The wire format between ``saria serve`` and its clients.

Transport: ZMQ, a ROUTER in the server and one DEALER per client; every
message is one frame (after ROUTER's identity frame), a msgpack map.

Request::

    {"v": VERSION, "id": int, "op": str, "session": str | None, "args": map}

Reply::

    {"id": int, "ok": true,  "result": ..., "boot": str}
    {"id": int, "ok": false, "error": str, "code": str, "boot": str}

``boot`` is the server's boot token: a client that sees it change knows the
server restarted, that its session and every spec it held are gone, and says
hello again. ``op`` ``batch`` carries ``{"calls": [[op, args], ...]}`` and
returns one reply map per call (``ok`` / ``result`` / ``error``), so a
scheduler step costs one round trip.

numpy arrays travel as msgpack extension type 1: a header (dtype string and
shape, msgpack) followed by the raw bytes, C order. Only plain numeric and
byte dtypes are accepted; anything else in a frame is a ``ProtocolError``,
which the server answers with ``code: "protocol"`` and survives.

Invariants: a frame that does not decode, lacks a field or carries the wrong
type never reaches the cache; a reply always carries the request's ``id`` when
the request had a readable one (0 otherwise).
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

from saria.errors import SariaError

VERSION = 1
_ARRAY = 1
_DTYPES = frozenset({"|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f4", "<f8", "|b1"})
MAX_FRAME = 256 << 20  # no request is this large; a bigger one is an error, not an allocation


class ProtocolError(SariaError, ValueError):
    """A frame that is not a valid saria message; the text says what is wrong."""


class RemoteError(SariaError, RuntimeError):
    """The server refused a call; ``code`` says why (``protocol``, ``version``,
    ``session``, ``config``, ``lease``, ``internal``)."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(f"saria server ({code}): {message}")


def _default(obj: Any):
    if isinstance(obj, np.ndarray):
        arr = obj if obj.flags.c_contiguous else obj.copy(order="C")  # (keeps 0-d arrays 0-d)
        if arr.dtype.str not in _DTYPES:
            raise TypeError(f"cannot send arrays of dtype {arr.dtype}")
        head = msgpack.packb((arr.dtype.str, list(arr.shape)))
        return msgpack.ExtType(_ARRAY, head + arr.tobytes())
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    raise TypeError(f"cannot send {type(obj).__name__}")


def _ext_hook(code: int, data: bytes):
    if code != _ARRAY:
        raise ProtocolError(f"unknown extension type {code}")
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(data))
    unpacker.feed(data)
    try:
        dtype, shape = next(unpacker)
        offset = unpacker.tell()
    except (StopIteration, ValueError, TypeError) as e:
        raise ProtocolError(f"bad array header: {e}") from None
    if dtype not in _DTYPES or not isinstance(shape, list) or \
            not all(isinstance(n, int) and 0 <= n < (1 << 40) for n in shape):
        raise ProtocolError(f"bad array header: dtype {dtype!r}, shape {shape!r}")
    dt = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if count * dt.itemsize != len(data) - offset:
        raise ProtocolError(f"array of {dtype} {shape} does not match its {len(data) - offset} bytes")
    return np.frombuffer(data, dt, count, offset).reshape(tuple(shape)).copy()


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, default=_default, use_bin_type=True)


def unpack(frame: bytes) -> Any:
    """Decodes one frame; every failure is a ``ProtocolError``."""
    if len(frame) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(frame)} bytes exceeds {MAX_FRAME}")
    try:
        return msgpack.unpackb(frame, raw=False, ext_hook=_ext_hook, strict_map_key=True)
    except ProtocolError:
        raise
    except Exception as e:  # msgpack raises a zoo of types for bad input
        raise ProtocolError(f"undecodable frame: {type(e).__name__}: {e}") from None


def request(frame: bytes) -> tuple[int, str, str | None, dict]:
    """Validates a request frame: ``(id, op, session, args)``."""
    msg = unpack(frame)
    if not isinstance(msg, dict):
        raise ProtocolError("a request is a map")
    rid = msg.get("id", 0)
    if not isinstance(rid, int) or isinstance(rid, bool):
        raise ProtocolError("'id' must be an integer")
    version = msg.get("v")
    if version != VERSION:
        raise RemoteError("version", f"protocol version {version!r} is not {VERSION}")
    op, session, args = msg.get("op"), msg.get("session"), msg.get("args", {})
    if not isinstance(op, str):
        raise ProtocolError("'op' must be a string")
    if session is not None and not isinstance(session, str):
        raise ProtocolError("'session' must be a string or nil")
    if not isinstance(args, dict):
        raise ProtocolError("'args' must be a map")
    return rid, op, session, args


def request_id(frame: bytes) -> int:
    """The id of a frame that failed validation, when it has a readable one."""
    try:
        msg = unpack(frame)
    except ProtocolError:
        return 0
    rid = msg.get("id", 0) if isinstance(msg, dict) else 0
    return rid if isinstance(rid, int) and not isinstance(rid, bool) else 0


def arg(args: dict, name: str, kind: type | tuple[type, ...], default: Any = ...):
    """One argument of a call, type-checked (a ``ProtocolError`` names it)."""
    if name not in args:
        if default is ...:
            raise ProtocolError(f"missing argument {name!r}")
        return default
    value = args[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise ProtocolError(f"argument {name!r} has type {type(value).__name__}")
    return value


def keys_arg(args: dict, name: str = "keys") -> np.ndarray:
    """A block-key array: uint8, shape (n, 32)."""
    keys = arg(args, name, np.ndarray)
    if keys.dtype != np.uint8 or keys.ndim != 2 or keys.shape[1] != 32:
        raise ProtocolError(f"argument {name!r} must be uint8 (n, 32), got {keys.dtype} {keys.shape}")
    return keys
