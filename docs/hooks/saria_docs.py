"""mkdocs hooks for saria's site.

* Files that live outside ``docs/`` (BENCHMARKS.md, CHANGELOG.md, the traces'
  and experiments' READMEs, the experiments' figures) join the site where they
  are in the repository, so pages link them by their repository paths and a
  ``--strict`` build checks those links too.
* ``<!-- connector-keys -->`` becomes the table of every vLLM connector key,
  generated from ``saria.connector.config`` (its ``KEYS`` and the table in its
  docstring), so the page cannot fall behind the code.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
OUTSIDE = ("BENCHMARKS.md", "CHANGELOG.md", "traces/README.md", "experiments/README.md")


def on_files(files, config):
    paths = [ROOT / p for p in OUTSIDE] + sorted((ROOT / "experiments" / "figures").glob("*.png"))
    for p in paths:
        if p.exists():
            files.append(File(str(p.relative_to(ROOT)), str(ROOT), config["site_dir"],
                              config["use_directory_urls"]))
    return files


def on_page_markdown(markdown, page, config, files):
    if "<!-- connector-keys -->" in markdown:
        markdown = markdown.replace("<!-- connector-keys -->", connector_keys_table())
    return markdown


def connector_keys_table() -> str:
    import sys

    sys.path.insert(0, str(ROOT))  # this checkout's saria, whichever mkdocs runs
    from saria.connector.config import KEYS, key_docs

    docs = key_docs()
    rows = ["| key | meaning (default) |", "|---|---|"]
    for key in KEYS:
        rows.append(f"| `{key}` | {docs[key]} |")
    return "\n".join(rows)
