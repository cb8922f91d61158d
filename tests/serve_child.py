"""One engine on a ``saria serve``, in a process of its own.

    python serve_child.py MODEL ADDRESS NAME STEPS_JSON

ADDRESS is a ``saria serve`` address, or a JSON object: the connector's
whole ``kv_connector_extra_config`` (an in-process cache). STEPS_JSON is a
list of steps; each is {"prompt": [...]} (generate it and
print ``RESULT {"tokens": ..., "gaps": ..., "cached": n}``) or
{"wait": PATH} (block until the file exists: the parent's cue) or
{"breaker_closed": true} (block until the client's breaker closed: its probe
found the server). Leading steps set up the run: {"start_after": PATH}
imports vLLM, then starts the engine only once that file exists (the
parent's cue: the imports, most of a start, overlap what runs before);
{"late_stores": PATH} holds every store copy until that file exists (see
``vllm_harness.late_stores``); a later {"landed": true} blocks until every
held copy has run, so the next prompt's steps carry their acks to the
server (without it, a short prompt could end before the copies did, and
the acks with the engine).
"""

import json
import os
import sys
import time


def _leading(steps: list[dict], key: str):
    """The value of a leading step {key: value}, taken off `steps`; else None."""
    return steps.pop(0)[key] if steps and key in steps[0] else None


if __name__ == "__main__":
    model, address, name, steps = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import contextlib

    from vllm_harness import engine, generate, late_stores, start_on_cue, wait_for

    start_after = _leading(steps, "start_after")
    hold = _leading(steps, "late_stores")
    if start_after:
        start_on_cue(start_after)
    with (late_stores(until=hold) if hold else contextlib.nullcontext()) as landed, \
            engine(model, json.loads(address) if address.startswith("{") else
                   {"server": address, "engine_name": name, "server_timeout_s": 0.5}) as llm:
        print("READY", flush=True)
        for step in steps:
            if "wait" in step:
                wait_for(step["wait"])
                continue
            if "landed" in step:
                landed()
                continue
            if "breaker_closed" in step:  # the client's probe found the server again
                from vllm_harness import scheduler_connector

                client = scheduler_connector(llm)._scheduler.cache.client
                deadline = time.monotonic() + 60
                while client.breaker.is_open and time.monotonic() < deadline:
                    time.sleep(0.05)
                continue
            out, cached = generate(llm, step["prompt"])
            print("RESULT " + json.dumps({"tokens": out.tokens, "gaps": out.gaps,
                                          "cached": cached}), flush=True)
