"""An in-process cluster tier: Mooncake Store's client calls over a dict.

``FakeCluster`` holds the objects every node put (one dict for the whole
simulated cluster); ``client()`` is what ``RemoteTier(client=...)`` calls --
the same five batch calls as ``MooncakeDistributedStore``, moving bytes
from and to the raw addresses saria hands over, with Mooncake's return codes.
Faults the simulation injects, each for the next call that meets it:

* ``fail_gets``: gets answer TRANSFER_FAILED (one block, not the tier);
* ``corrupt``: a stored object gets one payload byte flipped (the codec's
  checksum must catch it);
* ``vanish``: an object disappears (another node removed it);
* ``late_gets``: a get blocks (holding its lane, as a stuck RDMA read would)
  until ``land_late()``; the guard's deadline gives up on it first, and when
  it lands it writes into the buffers it was given.
* ``down``: every call fails as an unreachable master does (RPC_FAILED).
"""

from __future__ import annotations

import ctypes
import threading

from saria.tiers.remote.tier import ErrorCode


class FakeCluster:
    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.lock = threading.Lock()
        self.fail_gets = 0
        self.late_gets = 0
        self.down = False
        self._late: list[threading.Event] = []
        self.gets = 0

    def client(self) -> "FakeClient":
        return FakeClient(self)

    def corrupt(self, i: int) -> None:
        with self.lock:
            names = sorted(self.objects)
            if names:
                n = names[i % len(names)]
                b = bytearray(self.objects[n])
                b[-1] ^= 0x40
                self.objects[n] = bytes(b)

    def vanish(self, i: int) -> None:
        with self.lock:
            names = sorted(self.objects)
            if names:
                del self.objects[names[i % len(names)]]

    def land_late(self) -> None:
        late, self._late = self._late, []
        for ev in late:
            ev.set()


class FakeClient:
    def __init__(self, cluster: FakeCluster) -> None:
        self.c = cluster

    def register_buffer(self, addr: int, nbytes: int) -> int:
        return 0

    def batch_is_exist(self, names: list[str]) -> list[int]:
        if self.c.down:
            return [ErrorCode.RPC_FAILED] * len(names)
        with self.c.lock:
            return [1 if n in self.c.objects else 0 for n in names]

    def batch_put_from_multi_buffers(self, names, addrs, sizes) -> list[int]:
        if self.c.down:
            return [ErrorCode.RPC_FAILED] * len(names)
        out = []
        with self.c.lock:
            for n, aa, ss in zip(names, addrs, sizes):
                if n in self.c.objects:
                    out.append(ErrorCode.EXISTS)
                    continue
                self.c.objects[n] = b"".join(ctypes.string_at(a, s) for a, s in zip(aa, ss))
                out.append(0)
        return out

    def batch_get_into_multi_buffers(self, names, addrs, sizes) -> list[int]:
        if self.c.down:
            return [ErrorCode.RPC_FAILED] * len(names)
        late = None
        with self.c.lock:
            self.c.gets += 1
            if self.c.late_gets:
                self.c.late_gets -= 1
                late = threading.Event()
                self.c._late.append(late)
        if late is not None:
            late.wait(30)  # the sim lands it (or the run ends and lets it go)
        out = []
        with self.c.lock:
            for n, aa, ss in zip(names, addrs, sizes):
                obj = self.c.objects.get(n)
                if obj is None:
                    out.append(ErrorCode.NOT_FOUND)
                    continue
                if self.c.fail_gets:
                    self.c.fail_gets -= 1
                    out.append(ErrorCode.TRANSFER_FAILED)
                    continue
                off = 0
                for a, s in zip(aa, ss):
                    ctypes.memmove(a, obj[off: off + s], s)
                    off += s
                out.append(off)
        return out

    def batch_remove(self, names, force=False) -> list[int]:
        if self.c.down:
            return [ErrorCode.RPC_FAILED] * len(names)
        with self.c.lock:
            return [0 if self.c.objects.pop(n, None) is not None else ErrorCode.NOT_FOUND
                    for n in names]

    def close(self) -> None:
        pass
