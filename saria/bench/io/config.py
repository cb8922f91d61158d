"""What ``saria bench io`` measures and how to report it: the settings, the
goals, and the small arithmetic shared by the measurement modules."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from saria.errors import SariaError

LMCACHE_VERSION = "0.5.6"
# The CPU build that the pip configuration of machines without a GPU provides; an unpinned torch
# pulls several GB of CUDA packages.
LMCACHE_TORCH = "torch==2.13.0"
DEFAULT_LMCACHE_VENV = Path.home() / ".cache" / "saria" / "lmcache-venv"
GOAL_VS_FIO = 0.9
GOAL_VS_MEMCPY = 0.9
DRAM_MAX_BYTES = 2 << 30  # the DRAM copy test uses min(size, 2 GiB): it needs three buffers
ALIGN = 4096

# progress(description, advance): advance=True starts a new step of ``steps(cfg)``; False only
# re-labels the current one (long one-off set-up such as the LMCache install).
Progress = Callable[[str, bool], None]


class BenchIoError(SariaError):
    """The I/O benchmark cannot run as asked (bad size, no space, fio required but missing)."""


@dataclass
class IoBenchConfig:
    dir: Path
    size: int = 1 << 30
    block: int = 1 << 20
    qd: int = 16
    repeat: int = 3
    lmcache: bool = False
    lmcache_venv: Path = field(default_factory=lambda: DEFAULT_LMCACHE_VENV)
    require_fio: bool = False
    keep_files: bool = False

    def validate(self) -> None:
        if self.block < ALIGN or self.block % ALIGN:
            raise BenchIoError(f"--block must be a positive multiple of {ALIGN} bytes "
                               f"(O_DIRECT), got {self.block}")
        if self.size < self.block:
            raise BenchIoError(f"--size ({self.size}) must be at least one block ({self.block})")
        if self.qd < 1:
            raise BenchIoError(f"--qd must be at least 1, got {self.qd}")
        if self.repeat < 1:
            raise BenchIoError(f"--repeat must be at least 1, got {self.repeat}")
        self.size -= self.size % self.block  # whole blocks only

    @property
    def num_blocks(self) -> int:
        return self.size // self.block


def median(xs: list[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9
