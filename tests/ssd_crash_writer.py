"""Helper of tests/test_ssd_store.py: writes blocks until it is killed.

Usage: python ssd_crash_writer.py DIR CAPACITY_BYTES BLOCK_BYTES BATCH [COMPACT [PARTS]]

COMPACT: the store's ``journal_compact_entries`` (small values make the
journal write a checkpoint every few calls, so kills land in checkpoints too).
PARTS: the store's ``parts`` (slots of several parts: kills tear them).

Every block's key is sha256(b"crash" + counter) and its bytes are derived from
the key (``block_bytes_for``), so the parent can verify what it recovers.
After each write call returns, one line per stored block goes to stdout,
``W <handle> <keyhex>``, flushed; before freeing the oldest blocks to make room,
``F <handle>`` lines. The parent SIGKILLs this process mid-burst.
"""

from __future__ import annotations

import hashlib
import sys

import numpy as np


def key_of(i: int) -> bytes:
    return hashlib.sha256(b"crash" + i.to_bytes(8, "little")).digest()


def block_bytes_for(key: bytes, n: int) -> bytes:
    return hashlib.shake_128(key).digest(n)


def main() -> None:
    from saria.tiers.ssd import SsdStore

    d, cap, bb, batch = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    compact = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    parts = int(sys.argv[6]) if len(sys.argv) > 6 else 1
    store = SsdStore([d], cap, bb, threads=4, unit_bytes=256 << 10, journal_compact_entries=compact, parts=parts)
    live: list[int] = []
    i = 0
    out = sys.stdout
    print("READY", flush=True)
    while True:
        if store.free_slots < batch:
            old, live = live[: 2 * batch], live[2 * batch :]
            out.write("".join(f"F {h}\n" for h in old))
            out.flush()
            store.free(old)
        keys = [key_of(i + j) for j in range(batch)]
        data = np.frombuffer(b"".join(block_bytes_for(k, bb) for k in keys), dtype=np.uint8).reshape(batch, bb)
        handles = store.write(keys, data)
        lines = []
        for k, h in zip(keys, handles.tolist()):
            if h >= 0:
                live.append(h)
                lines.append(f"W {h} {k.hex()}\n")
        out.write("".join(lines))
        out.flush()
        i += batch


if __name__ == "__main__":
    main()
