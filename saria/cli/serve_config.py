"""``saria serve --config FILE``: the flags, written down.

The file is TOML with the flags' own names as keys (``ssd-dir`` or
``ssd_dir``; a flag that repeats takes a list)::

    dram = "64GB"
    ssd-dir = ["/mnt/nvme0/saria", "/mnt/nvme1/saria"]
    ssd-bytes = "2TB"
    admission = "budget"
    metrics-port = 9400

A flag given on the command line overrides the file's key (a repeated flag
replaces the file's whole list). An unknown key is one line naming the file
and the key, with the nearest valid key.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from saria.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover -- Python 3.10
    import tomli as tomllib


def load(path: str | Path) -> dict:
    """The file's table; one-line errors for a missing or malformed file."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError("--config", f"{p}: no such file") from None
    except OSError as e:
        raise ConfigError("--config", f"{p}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("--config", f"{p}: not valid TOML: {e}") from None
    return data


def parse(parser: argparse.ArgumentParser, argv: list[str], config: dict,
          source: str) -> argparse.Namespace:
    """`argv` parsed by `parser` over the file's values (the flags win)."""
    actions = {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}
    names = {}
    for a in actions.values():
        for opt in a.option_strings:
            if opt.startswith("--"):
                names[opt[2:]] = a
                names[opt[2:].replace("-", "_")] = a
    preset = {}
    for key, value in config.items():
        action = names.get(key)
        if action is None or action.dest == "config":
            flags = sorted({n for n in names if "_" not in n} - {"config"})
            close = difflib.get_close_matches(key.replace("_", "-"), flags, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{source}: {key}", f"unknown key{hint}")
        preset[action.dest] = _value(action, value, f"{source}: {key}")
    given = {a.dest for a in actions.values()
             if any(tok == o or tok.startswith(o + "=") for tok in argv for o in a.option_strings)}
    for dest in given:  # a flag on the command line replaces the file's value (lists too)
        preset.pop(dest, None)
    return parser.parse_args(argv, namespace=argparse.Namespace(**preset))


def _value(action: argparse.Action, value, where: str):
    """A TOML value as the flag's parser would have made it from text."""
    if isinstance(action, argparse._AppendAction):
        items = value if isinstance(value, list) else [value]
        return [_scalar(action, v, where) for v in items]
    if isinstance(value, (list, dict)):
        raise ConfigError(where, f"expected one value, got {type(value).__name__}")
    return _scalar(action, value, where)


def _scalar(action: argparse.Action, value, where: str):
    if isinstance(value, (list, dict)) or isinstance(value, bool):
        raise ConfigError(where, f"expected a number or a string, got {value!r}")
    if action.type is None:
        return str(value)
    try:
        return action.type(value if isinstance(value, str) else str(value))
    except (TypeError, ValueError):
        raise ConfigError(where, f"bad value {value!r}") from None
