"""Fences: a server ends a session only when its workers' copies are over.

A session's workers copy between their KV pages and the server's DRAM pool
(stores into its slots and staging slots, loads out of them) with no call to
the server. When the server ends the session (its lease ran out: an engine
whose scheduler hangs or died while its workers still run; or a bye), it
frees those slots for other engines -- and a copy still running would write
into, or read from, a slot that holds another block by then.

So each session has a fence file. A worker holds a shared ``flock`` on it
for as long as it has copies of that session in flight (``WorkerFence``);
the server takes it exclusively before it frees anything (``fence``), and
then unlinks it, so a worker that comes later finds it gone and fails its
copies (vLLM recomputes) instead of running them. A session whose fence
cannot be taken (a worker is mid-copy, or hung mid-copy) keeps its slots --
quarantined, unreadable and not reused -- and the server tries again on
every turn of its loop. The kernel drops a dead process's locks, so a worker
killed mid-copy never blocks the fence.
"""

from __future__ import annotations

import contextlib
import fcntl
import os


def create(path: str) -> str:
    """The fence file of a new session (owner-only)."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    os.close(fd)
    return path


def fence(path: str) -> bool:
    """Ends every copy of the session: True once no worker holds the fence
    (the file is then gone; later copies fail), False while one does."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return True  # fenced before
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        os.unlink(path)
        return True
    finally:
        os.close(fd)  # (drops the lock)


class WorkerFence:
    """A worker's side: ``hold(path)`` before copies of that session start
    (False: the session was fenced -- fail them), ``release()`` once none is
    in flight."""

    def __init__(self) -> None:
        self._held: dict[str, int] = {}

    def hold(self, path: str) -> bool:
        if not path:
            return True  # no fence (an in-process cache, or a server without them)
        if path in self._held:
            return True
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            if os.fstat(fd).st_nlink == 0:  # fenced between our open and our lock
                raise BlockingIOError
        except BlockingIOError:
            os.close(fd)
            return False
        self._held[path] = fd
        return True

    def release(self) -> None:
        for fd in self._held.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._held.clear()

    @property
    def holding(self) -> bool:
        return bool(self._held)
