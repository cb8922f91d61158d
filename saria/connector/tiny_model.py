"""Random-weight Llama checkpoints made on the spot, for tests and benchmarks.

Nothing is downloaded: the config is written by hand and the weights are
random (seeded), so vLLM loads the directory like any local model. Greedy
decoding of a random model is still deterministic, which is all the
connector's "same output with and without the cache" checks need.
"""

from __future__ import annotations

import os


def make_llama(path: str, *, layers: int = 2, hidden: int = 256, heads: int = 4,
               kv_heads: int = 2, head_dim: int = 64, intermediate: int = 512,
               vocab: int = 512, max_len: int = 4096, dtype: str = "float32",
               seed: int = 0) -> str:
    """Writes the checkpoint into `path` (created) unless one is there; returns `path`.
    The CPU backend needs head_dim in {32, 64, 80, 96, 112, 128, 256}."""
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, head_dim=head_dim,
                      max_position_embeddings=max_len, bos_token_id=1, eos_token_id=2,
                      torch_dtype=dtype)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).to(getattr(torch, dtype))
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    return path


def engine_env() -> None:
    """Environment for a vLLM engine on this kind of machine: offline, a small
    CPU KV cache. Call before importing vLLM (child processes inherit it)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
