"""Show that a package can make `kv_connector="<Name>"` work WITHOUT
kv_connector_module_path, via a `vllm.general_plugins` entry point.

A real package would declare in pyproject.toml:
    [project.entry-points."vllm.general_plugins"]
    saria = "saria.connector.vllm:register_vllm_plugin"
Here we fake an installed distribution: a temp dir on PYTHONPATH holding
probe_saria_plugin-0.0.dist-info/{METADATA,entry_points.txt}.
Usage: python experiments/vllm_probe/probe_plugin.py
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Timer, make_tiny_llama, setup_env  # noqa: E402

setup_env()


def fake_dist() -> str:
    d = tempfile.mkdtemp(prefix="fake_dist_")
    di = os.path.join(d, "probe_saria_plugin-0.0.dist-info")
    os.makedirs(di)
    with open(os.path.join(di, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: probe-saria-plugin\nVersion: 0.0\n")
    with open(os.path.join(di, "entry_points.txt"), "w") as f:
        f.write("[vllm.general_plugins]\nprobe_saria = probe_plugin_reg:register\n")
    return d


def main():
    import json

    tm = Timer()
    # 1) without the plugin: name-only lookup fails at config time
    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    try:
        KVConnectorFactory.get_connector_class(
            KVTransferConfig(kv_connector="ProbeConnector", kv_role="kv_both")
        )
    except ValueError as e:
        print("without plugin:", e)

    # 2) with the plugin: children inherit PYTHONPATH; this process needs sys.path too
    d = fake_dist()
    os.environ["PYTHONPATH"] = d + os.pathsep + os.environ["PYTHONPATH"]
    sys.path.insert(0, d)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    model_dir = make_tiny_llama()
    work = tempfile.mkdtemp(prefix="probe_plugin_")
    log = os.path.join(work, "calls.jsonl")
    llm = LLM(
        model=model_dir,
        skip_tokenizer_init=True,
        dtype="float32",
        block_size=32,
        max_model_len=512,
        enable_prefix_caching=False,
        kv_transfer_config=KVTransferConfig(
            kv_connector="ProbeConnector",  # no kv_connector_module_path
            kv_role="kv_both",
            kv_connector_extra_config={"log_path": log, "store_dir": os.path.join(work, "store")},
        ),
    )
    tm.mark("engine start")
    p = TokensPrompt(prompt_token_ids=list(range(5, 105)))
    sp = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    o1 = llm.generate([p], sp, use_tqdm=False)[0]
    o2 = llm.generate([p], sp, use_tqdm=False)[0]
    print("num_cached_tokens run1/run2:", o1.num_cached_tokens, o2.num_cached_tokens)
    roles = sorted({(r["pid"], r["role"]) for r in map(json.loads, open(log))})
    print("connector instances (pid, role):", roles)


if __name__ == "__main__":
    main()
