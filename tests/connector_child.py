"""One engine run in a fresh process, for tests/test_connector_restart.py.

    python connector_child.py MODEL SSD_DIR MP
prints one JSON line for prompt A, sent twice: {"out": [tokens, gaps], "cached": n,
"again": [tokens, gaps], "again_cached": n}.
MP=1 runs vLLM's default multi-process layout (scheduler and worker in two
processes, sharing only the metadata and the /dev/shm pool).
"""

import json
import os
import sys

if __name__ == "__main__":
    model, ssd, mp = sys.argv[1], sys.argv[2], sys.argv[3]
    os.environ["SARIA_TEST_VLLM_MP"] = mp
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from vllm_harness import engine, generate, prompts

    a, _ = prompts(0)
    extra = {"dram_bytes": "4MB", "ssd_dirs": [ssd], "ssd_bytes": "16MB",
             "admission": "full-duplicate", "hash_seed": "restart-test"}
    with engine(model, extra) as llm:
        out, cached = generate(llm, a)
        again, again_cached = generate(llm, a)
    print("RESULT " + json.dumps({"out": [out.tokens, out.gaps], "cached": cached,
                                  "again": [again.tokens, again.gaps],
                                  "again_cached": again_cached}), flush=True)
