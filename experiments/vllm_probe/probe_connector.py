"""Probe vLLM 0.32 (CPU) KV-connector call sequence with a logging connector.

Tiny random Llama (2 layers, hidden 256, 4 heads x 64, 2 KV heads, vocab 512),
block_size 32, prefix caching OFF, ProbeConnector (probe_kv_connector.py)
loaded via kv_connector_module_path. Prompts A and B share a 160-token prefix.

  1. A               -> stores A's 6 full blocks
  2. B (bypass)      -> baseline output, connector neither loads nor stores
  3. B               -> loads 5 shared blocks (num_cached_tokens == 160)
  4. B + cache_salt  -> different block hashes -> no hit
Prints every connector call (pid/role/method/args) and the timing.
Usage: python experiments/vllm_probe/probe_connector.py [--full-log]
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Timer, make_tiny_llama, setup_env  # noqa: E402

setup_env()

BS = 32


def short(v, n=160):
    s = json.dumps(v, default=str)
    return s if len(s) <= n else s[: n - 3] + "..."


def summarize(rec):
    m = rec["method"]
    skip = {"t", "pid", "thread", "role", "method"}
    keys = [k for k in rec if k not in skip]
    if m == "register_kv_caches":
        kv = rec["kv_caches"]
        return "; ".join(
            f"{n}: shape={v['shape']} dtype={v['dtype']} stride={v['stride']} contig={v['contiguous']} "
            f"storage_bytes={v['untyped_storage_nbytes']} storage_ptr={v['storage_data_ptr']}"
            for n, v in kv.items()
        )
    if m == "save_kv_layer":
        return (
            f"step={rec['step']} layer={rec['layer_name']} kv_layer={rec['kv_layer']['shape']} "
            f"registered={rec['kv_layer']['is_registered_tensor']} meta={rec['attn_metadata_type']} "
            f"num_actual_tokens={rec['num_actual_tokens']} slot_mapping={short(rec['slot_mapping'], 120)} "
            f"seq_lens={short(rec['seq_lens'], 60)} block_table={short(rec['block_table'], 100)}"
        )
    if m == "start_load_kv":
        return (
            f"step={rec['step']} attn_metadata={rec['attn_metadata_type']} keys={rec['attn_metadata_keys']} "
            f"loads={short(rec['loads'], 200)}"
        )
    return " ".join(f"{k}={short(rec[k])}" for k in keys)


def main():
    full = "--full-log" in sys.argv
    tm = Timer()
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    tm.mark("import vllm")
    model_dir = make_tiny_llama()
    work = tempfile.mkdtemp(prefix="probe_connector_")
    log_path = os.path.join(work, "calls.jsonl")
    llm = LLM(
        model=model_dir,
        skip_tokenizer_init=True,
        dtype="float32",
        block_size=BS,
        max_model_len=1024,
        enable_prefix_caching=False,
        kv_transfer_config=KVTransferConfig(
            kv_connector="ProbeConnector",
            kv_connector_module_path="probe_kv_connector",
            kv_role="kv_both",
            kv_connector_extra_config={"log_path": log_path, "store_dir": os.path.join(work, "store")},
        ),
    )
    tm.mark("engine start (LLM())")

    prefix = [(i * 7 + 3) % 500 + 5 for i in range(160)]
    A = prefix + [(i * 11 + 1) % 500 + 5 for i in range(40)]
    B = prefix + [(i * 13 + 2) % 500 + 5 for i in range(40)]
    sp = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    sp_bypass = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, extra_args={"probe_bypass": True})

    def gen(label, toks, params, **kw):
        with open(log_path, "a") as f:
            f.write(json.dumps({"marker": label}) + "\n")
        o = llm.generate([TokensPrompt(prompt_token_ids=toks, **kw)], params, use_tqdm=False)[0]
        tm.mark(f"generate {label}")
        print(f"  {label}: num_cached_tokens={o.num_cached_tokens} tokens={list(o.outputs[0].token_ids)}")
        return o

    a = gen("1:A", A, sp)
    b0 = gen("2:B-bypass", B, sp_bypass)
    b1 = gen("3:B", B, sp)
    b2 = gen("4:B+salt", B, sp, cache_salt="tenant-x")
    same = list(b0.outputs[0].token_ids) == list(b1.outputs[0].token_ids)
    print(f"B loaded-from-connector output == recomputed output: {same}")
    assert b1.num_cached_tokens == 160 and b2.num_cached_tokens == 0 and same
    del llm  # triggers shutdown

    # Independently recompute vLLM's block hash (sha256 over pickle, chained).
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import hash_block_tokens, init_none_hash

    init_none_hash(sha256)
    recs = [json.loads(line) for line in open(log_path)]
    firsts = [r["first_block_hash"] for r in recs if r.get("method") == "on_new_request"]
    h_plain = hash_block_tokens(sha256, None, A[:BS], None).hex()
    h_salt = hash_block_tokens(sha256, None, B[:BS], (("cache_salt", "tenant-x"),)).hex()
    print(f"recomputed first-block hash matches engine: plain={h_plain == firsts[0]} salted={h_salt == firsts[3]}")

    print(f"\n=== connector call sequence (main pid={os.getpid()}; log {log_path}) ===")
    # Collapse plain decode steps (1 token, nothing to load/store) after the first one.
    boring, seen_decode = set(), False
    for r in recs:
        if "marker" in r:
            seen_decode = False
        elif r["method"] == "build_connector_meta":
            plain = (r["total_num_scheduled_tokens"] == 1 and not r["scheduled_new_reqs"]
                     and not r["meta_loads"] and not r["meta_stores"])
            if plain and seen_decode:
                boring.add(r["step"])
            seen_decode = seen_decode or plain
    elided = 0
    for rec in recs:
        if "marker" in rec:
            if elided:
                print(f"    ... {elided} more records of plain decode steps elided")
                elided = 0
            print(f"--- generate {rec['marker']} ---")
            continue
        if rec["method"] == "wait_for_layer_load" and not full:
            continue  # one per layer per step, right before that layer's save_kv_layer
        if rec.get("step") in boring and not full:
            elided += 1
            continue
        print(f"[pid {rec['pid']} {rec['role']:9s} {rec['thread']}] {rec['method']}: {summarize(rec)}")
    if not full:
        print("\n(wait_for_layer_load lines and repeated decode steps hidden; use --full-log)")
    print("timings:", [(n, round(s, 2)) for n, s in tm.marks])


if __name__ == "__main__":
    main()
