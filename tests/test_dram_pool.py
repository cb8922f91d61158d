"""The DRAM tier's slot pool: allocation, zero-copy views, copies, threads, bad input."""

from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

from saria.tiers.dram import DramPool, DramPoolError, DramPoolFull

SLOT = 4096 + 512  # not a page multiple on purpose: rows must still be laid out exactly


@pytest.fixture
def pool():
    p = DramPool(16, SLOT, pin=False)
    yield p
    p.close()


def test_alloc_free_reuse(pool):
    assert pool.num_slots == 16 and pool.free_slots == 16 and pool.slot_bytes == SLOT
    a = pool.alloc(5)
    assert a.dtype == np.int64 and a.tolist() == [0, 1, 2, 3, 4]
    assert pool.free_slots == 11 and pool.used_slots == 5
    pool.free(a[[1, 3]])
    assert pool.free_slots == 13
    b = pool.alloc(2)  # LIFO: the slots just freed come back first
    assert sorted(b.tolist()) == [1, 3]
    rest = pool.alloc(pool.free_slots)
    assert sorted(np.concatenate([a[[0, 2, 4]], b, rest]).tolist()) == list(range(16))
    assert pool.free_slots == 0
    assert pool.alloc(0).size == 0


def test_full_pool_raises_or_returns_fewer(pool):
    pool.alloc(14)
    with pytest.raises(DramPoolFull, match="2 of 16 free"):
        pool.alloc(3)
    assert pool.free_slots == 2  # unchanged by the failed call
    got = pool.alloc(3, partial=True)
    assert got.size == 2 and pool.free_slots == 0
    assert pool.alloc(1, partial=True).size == 0


def test_double_free_and_unknown_handles_leave_pool_unchanged(pool):
    h = pool.alloc(4)
    pool.free(h[:2])
    state = (pool.free_slots, pool.is_allocated(np.arange(16)).copy())
    with pytest.raises(DramPoolError, match="not allocated"):
        pool.free(h[:1])  # double free
    with pytest.raises(DramPoolError, match="not allocated"):
        pool.free([h[2], h[0]])  # one good, one freed: nothing freed
    with pytest.raises(DramPoolError, match="more than once"):
        pool.free([h[2], h[2]])
    with pytest.raises(DramPoolError, match="out of range"):
        pool.free([16])
    with pytest.raises(DramPoolError, match="out of range"):
        pool.free([-1])
    with pytest.raises(DramPoolError, match="integers"):
        pool.free(np.array([1.0]))
    assert pool.free_slots == state[0]
    assert np.array_equal(pool.is_allocated(np.arange(16)), state[1])
    pool.free(h[2:])
    assert pool.free_slots == 16


def test_views_are_zero_copy(pool):
    h = pool.alloc(3)
    v = pool.view(h[1])
    assert v.shape == (SLOT,) and v.dtype == np.uint8
    assert np.shares_memory(v, pool.array)
    v[:] = 7
    v[:4] = [1, 2, 3, 4]
    out = np.zeros((3, SLOT), np.uint8)
    pool.gather(h, out)
    assert out[1, :4].tolist() == [1, 2, 3, 4] and (out[1, 4:] == 7).all()
    for i, w in zip(h.tolist(), pool.views(h)):
        assert np.shares_memory(w, pool.array)
        assert w.ctypes.data == pool.base_address + i * SLOT
    pool.views(h)[2][:] = 9
    pool.gather(h[2:], out[:1])
    assert (out[0] == 9).all()
    with pytest.raises(DramPoolError, match="not allocated"):
        pool.view(h[2] + 1)
    with pytest.raises(DramPoolError, match="out of range"):
        pool.view(99)


