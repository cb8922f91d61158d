"""DRAM tier: a pool of fixed-size slots, allocated once at start-up.

    pool = DramPool(num_slots=4096, slot_bytes=2 * 2**20)   # 8 GiB, pinned if CUDA is present
    h = pool.alloc(3)                  # int64 slot handles, e.g. [0, 1, 2]; the index stores them
    pool.scatter(h, kv)                # kv: (3, slot_bytes) bytes -> the three slots
    pool.gather(h, out)                # the three slots -> out
    pool.view(h[0])[:16]               # a slot as a numpy view: no copy
    pool.as_torch()                    # the whole pool as a (num_slots, slot_bytes) uint8 tensor
    pool.free(h)

Memory. The pool is one anonymous ``mmap`` of ``num_slots * slot_bytes`` bytes (page-aligned;
slot ``i`` starts at ``base_address + i * slot_bytes``, so slots are page-aligned -- as O_DIRECT
and DMA want -- whenever ``slot_bytes`` is a multiple of the page size). Nothing is allocated
per block afterwards: handles are indices into that one mapping.

Pinning (``pin``). ``None`` (default): page-lock the pool when torch is importable and a CUDA
device is present, otherwise use ordinary host memory. ``True``: page-lock or raise
:class:`DramPoolError`. ``False``: never page-lock and never import torch. Page-locking
registers the mapping with ``cudaHostRegister`` (through ``torch.cuda.cudart()``), so the pool
is exactly the requested size (torch's pinned caching allocator would round it up to a power of
two); if that entry point is missing, the pool is a ``torch.empty(..., pin_memory=True)``
buffer instead. ``pinned`` says which happened and ``pin_method`` how.

Pre-faulting (``prefault``, default True). Every page is written once in the constructor
(``MAP_POPULATE`` where the platform has it, then one byte per page), so the hot path never
takes a page fault and the pool's memory is committed up front -- a pool that does not fit
fails at start-up, not in the middle of serving. ``prefault=False`` leaves pages to be faulted
in on first use (faster start-up, e.g. for tests and tools that touch few slots). Page-locked
memory is always resident, whatever ``prefault`` says.

Allocation. A free list kept as a numpy int64 stack (LIFO: a freed slot is the next one handed
out, while it is still warm in cache) plus one bool per slot for "allocated"; no per-block
Python objects. ``alloc(k)`` raises :class:`DramPoolFull` when fewer than ``k`` slots are free
and changes nothing: the runtime evicts through the index first and then allocates, so running
out here is a bookkeeping bug, not a normal event. ``alloc(k, partial=True)`` instead returns
as many as are free (possibly none). ``free`` rejects handles that are out of range, not
allocated (double free) or repeated within the call, and then frees nothing.

Threads. A lock guards the free list and the allocated flags (``alloc``, ``free``). Copies
(``gather``, ``scatter``) do not take it: they are native copies that release the GIL, so
several threads copy in parallel. Copying into a slot while
another thread frees it is the caller's race, as with any allocator.

Sharing (``shared``). With ``shared=PATH`` the pool is a ``MAP_SHARED`` mapping of the file
PATH (normally on ``/dev/shm``), created at the pool's size if missing and attached to if it
exists with exactly that size. The file holds every cached prompt's KV: it is created with
``O_EXCL`` (mode 0600) and an existing one is attached to only if it is a regular file (no
symlink) of this user with no group/other bits -- a file another user planted under the name
is refused, never mapped (``private_dir`` makes the folder such names live in). Two processes that open the same PATH see the same bytes: the
vLLM connector's scheduler process owns the pool's allocator and the index, the worker process
attaches and copies KV pages in and out of the slots the scheduler names. Each process keeps its
own free list; only the owner's is used. Pinning a shared pool uses ``cudaHostRegister`` only
(torch's pinned allocator cannot map a file); if that fails the pool stays ordinary memory.
``unlink()`` removes the file name (the memory lives on while a process maps it).

Views. ``view(h)`` and ``views(handles)`` are numpy views (no copy) of single slots;
``pool.array`` is the whole pool as a ``(num_slots, slot_bytes)`` uint8 array. Fancy indexing
(``pool.array[handles]``) copies twice, which is why ``gather`` / ``scatter`` exist: one
``memcpy`` per slot in native code (``saria.tiers.copy``), the GIL released.
"""

from __future__ import annotations

