"""The README's code runs as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run(capsys):
    """The README's quick start (a vLLM engine with saria) and the index
    example of docs/index-api.md run as written."""
    index_doc = README.parent / "docs" / "index-api.md"
    blocks = [(README, code) for code in
              re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)]
    blocks += [(index_doc, code) for code in
               re.findall(r"```python\n(.*?)```", index_doc.read_text(), flags=re.S)]
    assert len(blocks) >= 2, "README or docs/index-api.md has no python example"
    for path, code in blocks:
        exec(compile(code, str(path), "exec"), {})
    out = capsys.readouterr().out
    assert "miss" in out and "DRAM[0:" in out
    assert re.search(r"(?m)^0\n288$", out), out  # the quick start: saria's hit on the second run


def test_ci_runs_the_readme_test_command():
    text = README.read_text()
    commands = re.findall(r"```bash\n(.*?)\n```", text, flags=re.S)
    ci = (README.parent / ".ci" / "run").read_text()
    assert len(commands) >= 2
    assert commands[1].strip() in ci
