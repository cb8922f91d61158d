"""LMCache as a peer: its own virtual environment, and one round of the
workload through ``lmcache_child.py`` in it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from saria.bench.io.config import LMCACHE_TORCH, LMCACHE_VERSION, BenchIoError, IoBenchConfig

CHILD = Path(__file__).with_name("lmcache_child.py")


def _venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _lmcache_version(py: Path) -> str | None:
    if not py.exists():
        return None
    p = subprocess.run([str(py), "-c", "import importlib.metadata as m, lmcache; "
                        "print(m.version('lmcache'))"], capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 else None


def ensure_lmcache_venv(venv: Path, progress: Callable[[str], None] | None = None) -> Path:
    """The Python of a virtual environment holding lmcache==0.5.6 (and the CPU torch it needs),
    created at ``venv`` the first time. Raises BenchIoError with pip's last lines on failure."""
    py = _venv_python(venv)
    if _lmcache_version(py) == LMCACHE_VERSION:
        return py
    if progress:
        progress(f"installing lmcache=={LMCACHE_VERSION} into {venv} (once)")
    venv.parent.mkdir(parents=True, exist_ok=True)
    steps = [[sys.executable, "-m", "venv", str(venv)],
             [str(py), "-m", "pip", "install", "-q", LMCACHE_TORCH],
             [str(py), "-m", "pip", "install", "-q", f"lmcache=={LMCACHE_VERSION}"]]
    for cmd in steps:
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            tail = [ln for ln in (p.stderr or p.stdout).splitlines()
                    if ln.strip() and not ln.startswith("WARNING: Location")][-3:]
            raise BenchIoError(f"cannot set up the LMCache environment ({' '.join(cmd[2:])}): "
                               + " | ".join(tail))
    got = _lmcache_version(py)
    if got != LMCACHE_VERSION:
        raise BenchIoError(f"lmcache {LMCACHE_VERSION} did not import in {venv} (got {got})")
    return py


def lmcache_round(py: Path, cfg: IoBenchConfig, repeat: int) -> dict:
    params = {"dir": str(cfg.dir / f"saria-bench-lmcache-{repeat}"), "size": cfg.size,
              "block": cfg.block, "qd": cfg.qd, "salt": repeat, "keep": cfg.keep_files}
    p = subprocess.run([str(py), str(CHILD), json.dumps(params)], capture_output=True,
                       text=True)
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or [f"rc {p.returncode}"]
        raise BenchIoError(f"LMCache run failed: {tail[0]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    if r["bad_blocks"]:
        raise BenchIoError(f"LMCache read back {r['bad_blocks']} missing or wrong blocks")
    return r
