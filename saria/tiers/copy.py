"""Row copies by index between byte arrays, in native code.

``copy_rows(dst, dst_idx, src, src_idx)`` copies ``src[src_idx[i]]`` to
``dst[dst_idx[i]]`` with one ``memcpy`` per row and the GIL released. Rows
may be strided (a layer's page inside a DRAM slot, a KV block of one layer),
bytes inside a row must be contiguous. It serves the DRAM pool's gather and
scatter and the vLLM worker's page copies: numpy's fancy indexing reached
only 0.61-0.78 of ``np.copyto`` for 1 MiB rows on some CPUs of this kind,
torch's ``index_select`` copies twice; this reaches memcpy speed (``saria
bench io``). Every argument is checked here, so the native loop never sees
an index out of range.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from saria import _native

__all__ = ["copy_rows", "byte_rows"]


def byte_rows(a: Any, name: str = "array") -> tuple[int, int, int, int]:
    """(address, rows, row stride in bytes, row bytes) of a 2-D numpy array or
    CPU torch tensor whose rows are contiguous bytes."""
    if isinstance(a, np.ndarray):
        if a.ndim != 2:
            raise ValueError(f"{name} must be 2-D, got {a.ndim}-D")
        if a.shape[1] and a.strides[1] != a.itemsize:
            raise ValueError(f"{name}: bytes within a row must be contiguous")
        return (a.__array_interface__["data"][0], a.shape[0], a.strides[0],
                a.shape[1] * a.itemsize)
    if hasattr(a, "data_ptr") and hasattr(a, "element_size"):  # a torch tensor
        if a.device.type != "cpu":
            raise ValueError(f"{name} must be in host memory, not on {a.device}")
        if a.dim() != 2:
            raise ValueError(f"{name} must be 2-D, got {a.dim()}-D")
        es = a.element_size()
        if a.shape[1] and a.stride(1) != 1:
            raise ValueError(f"{name}: bytes within a row must be contiguous")
        return a.data_ptr(), a.shape[0], a.stride(0) * es, a.shape[1] * es
    raise TypeError(f"{name} must be a numpy array or a torch tensor, not {type(a).__name__}")


def _index(idx: Any, rows: int, name: str) -> np.ndarray:
    arr = np.ascontiguousarray(idx, dtype=np.int64).reshape(-1)
    if arr.size and (arr.min() < 0 or arr.max() >= rows):
        raise IndexError(f"{name} holds an index outside [0, {rows})")
    return arr


def copy_rows(dst: Any, dst_idx: Any, src: Any, src_idx: Any = None) -> None:
    """``dst[dst_idx[i]] = src[src_idx[i]]`` for every i (an index of None
    means rows 0, 1, ...). Both arrays must have rows of the same length; the
    regions must not overlap."""
    d_addr, d_rows, d_stride, d_len = byte_rows(dst, "dst")
    s_addr, s_rows, s_stride, s_len = byte_rows(src, "src")
    if d_len != s_len:
        raise ValueError(f"rows differ in length: dst {d_len} B, src {s_len} B")
    none = np.zeros(0, np.int64)
    di = none if dst_idx is None else _index(dst_idx, d_rows, "dst_idx")
    si = none if src_idx is None else _index(src_idx, s_rows, "src_idx")
    n = di.size if dst_idx is not None else (si.size if src_idx is not None else d_rows)
    if dst_idx is not None and src_idx is not None and di.size != si.size:
        raise ValueError(f"{di.size} destination rows for {si.size} source rows")
    if dst_idx is None and n > d_rows:
        raise IndexError(f"{n} rows do not fit the {d_rows} of dst")
    if src_idx is None and n > s_rows:
        raise IndexError(f"{n} rows are more than the {s_rows} of src")
    if n and d_len:
        _native.copy_rows(d_addr, d_stride, di, s_addr, s_stride, si, n, d_len)
