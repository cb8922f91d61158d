"""Run vLLM's built-in ExampleConnector twice on the same prompt (CPU).

Shows: second generate() reports num_cached_tokens > 0 (loaded by the
connector; prefix caching is off) and the output tokens are identical.
Usage: python experiments/vllm_probe/probe_example_connector.py
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Timer, make_tiny_llama, setup_env  # noqa: E402

setup_env()


def main():
    tm = Timer()
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    tm.mark("import vllm")
    model_dir = make_tiny_llama()
    store = tempfile.mkdtemp(prefix="example_connector_")
    llm = LLM(
        model=model_dir,
        skip_tokenizer_init=True,
        dtype="float32",
        block_size=32,
        max_model_len=1024,
        enable_prefix_caching=False,
        kv_transfer_config=KVTransferConfig(
            kv_connector="ExampleConnector",
            kv_role="kv_both",
            kv_connector_extra_config={"shared_storage_path": store},
        ),
    )
    tm.mark("engine start")
    prompt = TokensPrompt(prompt_token_ids=[(i * 7 + 3) % 500 + 5 for i in range(150)])
    sp = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    outs = []
    for run in range(2):
        o = llm.generate([prompt], sp, use_tqdm=False)[0]
        tm.mark(f"generate run {run}")
        print(f"run {run}: num_cached_tokens={o.num_cached_tokens} tokens={list(o.outputs[0].token_ids)}")
        outs.append(list(o.outputs[0].token_ids))
    print("outputs identical:", outs[0] == outs[1])
    files = []
    for root, _, fs in os.walk(store):
        files += [os.path.relpath(os.path.join(root, f), store) for f in fs]
    print("files written by ExampleConnector:", sorted(files))
    import safetensors.torch

    t = safetensors.torch.load_file(os.path.join(store, files[0]))["kv_cache"]
    print("stored tensor shape/dtype:", tuple(t.shape), t.dtype)


if __name__ == "__main__":
    main()
