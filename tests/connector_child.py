"""One engine run in a fresh process, for the connector's multi-process tests.

    python connector_child.py MODEL SSD_DIR MP [JSON]

sends prompt A (or JSON's "prompt") twice and prints one JSON line:
{"out": [tokens, gaps], "cached": n, "again": [tokens, gaps], "again_cached": n}.
JSON may also set "dram_bytes", "coordinator", "expect_error" (then the
engine must fail to start; the line is {"error": message}) and "start_after"
(a path: vLLM is imported, the engine starts once the file exists -- the
parent's cue; the imports overlap what runs before). MP=1 runs vLLM's
default multi-process layout (scheduler and worker in two processes, sharing
only the metadata, the /dev/shm pool and the drive files).
"""

import json
import os
import sys

if __name__ == "__main__":
    model, ssd, mp = sys.argv[1], sys.argv[2], sys.argv[3]
    opts = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    os.environ["SARIA_TEST_VLLM_MP"] = mp
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from vllm_harness import engine, generate, prompts, start_on_cue

    if opts.get("start_after"):
        start_on_cue(opts["start_after"])

    a = opts.get("prompt") or prompts(0)[0]
    extra = {"dram_bytes": opts.get("dram_bytes", "4MB"), "ssd_dirs": [ssd], "ssd_bytes": "16MB",
             "admission": "full-duplicate", "hash_seed": "restart-test",
             "coordinator": opts.get("coordinator", "paced")}
    try:
        with engine(model, extra) as llm:
            out, cached = generate(llm, a)
            again, again_cached = generate(llm, a)
    except Exception as e:  # noqa: BLE001 -- reported to the parent
        if not opts.get("expect_error"):
            raise
        print("RESULT " + json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        sys.exit(0)
    print("RESULT " + json.dumps({"out": [out.tokens, out.gaps], "cached": cached,
                                  "again": [again.tokens, again.gaps],
                                  "again_cached": again_cached}), flush=True)
