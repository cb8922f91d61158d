"""Shared plumbing of the experiment scripts (not an experiment itself).

Everything here goes through saria's public API: ``saria.traces`` (loading,
arrivals), ``saria.sim.replay`` / ``saria.sim.sweep`` (the replay),
``saria.sim.presets`` and ``saria.endurance``. Each script:

* takes ``--out DIR`` (default ``results/<script name>/`` under the current
  directory), ``--quick`` (a tiny slice, seconds: what the tests run) and
  ``--jobs N`` (worker processes, default 2: this machine has 2 cores);
* fails with one clear line on stderr and exit status 2 when its input trace or
  matplotlib is missing (``SARIA_TRACES_DIR`` pointing at an empty folder
  reproduces the first);
* writes CSV + PNG and prints where.
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

#: Mooncake's conversation trace is a whole cluster's traffic (12,031 requests in
#: an hour, 145 M input tokens): on one simulated GPU it only measures a queue.
#: The experiments replay one GPU's share of 8 under prefix-affinity routing:
#: a request goes to GPU hash(third block id) mod 8, i.e. it follows its first
#: 1,536 tokens, as a prefix-aware router would keep a conversation on one GPU.
MOONCAKE_GPUS = 8
MOONCAKE_ROUTE_BLOCK = 2
MODELS = {"qwen3-8b": "qwen3-8b/h100-gen5-1ssd", "qwen3.5-9b": "qwen3.5-9b/h100-gen5-1ssd"}
WEKA_SESSIONS = 90          # the replay CLI's default slice: one GPU's share of 710 sessions
WEKA_ARRIVALS = "window:12h"
GB = 1e9
TB = 1e12


def fail(message: str, code: int = 2) -> None:
    """One line on stderr, then exit non-zero."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def require_saria():
    try:
        import saria  # noqa: F401
    except ImportError as e:  # pragma: no cover - the venv has it
        fail(f"the saria package is not importable ({e}); run `pip install -e .` first")


def require_matplotlib():
    """pyplot with the file-only backend, or a clear exit."""
    try:
        import matplotlib
    except ImportError:
        fail("matplotlib is missing: `pip install 'matplotlib>=3.8,<4'` (a saria dependency)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def parser(name: str, doc: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"{name}.py", description=doc.strip().split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("results") / name,
                   help=f"results folder (default results/{name}/)")
    p.add_argument("--quick", action="store_true",
                   help="a tiny slice (seconds): for tests and smoke runs, not for conclusions")
    p.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    return p


def start(args: argparse.Namespace) -> tuple[float, object]:
    """Checks dependencies and the output folder; returns (t0, pyplot)."""
    require_saria()
    plt = require_matplotlib()
    if args.jobs < 1:
        fail(f"--jobs must be at least 1, got {args.jobs}")
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        fail(f"cannot create the results folder {args.out}: {e.strerror}")
    return time.perf_counter(), plt


def save_figure(fig, title: str, path: Path, dpi: int = 80) -> Path:
    """Titles, lays out, writes and closes a figure; returns its path."""
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


# ------------------------------------------------------------------ traces

def load_weka(sessions: int):
    """The first `sessions` sessions of the bundled WEKA bundle."""
    from saria.errors import SariaError
    from saria.traces import bundled_trace, load_trace
    try:
        return load_trace(bundled_trace("weka"), limit_sessions=sessions)
    except SariaError as e:
        fail(f"WEKA trace unavailable: {e} (see traces/README.md)")


def load_mooncake_share(limit: int | None = None, gpus: int = MOONCAKE_GPUS, gpu: int = 0):
    """GPU `gpu`'s share of the bundled Mooncake conversation trace under
    prefix-affinity routing (see MOONCAKE_GPUS); `limit` keeps its first requests."""
    from saria.errors import SariaError
    from saria.traces import Trace, TraceSession, bundled_trace, load_trace
    try:
        tr = load_trace(bundled_trace("mooncake"))
    except SariaError as e:
        fail(f"Mooncake trace unavailable: {e} (see traces/README.md)")

    def route(r) -> int:
        ids = r.hash_ids
        x = int(ids[min(MOONCAKE_ROUTE_BLOCK, len(ids) - 1)]) if len(ids) else 0
        return (x * 2654435761 % (1 << 32)) % gpus

    reqs = [r for r in tr.requests() if route(r) == gpu]
    if limit is not None:
        reqs = reqs[:limit]
    sess = TraceSession(f"gpu{gpu}of{gpus}", tr.sessions[0].namespace, reqs)
    return Trace(f"{tr.name}[gpu {gpu}/{gpus}]", tr.path, tr.format, tr.block_size,
                 tr.partial_last_block, False, [sess])


