"""Entry point of the ``saria`` command.

Each subcommand lives in its own module under ``saria.cli`` and exposes
``register(subparsers)``; errors a user can cause are printed as one line on
stderr with a non-zero exit, never as a traceback.
"""

from __future__ import annotations

import argparse
import sys

from saria.errors import SariaError

# Subcommand modules, in the order ``saria --help`` lists them.
_COMMANDS = (
    "saria.cli.replay_cmd",
    "saria.cli.sweep_cmd",
    "saria.cli.endurance_cmd",
    "saria.cli.traces_cmd",
    "saria.cli.bench_cmd",
    "saria.cli.serve_cmd",
    "saria.cli.fleet_key_cmd",
    "saria.cli.lmcache_cmd",
    "saria.cli.store_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="saria",
        description="Tiered KV cache for LLM serving: traces, index benchmark and tools.",
    )
    from saria import __version__

    parser.add_argument("--version", action="version", version=f"saria {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    import importlib

    for name in _COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv  # a subcommand that re-reads its flags (saria serve --config)
    try:
        return int(args.func(args) or 0)
    except SariaError as exc:
        print(f"saria: error: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"saria: error: {exc.filename or exc}: no such file", file=sys.stderr)
        return 2
    except OSError as exc:  # disk full, permissions, a vanished drive: one line, no traceback
        print(f"saria: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("saria: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
