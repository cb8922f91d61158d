"""``saria replay``: what each policy does to SSD writes and TTFT on a trace.

    saria replay [TRACE] [--policy NAME ...] [--preset NAME] [--dram SIZE] [--ssd SIZE]
                 [--block-size TOKENS] [--arrivals SPEC] [--sessions N] [--json PATH] ...

With no arguments: the default slice of the bundled WEKA bundle -- its first
90 sessions (one GPU's share when the 710 sessions are spread over a DGX
H100's 8 GPUs), starting uniformly at random in a 12-hour window -- on the
default preset (Qwen3-8B, H100, PCIe Gen5, one Gen4 NVMe, 256 GB DRAM), under
dram-only, full-duplicate, write-back, saria and budget. Under the table: the
policy to run on the drive replayed (``--ssd``, ``--drives``) and a warning
when the GPU queue saturated.
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from saria.cli import fleet_cmd
from saria.errors import ConfigError
from saria.policy import PROMOTIONS, make_admission
from saria.sim.engine import LOOKUPS
from saria.sim.parallel import available_cpus
from saria.sim.presets import DEFAULT_PRESET, get_preset
from saria.sim.replay import DEFAULT_POLICIES, ReadPath, make_setup, run_policies
from saria.sim.verdict import recommend, saturated
from saria.traces import BUNDLED, FORMATS, load_trace, resolve_trace
from saria.traces.arrivals import ArrivalModel
from saria.transfer import COORDINATOR_MODES
from saria.units import format_rate, format_size, parse_size

DEFAULT_SESSIONS = 90
DEFAULT_ARRIVALS = "window:12h"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("replay", help="replay a trace under cache policies",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("trace", nargs="?", default="weka",
                   help=f"trace path or bundled name ({', '.join(BUNDLED)}); default: weka")
    p.add_argument("--format", default="auto", choices=FORMATS, help="trace format")
    p.add_argument("--policy", action="append", default=None, metavar="NAME",
                   help="admission policy (repeatable): dram-only, full-duplicate, write-back, "
                   "saria, E2, E3, E5, R2, R4, E2+R2, hicache-selective, kvbm-filter, budget, "
                   "budget:<fraction> (of the preset's DWPD rating); "
                   f"default: {', '.join(DEFAULT_POLICIES)}")
    p.add_argument("--preset", default=DEFAULT_PRESET, help=f"MODEL/HARDWARE (default {DEFAULT_PRESET})")
    p.add_argument("--dram", default=None, metavar="SIZE", help="DRAM pool (e.g. 256GB, unlimited, 0)")
    p.add_argument("--ssd", default=None, metavar="SIZE",
                   help="SSD capacity per drive (e.g. 200GB, 3.84TB, unlimited, 0); lifetime and "
                   "write budget are computed for this drive (default: the preset's, 3.84TB)")
    p.add_argument("--drives", type=int, default=None, metavar="N",
                   help="SSD drives per GPU, writes spread over them (default: the preset's, 1)")
    p.add_argument("--block-size", type=int, default=None, metavar="TOKENS",
                   help="engine block size in tokens (default: the preset's, 64)")
    p.add_argument("--arrivals", default=None, metavar="SPEC",
                   help=f"session arrivals: window:12h, window:2h, poisson:30/h, trace; options "
                   f",seed=N ,max-idle=1h|none ,closed (default {DEFAULT_ARRIVALS}; "
                   "'trace' for Mooncake/Azure/Bailian)")
    p.add_argument("--sessions", type=int, default=None, metavar="N",
                   help=f"first N sessions of a WEKA bundle (default {DEFAULT_SESSIONS} for the "
                   "bundled one; 0 = all)")
    p.add_argument("--max-context", type=int, default=None, metavar="TOKENS",
                   help="skip requests longer than this (default: keep all)")
    p.add_argument("--lookup", choices=LOOKUPS, default="unified",
                   help="reload lookup for non-saria policies (default unified)")
    p.add_argument("--promotion", choices=PROMOTIONS, default="none",
                   help="promotion for non-saria policies (default none)")
    p.add_argument("--coordinator", choices=COORDINATOR_MODES, default="overlap",
                   help="coordinator for non-saria policies (default overlap)")
    p.add_argument("--r", type=float, default=None,
                   help="lazy promotion's DRAM share (default: B_dram/(B_dram+B_ssd))")
    p.add_argument("--mode", choices=("sim", "real"), default="sim",
                   help="sim: timing model (default); real: through the real DRAM pool and "
                   "O_DIRECT SSD store at a scaled-down block size, every load verified")
    p.add_argument("--real-block-bytes", default="64KiB", metavar="SIZE",
                   help="real mode: bytes per block (capacities scale with it; default 64KiB)")
    p.add_argument("--ssd-dir", type=Path, default=None, metavar="DIR",
                   help="real mode: directory for the SSD store, one subdirectory per policy, "
                   "kept afterwards (default: a temporary one, removed after each policy)")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="policies (or a fleet's routings) replayed side by side, one process each "
                   "(default: one per CPU; "
                   "1 = one after another in this process)")
    p.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the report as JSON")
    fleet_cmd.add_flags(p)
    p.add_argument("--csv", type=Path, default=None, metavar="PATH", help="write one CSV row per policy")
    p.set_defaults(func=run)


def parse_args_to_config(args: argparse.Namespace) -> dict:
    """Validates every flag before any work starts; returns the run config."""
    policies = args.policy or list(DEFAULT_POLICIES)
    for name in policies:
        make_admission(name)
    if len(set(policies)) != len(policies):
        raise ConfigError("--policy", "a policy is listed twice")
    preset = get_preset(args.preset)
    if args.block_size is not None:
        if args.block_size < 1:
            raise ConfigError("--block-size", f"must be a positive number of tokens, got {args.block_size}")
        preset = preset.with_(block_size=args.block_size)
    if args.drives is not None:
        if args.drives < 1:
            raise ConfigError("--drives", f"must be at least 1, got {args.drives}")
        preset = preset.with_(ssd_count=args.drives)
    dram = None if args.dram is None else parse_size(args.dram, name="--dram", allow_unlimited=True)
    ssd = None if args.ssd is None else parse_size(args.ssd, name="--ssd", allow_unlimited=True)
    block_bytes = preset.block_size * preset.model.kv_bytes_per_token
    for flag, size in (("--dram", dram), ("--ssd", ssd)):
        if size is not None and 0 < size < block_bytes:
            raise ConfigError(flag, f"{format_size(size)} is smaller than one block "
                              f"({format_size(block_bytes)} at {preset.block_size} tokens)")
    if args.sessions is not None and args.sessions < 0:
        raise ConfigError("--sessions", f"must not be negative, got {args.sessions}")
    if args.max_context is not None and args.max_context < 1:
        raise ConfigError("--max-context", f"must be positive, got {args.max_context}")
    if args.jobs is not None and args.jobs < 1:
        raise ConfigError("--jobs", f"must be at least 1, got {args.jobs}")
    if args.r is not None and not 0 <= args.r <= 1:
        raise ConfigError("--r", f"must be in [0, 1], got {args.r}")
    return dict(policies=policies, preset=preset, dram=dram, ssd=ssd)


def run(args: argparse.Namespace) -> int:
    if args.nodes is not None and args.policy is None:
        args.policy = ["saria"]
    cfg = parse_args_to_config(args)
    if args.mode == "real":
        return run_real_mode(args, cfg)
    if args.nodes is not None:
        fleet_cmd.fleet_spec(args, (args.routing or ["round-robin"])[0],
                             cfg["preset"].hardware)  # flags before work
    path, sessions = _trace_and_sessions(args, default_sessions=DEFAULT_SESSIONS)
    err = Console(stderr=True)
    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*cols, console=err, transient=True) as bar:
        task = bar.add_task(f"loading {path.name}", total=None)
        trace = load_trace(path, args.format, limit_sessions=sessions or None,
                           progress=lambda d, t: bar.update(task, completed=d, total=t))
        if trace.block_size is None:
            raise ConfigError("trace", f"{path}: has no block hash ids; replay needs prefix identity")
        spec = args.arrivals or (DEFAULT_ARRIVALS if trace.has_sessions else "trace")
        if args.nodes is not None:
            bar.stop()
            return fleet_cmd.run_fleet(args, cfg, trace, path, spec)
        arrivals = ArrivalModel.from_spec(spec)
        read_path = ReadPath(args.lookup, args.promotion, args.coordinator, args.r)
        names = cfg["policies"]
        setups = [make_setup(name, cfg["preset"], read_path=read_path, dram_bytes=cfg["dram"],
                             ssd_bytes=cfg["ssd"], trace_block_size=int(trace.block_size))
                  for name in names]
        jobs = min(args.jobs or available_cpus(), len(names))
        side = f" ({jobs} side by side)" if jobs > 1 else ""
        bar.update(task, description=f"replaying {', '.join(names)}{side}", completed=0,
                   total=trace.num_requests * len(names))
        reports = run_policies(trace, setups, arrivals, max_context=args.max_context, jobs=jobs,
                               progress=lambda d: bar.update(task, completed=d))
        results: dict[str, dict] = {}
        for name, setup, rep in zip(names, setups, reports):
            rep["read_path"] = {"lookup": setup.lookup, "promotion": setup.promotion.name,
                                "coordinator": setup.coordinator}
            results[name] = rep
    hw = cfg["preset"].hardware
    config = {
        "trace": str(path), "format": trace.format, "sessions": trace.num_sessions,
        "requests": trace.num_requests, "arrivals": spec,
        "preset": cfg["preset"].name, "block_size": cfg["preset"].block_size,
        "dram_bytes": _num(hw.dram_bytes if cfg["dram"] is None else cfg["dram"]),
        "ssd_bytes_per_drive": _num(hw.ssd_bytes if cfg["ssd"] is None else cfg["ssd"]),
        "ssd_count": hw.ssd_count, "dwpd": hw.dwpd, "endurance_years": hw.endurance_years,
        "max_context": args.max_context,
    }
    out = Console()
    if not out.is_terminal:  # a pipe or a file: wide enough for five policies side by side
        out = Console(width=max(out.width, 112))
    out.print(_table(results, config))
    for line in verdict_lines(results, config):
        out.print(line, highlight=False)
    if args.json is not None:
        args.json.write_bytes(orjson.dumps({"config": config, "policies": results},
                                           option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    if args.csv is not None:
        write_csv(args.csv, config, results)
    return 0


def run_real_mode(args: argparse.Namespace, cfg: dict) -> int:
    """``--mode real``: each policy through a fresh real cache on disk."""
    import shutil
    import tempfile

    from saria.sim.real import run_real

    block_bytes = int(parse_size(args.real_block_bytes, name="--real-block-bytes"))
    if block_bytes < 1:
        raise ConfigError("--real-block-bytes", "must be at least 1 byte")
    # Real bytes: a smaller default slice than the simulation's.
    path, sessions = _trace_and_sessions(args, default_sessions=4)
    base = args.ssd_dir or Path(tempfile.mkdtemp(prefix="saria-real-"))
    err = Console(stderr=True)
    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    results: dict[str, dict] = {}
    try:
        with Progress(*cols, console=err, transient=True) as bar:
            task = bar.add_task(f"loading {path.name}", total=None)
            trace = load_trace(path, args.format, limit_sessions=sessions or None)
            if trace.block_size is None:
                raise ConfigError("trace", f"{path}: has no block hash ids")
            spec = args.arrivals or (DEFAULT_ARRIVALS if trace.has_sessions else "trace")
            arrivals = ArrivalModel.from_spec(spec)
            for name in cfg["policies"]:
                bar.update(task, description=f"real replay {name}", completed=0,
                           total=trace.num_requests)
                d = base / name.replace("+", "_")
                try:
                    results[name] = run_real(
                        trace, name, cfg["preset"], arrivals, block_bytes=block_bytes, ssd_dir=d,
                        dram_bytes=cfg["dram"], ssd_bytes=cfg["ssd"],
                        max_context=args.max_context,
                        progress=lambda n: bar.update(task, completed=n))
                finally:
                    if args.ssd_dir is None:  # one policy's drive files at a time on disk
                        shutil.rmtree(d, ignore_errors=True)
    finally:
        if args.ssd_dir is None:
            shutil.rmtree(base, ignore_errors=True)
    t = Table(title=f"saria replay --mode real: {path.name}",
              caption=f"{trace.num_sessions} sessions, blocks of {format_size(block_bytes)}")
    t.add_column("")
    for name in results:
        t.add_column(name, justify="right")
    rows = (
        ("blocks loaded (verified)", lambda r: f"{r['blocks_verified']:,}"),
        ("mismatched blocks", lambda r: f"{r['mismatched_blocks']:,}"),
        ("SSD blocks written", lambda r: f"{r['ssd_write_blocks']:,}"),
        ("  simulated", lambda r: f"{r['sim_ssd_blocks_written']:,}"),
        ("SSD bytes written (store)", lambda r: _size(r["ssd_bytes_written_store"])),
        ("SSD bytes written (OS)", lambda r: _size(r["ssd_bytes_written_os"])),
        ("SSD payload (simulated)", lambda r: _size(r["ssd_bytes_written_sim_scaled"])),
        ("DRAM evictions / simulated", lambda r: f"{r['dram_evictions']:,} / {r['dram_evictions_sim']:,}"),
        ("hits per request = simulated", lambda r: "yes" if r["hits_equal_sim"] else "NO"),
        ("wall time", lambda r: f"{r['wall_s']:.1f} s"),
    )
    for label, cell in rows:
        t.add_row(label, *(cell(r) for r in results.values()))
    Console().print(t)
    if args.json is not None:
        args.json.write_bytes(orjson.dumps({"config": {"trace": str(path), "mode": "real",
                                                       "block_bytes": block_bytes,
                                                       "preset": cfg["preset"].name},
                                            "policies": results}, option=orjson.OPT_INDENT_2))
    bad = sum(r["mismatched_blocks"] for r in results.values())
    differ = [n for n, r in results.items() if not r["hits_equal_sim"]
              or r["ssd_write_blocks"] != r["sim_ssd_blocks_written"]
              or r["dram_evictions"] != r["dram_evictions_sim"]]
    if differ:  # the real tiers decided differently from the simulation: a bug
        Console(stderr=True).print(f"real tiers and simulation disagree for {', '.join(differ)}")
    return 1 if bad or differ else 0


def _trace_and_sessions(args: argparse.Namespace, default_sessions: int) -> tuple[Path, int | None]:
    """The trace path (a bundled name resolved) and how many sessions to load:
    the bundled WEKA bundle gets a default slice, anything else all of it."""
    path = resolve_trace(args.trace)
    sessions = args.sessions
    # resolve_trace changed the path only if "weka" named the bundled trace
    if sessions is None and args.trace == "weka" and path != Path(args.trace):
        sessions = default_sessions
    return path, sessions


def _size(x) -> str:
    return "-" if x is None else format_size(x)


def write_csv(path: Path, config: dict, results: dict[str, dict]) -> None:
    scalar = [k for k, v in next(iter(results.values())).items() if not isinstance(v, (list, dict))]
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["policy", "preset", "arrivals", *scalar])
        for name, rep in results.items():
            w.writerow([name, config["preset"], config["arrivals"], *(rep[k] for k in scalar)])


def _num(x: float) -> float | None:
    return None if math.isinf(x) else x


def _pct_or_dash(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


# Rows are metrics, columns policies: five policies fit a 100-column terminal.
_ROWS = (
    ("SSD written", lambda r: format_size(r["ssd_bytes_written"])),
    ("SSD write rate", lambda r: format_rate(r["ssd_write_rate_Bps"])),
    ("SSD read", lambda r: format_size(r["ssd_bytes_read"])),
    ("SSD writes never read", lambda r: _pct_or_dash(r["ssd_writes_never_read_fraction"])),
    ("state read (hybrid)", lambda r: "-" if not (r["state_bytes_read_dram"]
                                                  or r["state_bytes_read_ssd"])
     else f"{format_size(r['state_bytes_read_dram'])} DRAM, "
     f"{format_size(r['state_bytes_read_ssd'])} SSD"),
    ("hit ratio (tokens) ↑", lambda r: f"{r['hit_ratio_tokens']:.3f}"),
    ("  from GPU", lambda r: f"{r['gpu_hit_ratio_tokens']:.3f}"),
    ("  from DRAM", lambda r: f"{r['dram_hit_ratio_tokens']:.3f}"),
    ("  from SSD", lambda r: f"{r['ssd_hit_ratio_tokens']:.3f}"),
    ("DRAM evictions", lambda r: f"{r['dram_evictions']:,}"),
    ("TTFT mean (sim.) ↓", lambda r: f"{r['ttft_mean_s']:.2f} s"),
    ("TTFT P50 ↓", lambda r: f"{r['ttft_p50_s']:.2f} s"),
    ("TTFT P90 ↓", lambda r: f"{r['ttft_p90_s']:.2f} s"),
    ("TTFT P99 ↓", lambda r: f"{r['ttft_p99_s']:.2f} s"),
    ("TTFT worst 25% mean ↓", lambda r: f"{r['ttft_worst25_mean_s']:.2f} s"),
    ("GPU queue wait mean ↓", lambda r: f"{r['gpu_queue']['wait_mean_s']:.2f} s"),
    ("SSD lifetime ↑", lambda r: "-" if r["ssd_lifetime_days"] is None
     else f"{r['ssd_lifetime_days']:,.0f} d"),
    ("write budget used/day ↓", lambda r: _pct_or_dash(r["write_budget_fraction"])),
)


# The core's cluster tier (a preset with remote_bytes): shown only then.
_CLUSTER_ROWS = (
    ("  from the cluster (more)", lambda r: f"{r['cluster_hit_ratio_tokens']:.3f}"),
    ("published to the cluster", lambda r: f"{r['cluster_published_blocks']:,} blocks"),
    ("SSD writes the cluster saved", lambda r: format_size(r["ssd_bytes_saved_cluster"])),
)


def _drive(config: dict) -> str:
    ssd = config["ssd_bytes_per_drive"]
    size = "unlimited" if ssd is None else format_size(ssd)
    return (f"SSD {config['ssd_count']} x {size} at {config['dwpd']:g} DWPD "
            f"over {config['endurance_years']:g} y")


def _hours(results: dict[str, dict]) -> str:
    return f"{max(r['duration_s'] for r in results.values()) / 3600:.1f} h"


def _table(results: dict[str, dict], config: dict) -> Table:
    t = Table(title=f"saria replay: {Path(config['trace']).name}", caption_justify="left",
              caption=f"{config['sessions']} sessions, {config['arrivals']}, {config['preset']}, "
              f"DRAM {format_size(config['dram_bytes'] or math.inf)}, {_drive(config)}.\n"
              f"Replayed {_hours(results)} of arrivals and service. "
              "TTFT is simulated (one GPU of the preset: queue + reload + prefill). "
              "↑ higher is better, ↓ lower. Write budget: the replay's mean write rate against "
              "the drives' daily rating (100% wears them out in exactly the rated years); "
              "lifetime at that rate.")
    t.add_column("", no_wrap=True)
    for name in results:
        t.add_column(name, justify="right")
    for label, cell in _ROWS:
        t.add_row(label, *(cell(r) for r in results.values()))
    if all("cluster_hit_ratio_tokens" in r for r in results.values()):  # a cluster preset
        for label, cell in _CLUSTER_ROWS:
            t.add_row(label, *(cell(r) for r in results.values()))
    return t


def verdict_lines(results: dict[str, dict], config: dict) -> list[str]:
    """The recommendation and the saturation warning printed under the table."""
    lines = []
    rec = recommend(results)
    if rec is None:
        lines.append(f"No policy replayed fits the drive's rating ({_drive(config)}): "
                     "add --policy budget, or a larger --ssd or more --drives.")
    else:
        line = (f"Recommended: {rec.policy} -- the best mean TTFT ({rec.ttft_mean_s:.2f} s) of the "
                f"policies within the drive's rating ({100 * rec.budget_fraction:.1f}% of it)")
        if rec.runner_up is not None:
            gain = 1 - rec.ttft_mean_s / rec.runner_up_ttft_s if rec.runner_up_ttft_s else 0.0
            line += f"; {100 * gain:.1f}% below {rec.runner_up} ({rec.runner_up_ttft_s:.2f} s)"
        if rec.faster is not None:
            life = ("" if rec.faster_lifetime_days is None
                    else f", the drive worn out in {rec.faster_lifetime_days:,.0f} days")
            line += (f". {rec.faster} is faster ({rec.faster_ttft_s:.2f} s) but uses "
                     f"{100 * rec.faster_budget:.0f}% of the rating{life}")
        lines.append(line + ".")
    hot = saturated(results)
    if hot:
        worst = max(results[n]["gpu_queue"]["busy_longest_s"] for n in hot)
        lines.append(f"Warning: the GPU queue saturated under {', '.join(hot)} (busy for up to "
                     f"{worst / 3600:.1f} h without draining, the wait still rising): arrivals "
                     "outran one GPU, so TTFT there measures the load more than the cache; "
                     "replay fewer --sessions or a longer --arrivals window for a sizing.")
    return lines
