"""``saria fleet-key``: a new fleet key for the cluster tier's signed rows.

    saria fleet-key --out /etc/saria/fleet.key       # mode 0600; copy it to every node
    saria fleet-key --id 2 >> /etc/saria/fleet.key   # a second key, for a rotation

Prints one ``ID:HEX`` line (32 bytes from the OS's CSPRNG); with ``--out``
it writes the file itself, created with mode 0600 and never over an
existing file. See ``saria.tiers.remote.fleetkey`` for rotation.
"""

from __future__ import annotations

import os
import sys


def register(sub) -> None:
    p = sub.add_parser("fleet-key", help="make a fleet key for the cluster tier's signed rows")
    p.add_argument("--id", type=int, default=1, help="the key's id (1..2**32-1; default 1)")
    p.add_argument("--out", default=None, help="write a new file (mode 0600) instead of stdout")
    p.set_defaults(func=_run)


def _run(args) -> int:
    from saria.errors import ConfigError
    from saria.tiers.remote.fleetkey import MAX_ID, generate

    if not 0 < args.id <= MAX_ID:
        raise ConfigError("--id", f"must be in 1..{MAX_ID}, got {args.id}")
    line = generate(args.id) + "\n"
    if args.out is None:
        sys.stdout.write(line)
        return 0
    try:
        fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigError("--out", f"{args.out} exists; add keys to it by hand") from None
    with os.fdopen(fd, "w") as f:
        f.write(line)
    return 0