import mmap
import os
import stat
import threading
from typing import Any

import numpy as np

from saria.errors import SariaError
from saria.tiers.copy import copy_rows

__all__ = ["DramPool", "DramPoolError", "DramPoolFull", "private_dir"]

PAGE_SIZE = mmap.PAGESIZE
_HUGE_PAGE = 2 << 20


class DramPoolError(SariaError, ValueError):
    """Bad argument or bad handle given to a :class:`DramPool` (the pool is unchanged)."""


class DramPoolFull(DramPoolError):
    """``alloc(k)`` asked for more slots than are free (nothing was allocated)."""


def _check_count(value: Any, name: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise DramPoolError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    value = int(value)
    if value < minimum:
        raise DramPoolError(f"{name} must be at least {minimum}, got {value}")
    return value


def _cuda_torch():
    """torch if it is importable and sees a CUDA device, else None."""
    try:
        import torch
    except Exception:  # ImportError, or a broken install (e.g. mismatched CUDA wheels)
        return None
    try:
        return torch if torch.cuda.is_available() else None
    except Exception:
        return None



def private_dir(base: str = "/dev/shm") -> str:
    """``base/saria-<uid>``: a folder of this user's only (mode 0700), made with
    ``mkdir`` or, if it exists, accepted only when ``lstat`` shows a real
    directory of this user with no group/other bits. Pool files named in it
    cannot be planted or swapped by another user (``base`` is shared, e.g. the
    sticky ``/dev/shm``)."""
    path = os.path.join(base, f"saria-{os.geteuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise DramPoolError(f"cannot create {path}: {exc}") from exc
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise DramPoolError(f"{path}: not a private folder of this user (owner uid {st.st_uid}, "
                            f"mode {stat.S_IMODE(st.st_mode):04o}, "
                            f"{'a directory' if stat.S_ISDIR(st.st_mode) else 'not a directory'}); "
                            f"saria will not keep a pool there -- remove it")
    return path

class DramPool:
    """``num_slots`` slots of ``slot_bytes`` bytes in one host allocation (see the module doc)."""

    def __init__(self, num_slots: int, slot_bytes: int, *, pin: bool | None = None,
                 prefault: bool = True, shared: str | None = None) -> None:
        n = _check_count(num_slots, "num_slots", minimum=1)
        b = _check_count(slot_bytes, "slot_bytes", minimum=1)
        if pin not in (None, True, False):
            raise DramPoolError(f"pin must be None, True or False, got {pin!r}")
        nbytes = n * b
        self._num_slots = n
        self._slot_bytes = b
        self._nbytes = nbytes
        self._lock = threading.Lock()
        self._mmap: mmap.mmap | None = None
        self._tensor = None          # the torch tensor backing the pool (pin_method "torch")
        self._registered_ptr = None  # address given to cudaHostRegister
        self._torch = None
        self._closed = False
        self._pinned = False
        self._pin_method: str | None = None
        self._prefaulted = False
        self._shared = None if shared is None else str(shared)
        self._shared_id: tuple[int, int] | None = None

        torch = None
        if pin is not False:
            torch = _cuda_torch()
            if torch is None and pin is True:
                raise DramPoolError("pin=True needs torch with a CUDA device (torch is not "
                                    "importable or sees no GPU); use pin=None or pin=False")

        flat: np.ndarray | None = None
        if torch is not None:
            flat = self._alloc_pinned(torch, nbytes, prefault)
        if flat is None:
            flat = self._alloc_mmap(nbytes, prefault)
        self._arr = flat.reshape(n, b)
        self._torch = torch if self._pinned else None
        # Free list: a stack whose top is the end of the live part; slot 0 is handed out first.
        self._stack = np.arange(n - 1, -1, -1, dtype=np.int64)
        self._top = n
        self._allocated = np.zeros(n, dtype=np.bool_)

    # ----------------------------------------------------------------- set-up / tear-down
    def _alloc_mmap(self, nbytes: int, prefault: bool) -> np.ndarray:
        if self._shared is not None:
            return self._map_shared(nbytes, prefault)
        flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", getattr(mmap, "MAP_ANON", 0))
        huge = hasattr(mmap, "MADV_HUGEPAGE") and nbytes >= _HUGE_PAGE
        if prefault and not huge and hasattr(mmap, "MAP_POPULATE"):
            flags |= mmap.MAP_POPULATE
        try:
            m = mmap.mmap(-1, nbytes, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except (OSError, OverflowError) as exc:
            raise DramPoolError(f"cannot allocate a {nbytes:,}-byte DRAM pool: {exc}") from exc
        return self._finish_map(m, nbytes, prefault, huge)

    def _map_shared(self, nbytes: int, prefault: bool) -> np.ndarray:
        path = self._shared
        flags = os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        try:
            try:
                fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:  # the other side of the engine made it: check whose it is
                fd = os.open(path, flags)
        except OSError as exc:
            raise DramPoolError(f"cannot open shared DRAM pool file {path}: {exc}") from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
                raise DramPoolError(
                    f"shared DRAM pool file {path}: refusing to map it (owner uid {st.st_uid}, "
                    f"mode {stat.S_IMODE(st.st_mode):04o}; it must be a regular file of uid "
                    f"{os.geteuid()} with mode 0600): remove it if it is not another user's")
            self._shared_id = (int(st.st_dev), int(st.st_ino))
            size = st.st_size
            if size == 0:
                try:
                    os.posix_fallocate(fd, 0, nbytes)  # tmpfs: fails now, not at first touch
                except OSError as exc:
                    raise DramPoolError(f"cannot size shared DRAM pool file {path} to "
                                        f"{nbytes:,} bytes: {exc}") from exc
            elif size != nbytes:
                raise DramPoolError(f"shared DRAM pool file {path} holds {size:,} bytes, "
                                    f"expected {nbytes:,}: another pool of a different size")
            try:
                # MAP_POPULATE maps the (fallocated) tmpfs pages up front. No write-prefault:
                # an attaching process must not zero bytes the other side already holds.
                m = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                              prot=mmap.PROT_READ | mmap.PROT_WRITE)
            except (OSError, OverflowError) as exc:
                raise DramPoolError(f"cannot map shared DRAM pool {path}: {exc}") from exc
        finally:
            os.close(fd)
        self._prefaulted = prefault
        return self._finish_map(m, nbytes, False, False)

    def _finish_map(self, m: mmap.mmap, nbytes: int, prefault: bool, huge: bool) -> np.ndarray:
        self._mmap = m
        if huge:
            # Transparent huge pages where the kernel allows them (madvise mode): ~10x faster
            # pre-faulting and fewer TLB misses in copies. Advisory; ignore refusals.
            try:
                m.madvise(mmap.MADV_HUGEPAGE)
            except OSError:
                pass
        flat = np.frombuffer(m, dtype=np.uint8)
        if prefault:
            # One write per page makes every page present and private (not the shared zero
            # page), so no later copy faults; this also covers MAP_POPULATE leaving pages out
            # under memory pressure, and platforms without it.
            flat[::PAGE_SIZE] = 0
            self._prefaulted = True
        return flat

    def _alloc_pinned(self, torch, nbytes: int, prefault: bool) -> np.ndarray | None:
        cudart = None
        try:
            cudart = torch.cuda.cudart()
        except Exception:
            cudart = None
        if cudart is not None and hasattr(cudart, "cudaHostRegister"):
            flat = self._alloc_mmap(nbytes, prefault)
            ptr = flat.ctypes.data
            try:
                err = cudart.cudaHostRegister(ptr, nbytes, 0)
            except Exception as exc:  # noqa: BLE001 -- fall back to torch's allocator
                err = exc
            if not _cuda_ok(err):
                if self._shared is not None:
                    return flat  # a shared pool cannot move to torch's allocator
                del flat
                self._release_mmap()
                return self._alloc_torch_pinned(torch, nbytes)
            self._registered_ptr = ptr
            self._pinned = True
            self._pin_method = "cudaHostRegister"
            self._prefaulted = True  # page-locked memory is resident
            return flat
        if self._shared is not None:
            return None  # ordinary shared memory; see "Sharing" in the module doc
        return self._alloc_torch_pinned(torch, nbytes)

    def _alloc_torch_pinned(self, torch, nbytes: int) -> np.ndarray | None:
        try:
            t = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        except Exception:  # noqa: BLE001 -- e.g. out of pinnable memory: ordinary memory
            return None
        self._tensor = t
        self._pinned = True
        self._pin_method = "torch"
        self._prefaulted = True
        return t.numpy()

    def _release_mmap(self) -> None:
        m, self._mmap = self._mmap, None
        if m is not None:
            try:
                m.close()
            except BufferError:
                pass  # views are still alive; the mapping goes when the last one does

    def close(self) -> None:
        """Unregister and release the memory. Idempotent. Views handed out keep the memory
        mapped until they are dropped; the pool itself is unusable afterwards."""
        if self._closed:
            return
        self._closed = True
        if self._registered_ptr is not None and self._torch is not None:
            try:
                self._torch.cuda.cudart().cudaHostUnregister(self._registered_ptr)
            except Exception:  # noqa: BLE001 -- at interpreter exit CUDA may be gone
                pass
            self._registered_ptr = None
        self._arr = None  # type: ignore[assignment]
        self._tensor = None
        self._release_mmap()

    @property
    def shared_id(self) -> tuple[int, int] | None:
        """(device, inode) of a shared pool's file: equal in two processes
        exactly when they map the same memory."""
        return self._shared_id

    def unlink(self) -> None:
        """Removes a shared pool's file name; mappings stay valid. Idempotent."""
        if self._shared is not None:
            try:
                os.unlink(self._shared)
            except FileNotFoundError:
                pass

    def __enter__(self) -> DramPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    def __repr__(self) -> str:
        return (f"DramPool(num_slots={self._num_slots}, slot_bytes={self._slot_bytes}, "
                f"free={self.free_slots}, pinned={self._pinned})")

    # ----------------------------------------------------------------------- properties
    @property
    def num_slots(self) -> int:
        return self._num_slots

    @property
    def slot_bytes(self) -> int:
        return self._slot_bytes

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def free_slots(self) -> int:
        return self._top

    @property
    def used_slots(self) -> int:
        return self._num_slots - self._top

    @property
    def pinned(self) -> bool:
        """True when the pool is page-locked (registered with CUDA)."""
        return self._pinned

    @property
    def pin_method(self) -> str | None:
        """"cudaHostRegister", "torch" (torch's pinned allocator) or None (not pinned)."""
        return self._pin_method

    @property
    def prefaulted(self) -> bool:
        return self._prefaulted

    @property
    def array(self) -> np.ndarray:
        """The whole pool as a ``(num_slots, slot_bytes)`` uint8 array (a view)."""
        self._check_open()
        return self._arr

    @property
    def base_address(self) -> int:
        """Address of slot 0; slot ``h`` is at ``base_address + h * slot_bytes``."""
        self._check_open()
        return int(self._arr.ctypes.data)

    def is_allocated(self, handles) -> np.ndarray | bool:
        h = np.asarray(handles)
        self._check_range(h.reshape(-1))
        r = self._allocated[h]
        return bool(r) if r.ndim == 0 else r

    # ----------------------------------------------------------------------- allocation
    def alloc(self, k: int, *, partial: bool = False) -> np.ndarray:
        """``k`` free slot handles (int64). Raises :class:`DramPoolFull` if fewer than ``k``
        are free (nothing allocated), or, with ``partial=True``, returns the ones there are."""
        k = _check_count(k, "k", minimum=0)
        self._check_open()
        with self._lock:
            top = self._top
            if k > top:
                if not partial:
                    raise DramPoolFull(f"DRAM pool full: asked for {k} slots, {top} of "
                                       f"{self._num_slots} free (evict through the index first)")
                k = top
            out = self._stack[top - k:top][::-1].copy()
            self._top = top - k
            self._allocated[out] = True
        return out

    def free(self, handles) -> None:
        """Return slots to the pool. Out-of-range, unallocated (double free) or repeated
        handles raise :class:`DramPoolError` and nothing is freed."""
        h = self._handles(handles)
        if h.size == 0:
            return
        with self._lock:
            self._check_open()
            if not self._allocated[h].all():
                bad = h[~self._allocated[h]]
                raise DramPoolError(f"free of {bad.size} slot(s) that are not allocated "
                                    f"(double free?), e.g. {int(bad[0])}; nothing freed")
            if h.size > 1 and np.unique(h).size != h.size:
                raise DramPoolError("free: the same handle appears more than once; nothing freed")
            top = self._top
            self._stack[top:top + h.size] = h[::-1]
            self._top = top + h.size
            self._allocated[h] = False

    # ------------------------------------------------------------------------ data access
    def view(self, handle) -> np.ndarray:
        """Slot ``handle`` as a 1-D uint8 numpy view (writes go to the pool)."""
        self._check_open()
        if isinstance(handle, bool) or not isinstance(handle, (int, np.integer)):
            raise DramPoolError(f"handle must be an integer, got {type(handle).__name__}")
        h = int(handle)
        if not 0 <= h < self._num_slots:
            raise DramPoolError(f"handle {h} out of range [0, {self._num_slots})")
        if not self._allocated[h]:
            raise DramPoolError(f"slot {h} is not allocated")
        return self._arr[h]

    def views(self, handles) -> list[np.ndarray]:
        """One zero-copy view per handle (a list: a fancy-indexed array would be a copy)."""
        h = self._handles(handles)
        self._check_live(h)
        arr = self._arr
        return [arr[i] for i in h.tolist()]

    def gather(self, handles, out: np.ndarray) -> np.ndarray:
        """Copy slots ``handles`` into ``out`` (C-contiguous, ``len(handles) * slot_bytes``
        bytes, any dtype/shape, e.g. ``(k, slot_bytes)`` uint8). Returns out."""
        h = self._handles(handles)
        self._check_live(h)
        dst = self._rows(out, h.size, "out")
        if h.size:
            copy_rows(dst, None, self._arr, h)
        return out

    def scatter(self, handles, src: np.ndarray) -> None:
        """Copy ``src`` (C-contiguous, ``len(handles) * slot_bytes`` bytes) into slots
        ``handles``."""
        h = self._handles(handles)
        self._check_live(h)
        rows = self._rows(src, h.size, "src")
        if h.size:
            copy_rows(self._arr, h, rows, None)

    def as_torch(self):
        """The whole pool as a ``(num_slots, slot_bytes)`` torch.uint8 CPU tensor sharing its
        memory (pinned when the pool is). Needs torch; raises :class:`DramPoolError` without."""
        self._check_open()
        if self._tensor is not None:
            return self._tensor.view(self._num_slots, self._slot_bytes)
        try:
            import torch
        except ImportError as exc:
            raise DramPoolError("as_torch() needs torch, which is not installed") from exc
        return torch.from_numpy(self._arr)

    # ---------------------------------------------------------------------------- checks
    def _check_open(self) -> None:
        if self._closed:
            raise DramPoolError("the DRAM pool is closed")

    def _check_range(self, h: np.ndarray) -> None:
        if h.size and (int(h.min()) < 0 or int(h.max()) >= self._num_slots):
            bad = h[(h < 0) | (h >= self._num_slots)]
            raise DramPoolError(f"handle {int(bad[0])} out of range [0, {self._num_slots})")

    def _handles(self, handles) -> np.ndarray:
        h = np.asarray(handles)
        if h.ndim == 0:
            h = h.reshape(1)
        if h.ndim != 1:
            raise DramPoolError(f"handles must be 1-D, got shape {h.shape}")
        if h.size == 0:
            return np.empty(0, dtype=np.int64)
        if h.dtype.kind not in "iu":
            raise DramPoolError(f"handles must be integers, got dtype {h.dtype}")
        h = h.astype(np.int64, copy=False)
        self._check_range(h)
        return h

    def _check_live(self, h: np.ndarray) -> None:
        self._check_open()
        if h.size and not self._allocated[h].all():
            bad = h[~self._allocated[h]]
            raise DramPoolError(f"slot {int(bad[0])} is not allocated")

    def _rows(self, a: np.ndarray, k: int, name: str) -> np.ndarray:
        if not isinstance(a, np.ndarray):
            raise DramPoolError(f"{name} must be a numpy array, got {type(a).__name__}")
        if not a.flags.c_contiguous:
            raise DramPoolError(f"{name} must be C-contiguous")
        if a.nbytes != k * self._slot_bytes:
            raise DramPoolError(f"{name} holds {a.nbytes:,} bytes; {k} slot(s) need "
                                f"{k * self._slot_bytes:,}")
        if name == "out" and not a.flags.writeable:
            raise DramPoolError("out is read-only")
        return a.reshape(-1).view(np.uint8).reshape(k, self._slot_bytes)


def _cuda_ok(err) -> bool:
    """cudart calls return a cudaError_t enum (or int); 0 / cudaSuccess is success."""
    if isinstance(err, Exception):
        return False
    try:
        return int(getattr(err, "value", err)) == 0
    except (TypeError, ValueError):
        return False
