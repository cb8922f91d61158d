"""Ground-truth the CPU KV-cache *in-block* layout of vLLM 0.32 (no engine needed).

Allocates a per-layer cache exactly as vLLM hands it to register_kv_caches,
[num_blocks, num_kv_heads, block_size, 2*head_size], writes known K/V through
the backend's own op (torch.ops._C.cpu_attn_reshape_and_cache, which
CPUAttentionBackendImpl.do_kv_cache_update calls after viewing the cache as
[nb, H, 2*N, C] and chunking dim 2 into key_cache/value_cache) and reports
where each (token t, channel c) of K and V lands inside one (block, head) page.
Usage: python experiments/vllm_probe/probe_layout.py
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import setup_env  # noqa: E402

setup_env()


def check(isa: str, dtype, N: int, H=2, C=64, nb=4):
    import torch
    from vllm import _custom_ops as ops

    kv = torch.zeros(nb, H, N, 2 * C, dtype=dtype)  # as registered
    kc, vc = kv.view(nb, H, 2 * N, C).chunk(2, dim=2)  # what the backend does
    T = N + 5  # fill block 2, and 5 tokens of block 3
    slots = torch.arange(2 * N, 2 * N + T, dtype=torch.int64)
    t = torch.arange(T)[:, None, None]
    h = torch.arange(H)[None, :, None]
    c = torch.arange(C)[None, None, :]
    code = (t * H + h) * C + c  # unique id per (t, h, c)
    # keep ids exactly representable: split into small ints via modulo for bf16
    key = (code % 251 + 1).to(dtype)
    value = -(code % 241 + 1).to(dtype)
    ops.cpu_attn_reshape_and_cache(key, value, kc, vc, slots, isa)
    page = kv[2].reshape(H, 2 * N * C)  # one (block, head) page = 2*N*C elements
    kexp = key[:N].permute(1, 0, 2)  # [H, N, C]
    vexp = value[:N].permute(1, 0, 2)
    layouts = {
        "K[C,N] then V[N,C]": (kexp.transpose(1, 2).reshape(H, -1), vexp.reshape(H, -1)),
        "K[N,C] then V[N,C]": (kexp.reshape(H, -1), vexp.reshape(H, -1)),
    }
    found = "unknown"
    for name, (kf, vf) in layouts.items():
        if torch.equal(page[:, : N * C], kf) and torch.equal(page[:, N * C :], vf):
            found = name
    untouched = kv[0].abs().sum().item() == 0 and kv[1].abs().sum().item() == 0
    print(f"isa={isa:5s} dtype={str(dtype):14s} block_size={N:3d}: per (block, head) page = {found}; "
          f"other blocks untouched={untouched}")


def main():
    import torch

    amx = torch.cpu._is_amx_tile_supported()
    print(f"AMX tile supported: {amx}; AVX512: {torch.cpu._is_avx512_supported()}")
    combos = [("vec", torch.float32), ("vec", torch.bfloat16), ("vec16", torch.float32)]
    if amx:
        combos.append(("amx", torch.bfloat16))
    for isa, dt in combos:
        for N in (32, 64, 128):
            try:
                check(isa, dt, N)
            except Exception as e:  # noqa: BLE001
                print(f"isa={isa} dtype={dt} N={N}: {type(e).__name__}: {e}")
    print("=> treat kv[block_id] (all heads, K and V) as an opaque page; copy whole blocks only.")


if __name__ == "__main__":
    main()
