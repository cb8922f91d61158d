"""Plots of replay results: the SSD-writes-versus-TTFT frontier of a sweep."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402

from saria.units import format_size  # noqa: E402


def pareto(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points not dominated in (x, y), both lower-is-better, sorted by x."""
    best, out = float("inf"), []
    for x, y in sorted(points):
        if y < best:
            out.append((x, y))
            best = y
    return out


def frontier_plot(rows: Sequence[dict], path: Path, *, title: str = "") -> Path:
    """One column per (arrivals, DRAM, SSDs, SSD size) setting; top row mean TTFT,
    bottom row P90 TTFT, against SSD bytes written; the Pareto frontier of
    each panel is drawn as a step line."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        key = (r["arrivals"], r["dram_bytes"], r["ssd_count"], r.get("ssd_bytes"))
        groups.setdefault(key, []).append(r)
    n = len(groups)
    fig, axes = plt.subplots(2, n, figsize=(5.2 * n, 8), squeeze=False)
    for col, ((arr, dram, ssds, size), rs) in enumerate(sorted(groups.items(), key=str)):
        for row, (key, label) in enumerate((("ttft_mean_s", "mean TTFT (s)"),
                                            ("ttft_p90_s", "P90 TTFT (s)"))):
            ax = axes[row][col]
            pts = []
            for r in rs:
                x, y = r["ssd_bytes_written"] / 1e12, r[key]
                pts.append((x, y))
                name = r["policy"] + (f" r={r['r']}" if r.get("r") is not None else "")
                ax.scatter([x], [y], s=28)
                ax.annotate(name, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
            front = pareto(pts)
            ax.step([p[0] for p in front], [p[1] for p in front], where="post", lw=1,
                    color="grey", alpha=0.7)
            ys = [p[1] for p in pts if p[1] > 0]
            if ys and max(ys) / min(ys) > 50:  # overload outliers: keep the rest readable
                ax.set_yscale("log")
            ax.set_xlabel("SSD bytes written (TB)")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
            if row == 0:
                drive = "" if size is None else f" x {format_size(size)}"
                ax.set_title(f"{arr}\nDRAM {format_size(dram)}, {ssds}{drive} SSD", fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
