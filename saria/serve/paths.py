"""Where ``saria serve`` listens by default (kept free of heavy imports: the
CLI reads it to print its help)."""

from __future__ import annotations

import os


def default_runtime_dir() -> str:
    """``$XDG_RUNTIME_DIR/saria`` (a per-user tmpfs on systemd hosts), else a
    per-user folder under /tmp."""
    base = os.environ.get("XDG_RUNTIME_DIR") or os.path.join("/tmp", f"saria-{os.getuid()}")
    return os.path.join(base, "saria")


def default_listen() -> str:
    return "ipc://" + os.path.join(default_runtime_dir(), "serve.sock")
