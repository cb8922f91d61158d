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
#: the default frame limit: a step's largest request (a long prompt's keys,
#: 32 B a block) is well under 1 MB; ``saria serve --max-frame`` changes it
MAX_FRAME = 8 << 20
#: caps on what one frame may build: an array or map of more items, a string
#: longer, or more containers in all is refused while decoding -- so a frame of
#: a few MB cannot build gigabytes of Python objects (a byte of ``0x90`` is an
#: empty list, ~60 B of heap each)
MAX_ITEMS = 1 << 16
MAX_STR = 1 << 16
MAX_CONTAINERS = 1 << 16


class ProtocolError(SariaError, ValueError):
    """A frame that is not a valid saria message; the text says what is wrong."""


class BadRequest(ProtocolError):
    """A request that decoded but is not valid; ``rid`` is its id (0 when it
    had no readable one), so the error reply needs no second decode."""

    def __init__(self, message: str, rid: int = 0) -> None:
        super().__init__(message)
        self.rid = rid


class RemoteError(SariaError, RuntimeError):
    """The server refused a call; ``code`` says why (``protocol``, ``version``,
    ``session``, ``config``, ``lease``, ``internal``)."""

    def __init__(self, code: str, message: str) -> None:
        self.code = code
        self.detail = message  # what the server sends (the client adds the prefix)
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


def unpack(frame: bytes, max_frame: int = MAX_FRAME) -> Any:
    """Decodes one frame within the caps above; every failure is a ``ProtocolError``."""
    if len(frame) > max_frame:
        raise ProtocolError(f"frame of {len(frame)} bytes exceeds the limit of {max_frame}")
    built = 0

    def count(obj):  # called once per array and map built
        nonlocal built
        built += 1
        if built > MAX_CONTAINERS:
            raise ProtocolError(f"frame holds more than {MAX_CONTAINERS} arrays and maps")
        return obj

    try:
        return msgpack.unpackb(frame, raw=False, ext_hook=_ext_hook, strict_map_key=True,
                               list_hook=count, object_hook=count, max_array_len=MAX_ITEMS,
                               max_map_len=MAX_ITEMS, max_str_len=MAX_STR,
                               max_bin_len=max_frame, max_ext_len=max_frame)
    except ProtocolError:
        raise
    except Exception as e:  # msgpack raises a zoo of types for bad input
        raise ProtocolError(f"undecodable frame: {type(e).__name__}: {e}") from None


def request(frame: bytes, max_frame: int = MAX_FRAME) -> tuple[int, str, str | None, dict]:
    """Validates a request frame, decoding it once: ``(id, op, session, args)``;
    a frame that decodes but is invalid raises ``BadRequest`` with its id."""
    msg = unpack(frame, max_frame)
    if not isinstance(msg, dict):
        raise BadRequest("a request is a map")
    rid = msg.get("id", 0)
    if not isinstance(rid, int) or isinstance(rid, bool):
        raise BadRequest("'id' must be an integer")
    version = msg.get("v")
    if version != VERSION:
        err = RemoteError("version", f"protocol version {version!r} is not {VERSION}")
        err.rid = rid
        raise err
    op, session, args = msg.get("op"), msg.get("session"), msg.get("args", {})
    if not isinstance(op, str):
        raise BadRequest("'op' must be a string", rid)
    if session is not None and not isinstance(session, str):
        raise BadRequest("'session' must be a string or nil", rid)
    if not isinstance(args, dict):
        raise BadRequest("'args' must be a map", rid)
    return rid, op, session, args


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