def test_scatter_gather_round_trip(pool):
    rng = np.random.default_rng(0)
    h = rng.permutation(pool.alloc(16))[:11]
    data = rng.integers(0, 256, size=(11, SLOT), dtype=np.uint8)
    pool.scatter(h, data)
    out = np.empty_like(data)
    assert pool.gather(h, out) is out
    assert np.array_equal(out, data)
    for i, hi in enumerate(h.tolist()):  # each slot holds its own row
        assert np.array_equal(pool.view(hi), data[i])
    # Any dtype / shape with the right byte count and C order.
    as_f32 = np.empty((11, SLOT // 4), np.float32)
    pool.gather(h, as_f32)
    assert np.array_equal(as_f32.view(np.uint8), data)
    with pytest.raises(DramPoolError, match="bytes"):
        pool.gather(h, np.empty((10, SLOT), np.uint8))
    with pytest.raises(DramPoolError, match="C-contiguous"):
        pool.scatter(h, np.asfortranarray(data))
    pool.free(h[:1])
    with pytest.raises(DramPoolError, match="not allocated"):
        pool.scatter(h, data)


def test_page_aligned_and_prefaulted():
    with DramPool(4, 8192, pin=False) as p:
        assert p.base_address % 4096 == 0 and p.prefaulted
        assert not p.pinned and p.pin_method is None
    with DramPool(4, 8192, pin=False, prefault=False) as p:
        assert not p.prefaulted
        h = p.alloc(4)
        p.scatter(h, np.ones((4, 8192), np.uint8))
        assert (p.array == 1).all()


def test_threads_alloc_scatter_gather_free():
    pool = DramPool(64, 1024, pin=False)
    errors: list[str] = []

    def worker(tid: int) -> None:
        rng = np.random.default_rng(tid)
        for it in range(200):
            k = int(rng.integers(1, 5))
            h = pool.alloc(k, partial=True)
            if h.size == 0:
                continue
            data = rng.integers(0, 256, size=(h.size, 1024), dtype=np.uint8)
            data[:, 0] = tid
            pool.scatter(h, data)
            out = np.empty_like(data)
            pool.gather(h, out)
            if not np.array_equal(out, data):
                errors.append(f"thread {tid} iteration {it}: bytes differ")
            pool.free(h)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert pool.free_slots == 64  # every slot came back exactly once
    assert sorted(pool.alloc(64).tolist()) == list(range(64))
    pool.close()


def test_pin_false_does_not_import_torch():
    import subprocess

    code = ("import sys; from saria.tiers.dram import DramPool; p = DramPool(2, 4096, pin=False);"
            "p.alloc(1); assert not p.pinned; assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_as_torch_shares_memory():
    torch = pytest.importorskip("torch", reason="torch is an optional dependency")
    with DramPool(4, 4096) as p:  # pin=None: pinned only with a CUDA device
        if torch.cuda.is_available():
            assert p.pinned
        else:
            assert not p.pinned
        t = p.as_torch()
        assert tuple(t.shape) == (4, 4096) and t.dtype == torch.uint8
        assert t.data_ptr() == p.base_address
        h = p.alloc(2)
        t[int(h[1])] = 42
        out = np.empty((1, 4096), np.uint8)
        p.gather(h[1:], out)
        assert (out == 42).all()
        if p.pinned:
            assert t.is_pinned()


def test_pin_true_without_cuda_is_a_clear_error():
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        with DramPool(2, 4096, pin=True) as p:
            assert p.pinned and p.pin_method in ("cudaHostRegister", "torch")
    else:
        with pytest.raises(DramPoolError, match="pin=True needs torch with a CUDA device"):
            DramPool(2, 4096, pin=True)


@pytest.mark.parametrize("args, match", [
    ((0, 4096), "num_slots must be at least 1"),
    ((-3, 4096), "num_slots must be at least 1"),
    ((4, 0), "slot_bytes must be at least 1"),
    ((4, -1), "slot_bytes must be at least 1"),
    ((2.5, 4096), "num_slots must be an integer"),
    ((4, "4KiB"), "slot_bytes must be an integer"),
    ((True, 4096), "num_slots must be an integer"),
])
def test_bad_arguments(args, match):
    with pytest.raises(DramPoolError, match=match):
        DramPool(*args, pin=False)


def test_bad_calls(pool):
    with pytest.raises(DramPoolError, match="k must be at least 0"):
        pool.alloc(-1)
    with pytest.raises(DramPoolError, match="pin must be"):
        DramPool(1, 1, pin="yes")
    with pytest.raises(DramPoolError, match="1-D"):
        pool.free(np.zeros((2, 2), np.int64))
    pool.close()
    with pytest.raises(DramPoolError, match="closed"):
        pool.alloc(1)