def preset(model: str, **changes):
    from saria.sim.presets import get_preset
    p = get_preset(MODELS.get(model, model))
    return p.with_(**changes) if changes else p


# ------------------------------------------------------------------ running

def sweep(trace_obj, preset_obj, policies: Sequence[str], *, drams=(None,), arrivals=("window:12h",),
          ssd_counts=(None,), coordinators=(None,), jobs: int = 2, **extra) -> list[dict]:
    """saria.sim.sweep over a grid, each row tagged with `extra` columns."""
    from saria.sim.sweep import expand_grid, run_sweep
    points = expand_grid(list(policies), list(drams), list(arrivals), list(ssd_counts), [None],
                         list(coordinators))
    t0 = time.perf_counter()

    def progress(done: int) -> None:
        print(f"  {done}/{len(points)} replays ({time.perf_counter() - t0:.0f} s)", file=sys.stderr,
              flush=True)

    rows = run_sweep(trace_obj, preset_obj, points, jobs=jobs, progress=progress)
    for r in rows:
        r.update(extra)
        r["preset"] = preset_obj.name
    return rows


# Set before forking; read by the workers of run_many.
_TRACES: dict = {}


def run_one(job: tuple) -> dict:
    """One (tags, trace_key, policy, preset, ReadPath, make_setup kwargs,
    arrivals spec) job in this process; its report row."""
    from saria.sim.replay import make_setup, run_policy
    from saria.traces.arrivals import ArrivalModel
    tags, trace_key, policy, preset_obj, read_path, kwargs, arrivals = job
    trace = _TRACES[trace_key]
    setup = make_setup(policy, preset_obj, read_path=read_path,
                       trace_block_size=int(trace.block_size), **kwargs)
    rep = run_policy(trace, setup, ArrivalModel.from_spec(arrivals))
    row = dict(tags)
    row.update({k: v for k, v in rep.items() if not isinstance(v, (list, dict))})
    row.update(lookup=setup.lookup, promotion=setup.promotion.name,
               coordinator=setup.coordinator, keep_history=setup.keep_history,
               ssd_count=preset_obj.hardware.ssd_count, preset=preset_obj.name,
               arrivals=arrivals)
    return row


def run_many(traces: dict, jobs_list: list, jobs: int, fn=None) -> list[dict]:
    """Runs (tags, trace_key, policy, preset, ReadPath, make_setup kwargs,
    arrivals spec) jobs in forked workers (through `fn`, default
    ``run_one``); rows in input order."""
    from saria.sim.parallel import parallel_map
    global _TRACES
    _TRACES = traces
    return parallel_map(fn or run_one, jobs_list, jobs=jobs)


# ------------------------------------------------------------------ output

def write_csv(path: Path, rows: Iterable[dict], columns: Sequence[str]) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for r in rows:
            w.writerow([_cell(r.get(c)) for c in columns])
    return path


def _cell(v):
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isinf(v) or math.isnan(v):
            return ""
        return f"{v:.6g}"
    return v


def pct_change(new: float, base: float) -> float | None:
    """(new - base) / base in percent; None when base is 0."""
    return None if not base else 100.0 * (new - base) / base


def done(t0: float, paths: Sequence[Path]) -> None:
    print(f"wrote {', '.join(str(p) for p in paths)} in {time.perf_counter() - t0:.1f} s")


def label(policy: str) -> str:
    return {"hicache-selective": "HiCache", "kvbm-filter": "KVBM", "full-duplicate": "full-dup",
            "dram-only": "DRAM-only", "write-back": "write-back"}.get(policy, policy)
