"""A grid of replays, run in parallel: policies x DRAM sizes x arrival models x
SSD counts x promotion shares x coordinator modes x SSD capacities.

Each grid point is one ``run_policy`` on the same loaded trace; points run in
worker processes (forked, so the trace is loaded once and shared
copy-on-write). Results come back as flat rows for CSV and plotting.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

from saria.sim.parallel import parallel_map
from saria.sim.presets import Preset
from saria.sim.replay import ReadPath, make_setup, run_policy
from saria.traces import Trace
from saria.traces.arrivals import ArrivalModel


@dataclass(frozen=True, slots=True)
class GridPoint:
    policy: str
    dram_bytes: float | None
    arrivals: str
    ssd_count: int | None
    r: float | None
    coordinator: str | None
    ssd_bytes: float | None = None  # per drive; None: the preset's


def expand_grid(policies: Sequence[str], drams: Sequence[float | None],
                arrivals: Sequence[str], ssd_counts: Sequence[int | None],
                rs: Sequence[float | None], coordinators: Sequence[str | None],
                ssd_sizes: Sequence[float | None] = (None,)) -> list[GridPoint]:
    """Every combination; r only varies for policies that promote (saria)."""
    out = []
    for pol, dram, arr, ssd, r, coord, size in itertools.product(
            policies, drams, arrivals, ssd_counts, rs, coordinators, ssd_sizes):
        if pol != "saria" and r != rs[0]:
            continue  # r is lazy promotion's knob: one run is enough elsewhere
        out.append(GridPoint(pol, dram, arr, ssd, r, coord, size))
    return out


# Set in the parent before forking workers; read by them.
_TRACE: Trace | None = None
_PRESET: Preset | None = None
_OPTS: dict = {}


def _run_point(p: GridPoint) -> dict:
    assert _TRACE is not None and _PRESET is not None
    preset = _PRESET if p.ssd_count is None else _PRESET.with_(ssd_count=p.ssd_count)
    rp = ReadPath(lookup=_OPTS["lookup"], promotion=_OPTS["promotion"],
                  coordinator=p.coordinator or _OPTS["coordinator"], r=p.r)
    setup = make_setup(p.policy, preset, read_path=rp, dram_bytes=p.dram_bytes,
                       ssd_bytes=p.ssd_bytes, trace_block_size=int(_TRACE.block_size))
    if p.policy == "saria" and p.coordinator is not None:
        setup = replace(setup, coordinator=p.coordinator)
    rep = run_policy(_TRACE, setup, ArrivalModel.from_spec(p.arrivals),
                     max_context=_OPTS["max_context"])
    row = {k: v for k, v in asdict(p).items()}
    row["ssd_count"] = preset.hardware.ssd_count
    row["dram_bytes"] = p.dram_bytes if p.dram_bytes is not None else preset.hardware.dram_bytes
    row["ssd_bytes"] = setup.ssd_bytes_per_drive
    row["coordinator"] = setup.coordinator
    row["promotion"] = setup.promotion.name
    row.update({k: v for k, v in rep.items() if not isinstance(v, (list, dict))})
    return row


def run_sweep(trace: Trace, preset: Preset, points: Sequence[GridPoint], *, jobs: int | None = None,
              lookup: str = "unified", promotion: str = "none", coordinator: str = "overlap",
              max_context: int | None = None,
              progress: Callable[[int], None] | None = None) -> list[dict]:
    """Runs every point; rows come back in grid order."""
    global _TRACE, _PRESET, _OPTS
    _TRACE, _PRESET = trace, preset
    _OPTS = dict(lookup=lookup, promotion=promotion, coordinator=coordinator,
                 max_context=max_context)
    return parallel_map(_run_point, points, jobs=jobs, progress=progress)
