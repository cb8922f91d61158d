"""An attacker of the cluster tier: a raw Mooncake client, no saria code.

It knows saria's published row formats (the docstring of
``saria/tiers/remote/rows.py``) but not the fleet's key. It lends no memory
(``segment_bytes`` 0): what it puts lands in the victims' segments and stays
after it exits.

    python remote_attacker_child.py MASTER METADATA NAMESPACE BLOCK MODE KEYHEX[,KEYHEX...] [NAME,...]

MODE ``forge``: for each block key, a v1 row (public name, valid crc32c) and
a v2 row signed with the attacker's own key under the name that key derives,
both with payload bytes 0xEE. ``plant``: a forged row (v1 and a v2 header
with a wrong MAC, in turn) under each NAME given (names learned by
enumeration), replacing what was there. ``remove``: removes every name it can
derive for the keys (v1, v2 under its key). Prints ``done RCS``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
import sys

from mooncake.store import MooncakeDistributedStore

POISON = 0xEE


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_T = _crc32c_table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _T[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def v1_name(ns: str, key: bytes) -> str:
    return f"saria/r1/{ns}/{key.hex()}"


def v1_row(ns: str, key: bytes, payload: bytes) -> bytes:
    tag = hashlib.blake2b(ns.encode(), digest_size=8).digest()
    head = b"SARIAROW" + struct.pack("<II", 1, len(payload)) + key + tag
    head += struct.pack("<I", crc32c(payload))
    return head + struct.pack("<I", crc32c(head)) + payload


def v2_name(k: bytes, kid: int, ns: str, key: bytes) -> str:
    nk = hmac.digest(k, b"saria-row-name\0" + ns.encode(), "sha256")
    return f"saria/r2/{kid}/{hmac.digest(nk, key, 'sha256').hex()}"


def v2_row(k: bytes, kid: int, ns: str, key: bytes, payload: bytes) -> bytes:
    tag = hashlib.blake2b(ns.encode(), digest_size=8).digest()
    head = b"SARIAROW" + struct.pack("<IIII", 2, len(payload), kid, 0) + tag
    mk = hmac.digest(k, b"saria-row-mac\0" + ns.encode(), "sha256")
    return head + hmac.digest(mk, head + key + payload, "sha256") + payload


def main() -> None:
    master, metadata, ns, block, mode, keys_hex = sys.argv[1:7]
    names = sys.argv[7].split(",") if len(sys.argv) > 7 else []
    keys = [bytes.fromhex(h) for h in keys_hex.split(",")]
    payload = bytes([POISON]) * int(block)
    mine, kid = os.urandom(32), 1  # not the fleet's key
    host, port = master.removeprefix("mooncake://").rsplit(":", 1)
    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", metadata, 0, 16 << 20, "tcp", "", f"{host}:{port}")
    if rc != 0:
        print(f"setup failed {rc}", flush=True)
        return
    rcs: list[int] = []
    if mode == "forge":
        for key in keys:
            rcs.append(store.put(v1_name(ns, key), v1_row(ns, key, payload)))
            rcs.append(store.put(v2_name(mine, kid, ns, key), v2_row(mine, kid, ns, key, payload)))
    elif mode == "plant":
        for i, (key, name) in enumerate(zip(keys, names)):
            store.remove(name, True)
            row = v1_row(ns, key, payload) if i % 2 else v2_row(mine, 1, ns, key, payload)
            rcs.append(store.put(name, row))
    elif mode == "remove":
        for key in keys:
            rcs.append(store.remove(v1_name(ns, key), True))
            rcs.append(store.remove(v2_name(mine, kid, ns, key), True))
    print("done " + ",".join(map(str, rcs)), flush=True)
    store.close()


if __name__ == "__main__":
    main()
