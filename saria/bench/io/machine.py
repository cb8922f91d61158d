"""The machine a benchmark ran on, recorded beside its figures."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import numpy as np


def machine_info(directory: Path) -> dict:
    info: dict = {
        "hostname": platform.node(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cpus": os.cpu_count(),
        "cpu_model": None,
        "memory_bytes": None,
        "dir_filesystem": None,
        "dir_device": None,
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import psutil

        info["memory_bytes"] = int(psutil.virtual_memory().total)
    except Exception:  # noqa: BLE001
        pass
    try:  # the mount that holds the directory: longest mount point that prefixes it
        real = os.path.realpath(directory)
        best = ""
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mnt, fs = line.split()[:3]
            mnt = mnt.replace("\\040", " ")
            if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, info["dir_device"], info["dir_filesystem"] = mnt, dev, fs
    except OSError:
        pass
    return info
