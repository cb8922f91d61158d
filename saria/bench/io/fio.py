"""fio, the reference for the SSD store: one sequential O_DIRECT job per direction."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from saria.bench.io.config import BenchIoError, IoBenchConfig

FIO_INSTALL_HINT = ("fio not found on PATH: the fio ratios are left null; install it to get them "
                    "(Debian/Ubuntu: sudo apt-get install fio; Fedora/RHEL: sudo dnf install fio)")

@dataclass
class FioRunner:
    path: str
    version: str | None = None
    engine: str | None = None

    ENGINES = ("io_uring", "libaio", "psync")

    def run(self, cfg: IoBenchConfig, filename: Path, rw: str) -> float:
        """One fio run; bytes/s of the ``rw`` direction. Picks the first engine that works."""
        engines = (self.engine,) if self.engine else self.ENGINES
        last = ""
        for engine in engines:
            cmd = [self.path, f"--name=saria-{rw}", f"--filename={filename}", f"--rw={rw}",
                   f"--bs={cfg.block}", f"--iodepth={cfg.qd}", f"--size={cfg.size}",
                   "--numjobs=1", "--direct=1", f"--ioengine={engine}", "--group_reporting",
                   "--output-format=json"]
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode == 0:
                try:
                    data = json.loads(p.stdout[p.stdout.index("{"):])
                    bw = float(data["jobs"][0][rw]["bw_bytes"])
                except (ValueError, KeyError, IndexError) as exc:
                    last = f"cannot parse fio output ({exc}): {p.stdout[-300:]}"
                    continue
                if bw > 0:
                    self.engine = engine
                    return bw
                last = f"fio {engine} reported zero bandwidth"
                continue
            last = (p.stderr or p.stdout).strip().splitlines()[-1:] or [f"rc {p.returncode}"]
            last = f"fio --ioengine={engine} failed: {last[0]}"
        raise BenchIoError(last)


def find_fio() -> FioRunner | None:
    path = shutil.which("fio")
    if path is None:
        return None
    try:
        v = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
        version = v.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        version = None
    return FioRunner(path=path, version=version)
