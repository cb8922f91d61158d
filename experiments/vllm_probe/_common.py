"""Shared helpers for the vLLM probes: env setup + a tiny random Llama."""
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def setup_env() -> None:
    """Must run before `import vllm`. Child processes (engine core, worker)
    inherit os.environ, so PYTHONPATH makes the probe modules importable there."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    pp = os.environ.get("PYTHONPATH", "")
    if HERE not in pp.split(os.pathsep):
        os.environ["PYTHONPATH"] = HERE + (os.pathsep + pp if pp else "")
    if HERE not in sys.path:
        sys.path.insert(0, HERE)


def make_tiny_llama(dtype: str = "float32") -> str:
    """2 layers, hidden 256, 4 heads (head_dim 64), 2 KV heads, vocab 512."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    d = tempfile.mkdtemp(prefix="tiny_llama_")
    cfg = LlamaConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        torch_dtype=dtype,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(getattr(torch, dtype))
    model.save_pretrained(d)
    return d


class Timer:
    def __init__(self):
        self.t0 = time.perf_counter()
        self.marks = []

    def mark(self, name):
        t = time.perf_counter()
        self.marks.append((name, t - self.t0))
        print(f"[time] {name}: {t - self.t0:.1f}s", flush=True)
        self.t0 = t
