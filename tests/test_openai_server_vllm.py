"""vLLM's OpenAI server started exactly as docs/getting-started.md says (the
command line is read from the page; only the model and the port are ours: a
random tiny Llama and a word-level tokenizer made here), then a two-turn chat:
the second turn's usage shows the first turn's blocks as ``cached_tokens``,
from saria (the docs' command turns vLLM's own prefix cache off)."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from saria.connector.tiny_model import engine_env, make_llama, make_word_tokenizer  # noqa: E402

pytestmark = pytest.mark.vllm
DOC = Path(__file__).resolve().parents[1] / "docs" / "getting-started.md"
WORDS = [f"w{i}" for i in range(400)]  # make_word_tokenizer's vocabulary


def docs_command() -> list[str]:
    """The OpenAI server command of the getting-started page, as argv."""
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    cmd = next(b for b in blocks if "vllm.entrypoints.openai.api_server" in b)
    return shlex.split(cmd.replace("\\\n", " "))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(port: int, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    """The tiny Llama with its tokenizer, made once: every server here loads it
    from the same path, and vLLM keys its torch.compile cache by the model's
    path, so the servers after the first load the compiled model (~20 s of
    compiling each, on 2 cores, saved). Each server still runs in its own
    process."""
    engine_env()
    path = make_llama(str(tmp_path_factory.mktemp("llama")), vocab=len(WORDS) + 3)
    make_word_tokenizer(path, len(WORDS))
    return path


def test_the_documented_openai_server_shows_saria_hits(tmp_path, model):
    argv = docs_command()
    assert argv[:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert "--enable-prompt-tokens-details" in argv and "--no-enable-prefix-caching" in argv
    argv[0] = sys.executable
    port = _free_port()
    argv[argv.index("--model") + 1] = model
    argv[argv.index("--port") + 1] = str(port)
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline, "the server did not come up"
                time.sleep(1)
        first = {"role": "user", "content": " ".join(WORDS[:300])}
        body = {"model": model, "max_tokens": 4, "temperature": 0, "messages": [first]}
        one = _post(port, body)
        reply = one["choices"][0]["message"]["content"] or "w1"
        body["messages"] = [first, {"role": "assistant", "content": reply},
                            {"role": "user", "content": " ".join(WORDS[300:360])}]
        two = _post(port, body)
        cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in (one, two)]
        # turn 1's full blocks (vLLM's CPU block size: 128 tokens), from saria: vLLM's own
        # prefix cache is off in the docs' command
        assert cached[0] == 0, cached
        assert 256 <= cached[1] <= one["usage"]["prompt_tokens"], (cached, one["usage"])
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_a_misspelt_setting_stops_the_documented_server_in_one_line(model):
    """Issue 43: a misspelt key in kv_connector_extra_config printed five
    tracebacks (each worker twice, the engine core twice, the front end).
    Now the engine stops on one saria line naming the key, logged once; the
    front end's own "see root cause above" is the only traceback, and no
    traceback runs through saria."""
    argv = docs_command()
    argv[0] = sys.executable
    argv[argv.index("--model") + 1] = model
    argv[argv.index("--port") + 1] = str(_free_port())
    i = argv.index("--kv-transfer-config")
    kv = json.loads(argv[i + 1])
    kv["kv_connector_extra_config"]["dram_bytez"] = "4GB"
    argv[i + 1] = json.dumps(kv)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=dict(os.environ))
    text = out.stdout + out.stderr
    assert out.returncode != 0, text[-3000:]
    ours = [ln for ln in text.splitlines() if "saria: bad setting" in ln]
    assert len(ours) == 1, text[-5000:]
    assert "dram_bytez" in ours[0] and "did you mean 'dram_bytes'" in ours[0]
    assert text.count("Traceback") <= 1, text[-5000:]
    assert not re.search(r'File ".*/saria/', text), text[-5000:]
