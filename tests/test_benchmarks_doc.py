"""Every figure the README and the docs quote is in BENCHMARKS.md.

A *figure* is a number written with a unit of measure in README.md or docs/*.md, outside code
(fenced blocks and `inline code`): seconds (s, ms, µs/us), rates (GB/s, MB/s, calls/s), bytes
(TB, GB, MB, KB, GiB, MiB, KiB, B), percentages, days (d, days), ratios with the x or × attached
(0.41x) and millions of visits (5.45 M visits). Both ends of a range (0.91-1.03, 53-76%) are
figures; signs and "~" are dropped, and so are thousands separators. Zero is not a figure.

A figure is in BENCHMARKS.md when BENCHMARKS.md writes a number with the same unit (us = µs,
× = x, days = d) that rounds to it at the figure's own precision: the docs may say 1,088 s for
BENCHMARKS.md's 1,087.88 s, not 1,089 s. A ratio (x) may also be a bold number there, as its
ratio tables write their medians (**0.41**).

What is not a measurement is listed below by its exact text, with the reason: the settings a
page documents (a default, a quota, a preset's size) and the SARIA paper's own figures. A quoted
figure whose source this repository does not hold is listed in UNSOURCED, so it stays visible.
"""

from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "BENCHMARKS.md"

_NUM = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
_UNITS = r"GB/s|MB/s|GiB/s|calls/s|ms|µs|us|s|TB|GB|MB|KB|GiB|MiB|KiB|B|%|days|d|M visits"
# a number, an optional range end, then a unit (spaced or not), or an attached x / ×
FIGURE = re.compile(
    rf"(?<![\w.,/])[~+-]?(?P<a>{_NUM})(?:-(?P<b>{_NUM}))?"
    rf"(?:\s?(?P<unit>{_UNITS})(?![\w/])|(?P<x>[x×])(?![\w]))")
_ALIAS = {"us": "µs", "days": "d", "×": "x"}

# Not measurements: (file, exact text of the figure) -> why.
NOT_MEASURED = {
    ("README.md", "57.1-58.9%"): "the SARIA paper's figure",
    ("README.md", "42.3-79.7%"): "the SARIA paper's figure",
    ("benchmarks.md", "57.1-58.9%"): "the SARIA paper's figure",
    ("benchmarks.md", "42.3-79.7%"): "the SARIA paper's figure",
    ("replay.md", "57.1-58.9%"): "the SARIA paper's figure",
    ("replay.md", "42.3-79.7%"): "the SARIA paper's figure",
    ("replay.md", "144 KiB"): "the preset's KV bytes per token",
    ("cluster.md", "50 ms"): "the tier's default deadline",
    ("cluster.md", "4 TB"): "the cluster preset's size",
    ("lmcache.md", "2 GiB"): "the adapter's default buffer",
    ("index-api.md", "~1.2 GB"): "an estimate from the measured bytes per block",
    ("security.md", "8 MB"): "the --max-frame default",
    ("security.md", "16 MB"): "the size of the test's frame",
    ("security.md", "120 s"): "the --max-lock-age default",
    ("security.md", "512 B"): "the --min-slot default",
    ("security.md", "256 MB"): "the --max-slot default",
    ("security.md", "2 s"): "the idle time a hello may end a session after",
}
# Quoted figures whose source this repository does not hold (reported, issue 43).
UNSOURCED = {
    ("replay.md", "44.5 s"): "saria's mean TTFT, Qwen3.5-9B with 16 GB of DRAM",
    ("replay.md", "21.5 GB"): "saria's state read there",
    ("replay.md", "30.1 GB"): "budget's state read there",
    ("replay.md", "66%"): "never read there",
    ("replay.md", "51%"): "never read there",
    ("security.md", "2.2 GB"): "RSS of a 16 MB frame on 84f5613",
}


def figures(text: str):
    """(value, decimals, unit, text) of every figure in text, outside code."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`]*`", "", text)
    for m in FIGURE.finditer(text):
        unit = _ALIAS.get(m["unit"] or m["x"], m["unit"] or m["x"])
        for num in (m["a"], m["b"]):
            if num:
                num = num.replace(",", "")
                decimals = len(num.split(".")[1]) if "." in num else 0
                yield Decimal(num), decimals, unit, m.group(0).strip()


def _bench_values():
    text = BENCHMARKS.read_text()
    by_unit: dict[str, set[Decimal]] = {}
    for value, _, unit, _ in figures(text):
        by_unit.setdefault(unit, set()).add(value)
    bold = {Decimal(n.replace(",", "")) for n in re.findall(rf"\*\*~?({_NUM})\*\*", text)}
    by_unit["x"] = by_unit.get("x", set()) | bold
    return by_unit


def _in(value: Decimal, decimals: int, values) -> bool:
    half = Decimal(5) / Decimal(10) ** (decimals + 1)
    return any(abs(v - value) <= half for v in values)


def missing_figures(pages=None):
    """Figures of the README and docs that BENCHMARKS.md does not hold: (file, text)."""
    pages = pages if pages is not None else [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    bench = _bench_values()
    missing = []
    for page in pages:
        name = page.name
        for value, decimals, unit, text in figures(page.read_text()):
            if value == 0 or (name, text) in NOT_MEASURED or (name, text) in UNSOURCED:
                continue
            if not _in(value, decimals, bench.get(unit, ())):
                missing.append((name, text))
    return missing


def test_every_figure_the_readme_and_docs_quote_is_in_benchmarks():
    assert missing_figures() == []


def test_a_changed_figure_fails(tmp_path):
    page = tmp_path / "README.md"
    page.write_text("saria writes 1.21 TB (**-75.7%** vs full duplicate), 13.72 s mean TTFT, "
                    "2.95x, 4,489 calls/s.\n")
    assert missing_figures([page]) == []
    page.write_text("saria writes 1.21 TB (**-75.9%** vs full duplicate), 13.75 s mean TTFT, "
                    "2.97x, 4,488 calls/s.\n")
    assert missing_figures([page]) == [("README.md", "-75.9%"), ("README.md", "13.75 s"),
                                       ("README.md", "2.97x"), ("README.md", "4,488 calls/s")]


def test_the_exemptions_are_still_quoted():
    pages = {p.name: p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]}
    for name, text in [*NOT_MEASURED, *UNSOURCED]:
        assert text in pages[name], (name, text)


def test_benchmarks_has_a_contents_whose_links_resolve():
    text = BENCHMARKS.read_text()
    assert "git log -p BENCHMARKS.md" in text.split("\n## ")[0]
    slugs = {re.sub(r"[^\w\- ]", "", h.lower()).strip().replace(" ", "-")
             for h in re.findall(r"(?m)^##+ (.+)$", text)}
    links = re.findall(r"\]\(#([^)]+)\)", text)
    assert links and all(link in slugs for link in links), set(links) - slugs
    assert "## saria serve stopped under a running engine" in text
