"""``saria bench io``: the tiers' bandwidth beside what the hardware gives, in one run.

Every figure is measured in the same run on the same directory and reported as a ratio, because
the machines are shared and noisy (absolute GB/s are reported too, for the record):

* **SSD store vs fio.** ``fio --direct=1 --ioengine=io_uring`` (libaio, then psync, if io_uring
  is refused) writes then reads ``size`` bytes sequentially in ``block``-byte I/Os at queue depth
  ``qd`` (one job). saria's :class:`saria.tiers.ssd.SsdStore` does the same workload: ``size /
  block`` blocks of ``block`` bytes, written in batches of ``qd`` blocks (the store issues a
  batch concurrently) from a :class:`~saria.tiers.dram.DramPool` and read back into it, every
  block's header and the first block of every batch verified. Ratios ``ssd_write_vs_fio``,
  ``ssd_read_vs_fio`` (goal: >= 0.9). Without fio the ratios are null and one line says how to
  install it.
* **DRAM pool vs memcpy.** ``DramPool.scatter`` (buffer -> slots) and ``DramPool.gather``
  (slots -> buffer) over shuffled slot handles, beside ``np.copyto`` of the same bytes between
  two ordinary buffers; one thread. ``dram_vs_memcpy`` is the lower of the two pool ratios
  (goal: >= 0.9).
* **LMCache** (``lmcache=True``): the same workload through LMCache 0.5.6's ``fs`` L2 adapter
  (``FSL2Adapter``, what its multiprocess server uses for a file-system L2 tier) with
  ``use_odirect=True``, driven in-process: one store / load task per batch of ``qd`` blocks,
  each awaited before the next, as the MP server's store controller submits a batch per task.
  LMCache pins ``numpy<=2.2.6``, so it runs in its own virtual environment, created once (see
  :func:`ensure_lmcache_venv`). Ratios ``ssd_write_vs_lmcache``, ``ssd_read_vs_lmcache``.

Each measurement runs ``repeat`` times, the tools interleaved within a repeat (fio write, saria
write, fio read, saria read, LMCache) so drift on a shared disk hits all of them alike; figures
are medians, ratios are ratios of the medians (the paired per-repeat ratios are kept too).
"""

from __future__ import annotations

import json
import mmap
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from saria.errors import SariaError

FIO_INSTALL_HINT = ("fio not found on PATH: the fio ratios are left null; install it to get them "
                    "(Debian/Ubuntu: sudo apt-get install fio; Fedora/RHEL: sudo dnf install fio)")
LMCACHE_VERSION = "0.5.6"
# The CPU build this machine kind's pip configuration provides; an unpinned torch pulls several
# GB of CUDA packages (see the project brief).
LMCACHE_TORCH = "torch==2.13.0"
DEFAULT_LMCACHE_VENV = Path.home() / ".cache" / "saria" / "lmcache-venv"
GOAL_VS_FIO = 0.9
GOAL_VS_MEMCPY = 0.9
DRAM_MAX_BYTES = 2 << 30  # the DRAM copy test uses min(size, 2 GiB): it needs three buffers
ALIGN = 4096

# progress(description, advance): advance=True starts a new step of ``_steps(cfg)``; False only
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


def _median(xs: list[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


# --------------------------------------------------------------------------- machine info
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


# ----------------------------------------------------------------------------------- fio
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


# ---------------------------------------------------------------------------- saria SSD
def _store_slot_bytes(block: int) -> int:
    try:
        from saria.tiers.ssd import slot_bytes_for

        return int(slot_bytes_for(block))
    except (ImportError, AttributeError):
        return -(-(64 + block) // 4096) * 4096


def _aligned_buffer(nbytes: int) -> tuple[mmap.mmap, np.ndarray]:
    """Page-aligned anonymous memory, with the same huge-page advice as the DRAM pool, so the
    memcpy baseline and the pool copy over the same kind of pages."""
    m = mmap.mmap(-1, nbytes)
    if hasattr(mmap, "MADV_HUGEPAGE") and nbytes >= 2 << 20:
        try:
            m.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
    return m, np.frombuffer(m, dtype=np.uint8)


def _block_keys(n: int, salt: int) -> np.ndarray:
    """(n, 32) uint8 keys: block index and a per-repeat salt (distinct across repeats)."""
    keys = np.zeros((n, 32), dtype=np.uint8)
    keys[:, :8] = np.arange(n, dtype=np.uint64).view(np.uint8).reshape(n, 8)
    keys[:, 8:16] = np.full(n, salt, dtype=np.uint64).view(np.uint8).reshape(n, 8)
    keys[:, 16:] = 0x5A
    return keys


class SariaSsdRunner:
    """Writes then reads the workload through ``SsdStore`` from / into a DramPool."""

    def __init__(self, cfg: IoBenchConfig) -> None:
        from saria.tiers.dram import DramPool
        from saria.tiers.ssd import SsdStore  # may not exist yet: the caller catches ImportError

        self.cfg = cfg
        self.SsdStore = SsdStore
        self.pool = DramPool(cfg.qd, cfg.block)
        self.handles = self.pool.alloc(cfg.qd)
        self.slots = self.pool.array[self.handles[0]:self.handles[0] + cfg.qd]  # contiguous
        rng = np.random.default_rng(0)
        self.pattern = rng.integers(0, 256, size=cfg.block, dtype=np.uint8)
        self.store = None
        self.store_handles: np.ndarray | None = None
        self.keys: np.ndarray | None = None
        self.device_bytes_written: int | None = None

    def _open(self, repeat: int) -> None:
        """One store for every repeat, like fio's one file: the first repeat
        writes fresh (fallocated) space, later ones overwrite freed slots --
        the steady state of a long-lived cache, and what fio's later repeats
        do to its file."""
        if self.store is not None:
            if self.store_handles is not None:
                self.store.free(self.store_handles)
                self.store_handles = None
            return
        cfg = self.cfg
        d = cfg.dir / "saria-bench-ssd"
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
        # Each block takes one slot (a 64-byte header + the payload, rounded up to 4 KiB) after
        # a 4 KiB superblock; room for exactly the workload.
        slot = _store_slot_bytes(cfg.block)
        capacity = 4096 + cfg.num_blocks * slot
        self.dir = d
        self.store = self.SsdStore([d], capacity_bytes=capacity, block_bytes=cfg.block)

    def write(self, repeat: int) -> float:
        cfg = self.cfg
        self._open(repeat)
        n, qd = cfg.num_blocks, cfg.qd
        self.keys = _block_keys(n, repeat)
        handles = np.empty(n, dtype=np.int64)
        headers = np.arange(n, dtype=np.uint64).view(np.uint8).reshape(n, 8)
        self.slots[:] = self.pattern
        t0 = time.perf_counter()
        for s in range(0, n, qd):
            k = min(qd, n - s)
            self.slots[:k, :8] = headers[s:s + k]  # each block's bytes differ
            h = self.store.write(self.keys[s:s + k], self.slots[:k])
            handles[s:s + k] = h
        # No sync(): like fio --direct=1, a write counts once its O_DIRECT pwrite completed
        # (the store returns a handle only then).
        dt = time.perf_counter() - t0
        if (handles < 0).any():
            raise BenchIoError(f"SsdStore.write failed for {int((handles < 0).sum())} blocks")
        self.store_handles = handles
        return _gbps(cfg.size, dt)

    def read(self) -> float:
        cfg = self.cfg
        n, qd = cfg.num_blocks, cfg.qd
        want = np.arange(n, dtype=np.uint64)
        bad = 0
        t0 = time.perf_counter()
        for s in range(0, n, qd):
            k = min(qd, n - s)
            self.slots[:k, :8] = 0
            ok = self.store.read(self.store_handles[s:s + k], self.keys[s:s + k], self.slots[:k])
            ok = np.asarray(ok, dtype=bool)
            got = self.slots[:k, :8].copy().view(np.uint64).reshape(k)
            bad += int((~ok).sum()) + int((got != want[s:s + k]).sum())
            if not np.array_equal(self.slots[0, 8:], self.pattern[8:]):
                bad += 1
        dt = time.perf_counter() - t0
        if bad:
            raise BenchIoError(f"SsdStore.read returned {bad} failed or wrong blocks")
        return _gbps(cfg.size, dt)

    def _close(self) -> None:
        if self.store is not None:
            try:
                st = self.store.stats()
                self.device_bytes_written = int(sum(d.get("bytes_written", 0)
                                                    for d in st.get("drives", [])))
            except Exception:  # noqa: BLE001 -- stats are informative only
                pass
            self.store.close()
            self.store = None
        if not self.cfg.keep_files:
            shutil.rmtree(self.dir, ignore_errors=True)

    def close(self) -> None:
        try:
            self._close()
        except Exception:  # noqa: BLE001
            pass
        self.pool.close()


# ----------------------------------------------------------------------------------- DRAM
def dram_round(src: np.ndarray, dst: np.ndarray, pool, handles: np.ndarray) -> dict[str, float]:
    """One round of memcpy, scatter and gather over the same bytes; GB/s each."""
    nbytes = src.nbytes
    out = {}
    t0 = time.perf_counter()
    np.copyto(dst, src)
    out["memcpy"] = _gbps(nbytes, time.perf_counter() - t0)
    t0 = time.perf_counter()
    pool.scatter(handles, src)
    out["scatter"] = _gbps(nbytes, time.perf_counter() - t0)
    t0 = time.perf_counter()
    pool.gather(handles, dst)
    out["gather"] = _gbps(nbytes, time.perf_counter() - t0)
    return out


# -------------------------------------------------------------------------------- LMCache
LMCACHE_SCRIPT = r'''
import json, mmap, os, shutil, sys, time
os.environ.setdefault("LMCACHE_LOG_LEVEL", "WARNING")
import numpy as np
from importlib.metadata import version
from lmcache.v1.distributed.api import ObjectKey
from lmcache.v1.distributed.l2_adapters.fs_l2_adapter import FSL2Adapter, FSL2AdapterConfig


class Obj:
    """Stands in for LMCache's MemoryObj: the adapter reads and fills only .byte_array."""
    def __init__(self, mv):
        self.byte_array = mv


def wait(poll, timeout=3600.0):
    t = time.monotonic()
    while True:
        r = poll()
        if r is not None:
            return r
        if time.monotonic() - t > timeout:
            raise TimeoutError("LMCache task did not complete")
        time.sleep(0.0001)


p = json.loads(sys.argv[1])
base, size, block, qd, salt = p["dir"], p["size"], p["block"], p["qd"], p["salt"]
n = size // block
buf = mmap.mmap(-1, qd * block)  # page-aligned, as O_DIRECT needs
arr = np.frombuffer(buf, np.uint8).reshape(qd, block)
pattern = np.random.default_rng(0).integers(0, 256, size=block, dtype=np.uint8)
headers = np.arange(n, dtype=np.uint64).view(np.uint8).reshape(n, 8)
shutil.rmtree(base, ignore_errors=True)
ad = FSL2Adapter(FSL2AdapterConfig(base_path=base, use_odirect=True))
keys = [ObjectKey(chunk_hash=i.to_bytes(8, "little") + salt.to_bytes(8, "little"),
                  model_name="saria-bench", kv_rank=0) for i in range(n)]
objs = [Obj(memoryview(buf)[j * block:(j + 1) * block]) for j in range(qd)]
arr[:] = pattern
t0 = time.perf_counter()
for s in range(0, n, qd):
    k = min(qd, n - s)
    arr[:k, :8] = headers[s:s + k]
    tid = ad.submit_store_task(keys[s:s + k], objs[:k])
    res = wait(lambda: ad.pop_completed_store_tasks().get(tid))
    if int(res) < 0:
        raise RuntimeError("LMCache store task failed")
t1 = time.perf_counter()
bad = 0
for s in range(0, n, qd):
    k = min(qd, n - s)
    arr[:k, :8] = 0
    tid = ad.submit_load_task(keys[s:s + k], objs[:k])
    bm = wait(lambda: ad.query_load_result(tid))
    bad += k - len(bm.get_indices_list())
    bad += int((arr[:k, :8] != headers[s:s + k]).any(axis=1).sum())
    bad += int(not np.array_equal(arr[0, 8:], pattern[8:]))
t2 = time.perf_counter()
ad.close()
if not p.get("keep"):
    shutil.rmtree(base, ignore_errors=True)
print(json.dumps({"write_gbps": size / (t1 - t0) / 1e9, "read_gbps": size / (t2 - t1) / 1e9,
                  "bad_blocks": bad, "lmcache_version": version("lmcache"),
                  "numpy_version": np.__version__}))
'''


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


def lmcache_round(py: Path, script: Path, cfg: IoBenchConfig, repeat: int) -> dict:
    params = {"dir": str(cfg.dir / f"saria-bench-lmcache-{repeat}"), "size": cfg.size,
              "block": cfg.block, "qd": cfg.qd, "salt": repeat, "keep": cfg.keep_files}
    p = subprocess.run([str(py), str(script), json.dumps(params)], capture_output=True,
                       text=True)
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or [f"rc {p.returncode}"]
        raise BenchIoError(f"LMCache run failed: {tail[0]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    if r["bad_blocks"]:
        raise BenchIoError(f"LMCache read back {r['bad_blocks']} missing or wrong blocks")
    return r


# ---------------------------------------------------------------------------------- run
def _steps(cfg: IoBenchConfig) -> int:
    return cfg.repeat * (5 + (1 if cfg.lmcache else 0))


def _attempt(res: dict, runs: str, measure, catch: type[BaseException],
             prefix: str | None = None) -> float | None:
    """One measurement of one tool, unless that tool already failed in this
    run: the figure is appended to ``res[runs]``; a failure becomes
    ``res["reason"]`` (``prefix`` + exception type and text, or the text
    alone) and later rounds skip the tool."""
    if res["reason"] is not None:
        return None
    try:
        value = measure()
    except catch as exc:  # noqa: BLE001 -- a tool's failure is reported, not raised
        res["reason"] = str(exc) if prefix is None else f"{prefix}{type(exc).__name__}: {exc}"
        return None
    res[runs].append(value)
    return value


def run_io_bench(cfg: IoBenchConfig, *, progress: Progress | None = None,
                 notice: Callable[[str], None] | None = None) -> dict:
    """Runs every measurement; returns the JSON-ready result. ``progress(desc, True)`` is called
    once per step (``_steps(cfg)`` in all); ``notice(line)`` for one-line messages (fio missing)."""
    cfg.validate()
    report = progress or (lambda desc, advance: None)

    def step(desc: str) -> None:
        report(desc, True)

    say = notice or (lambda line: print(line, file=sys.stderr))
    cfg.dir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(cfg.dir).free
    if free < 2.3 * cfg.size:
        raise BenchIoError(f"{cfg.dir}: {free / 2**30:.1f} GiB free, the benchmark needs about "
                           f"{2.3 * cfg.size / 2**30:.1f} GiB (fio file + SSD store)")

    result: dict = {
        "params": {"dir": str(cfg.dir), "size": cfg.size, "block": cfg.block, "qd": cfg.qd,
                   "repeat": cfg.repeat, "lmcache": cfg.lmcache,
                   "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
        "machine": machine_info(cfg.dir),
        "goals": {"ssd_vs_fio": GOAL_VS_FIO, "dram_vs_memcpy": GOAL_VS_MEMCPY},
    }

    # --- fio
    fio = find_fio()
    fio_res: dict = {"available": fio is not None, "version": fio.version if fio else None,
                     "ioengine": None, "write_runs": [], "read_runs": [], "reason": None}
    if fio is None:
        if cfg.require_fio:
            raise BenchIoError(FIO_INSTALL_HINT.replace("the fio ratios are left null; ", ""))
        say(FIO_INSTALL_HINT)
        fio_res["reason"] = FIO_INSTALL_HINT
    fio_file = cfg.dir / "saria-bench-fio.dat"

    # --- saria SSD store
    ssd_res: dict = {"available": False, "write_runs": [], "read_runs": [], "reason": None,
                     "pinned_buffers": None}
    ssd: SariaSsdRunner | None = None
    try:
        ssd = SariaSsdRunner(cfg)
        ssd_res["available"] = True
        ssd_res["pinned_buffers"] = ssd.pool.pinned
    except ImportError as exc:
        ssd_res["reason"] = f"saria.tiers.ssd.SsdStore is not importable: {exc}"
    except Exception as exc:  # noqa: BLE001 -- e.g. the native store failing to start
        ssd_res["reason"] = f"SsdStore could not start: {type(exc).__name__}: {exc}"

    # --- DRAM
    from saria.tiers.dram import DramPool

    dram_bytes = min(cfg.size, DRAM_MAX_BYTES)
    dram_bytes -= dram_bytes % cfg.block
    nslots = dram_bytes // cfg.block
    pool = DramPool(nslots, cfg.block)
    handles = np.random.default_rng(1).permutation(pool.alloc(nslots))
    _m1, src = _aligned_buffer(dram_bytes)
    _m2, dst = _aligned_buffer(dram_bytes)
    src[:] = np.random.default_rng(2).integers(0, 256, size=dram_bytes, dtype=np.uint8)
    dst[:] = 0
    src2 = src.reshape(nslots, cfg.block)
    dst2 = dst.reshape(nslots, cfg.block)
    dram_round(src2, dst2, pool, handles)  # warm-up: fault in every page, warm the caches
    dram_runs: dict[str, list[float]] = {"memcpy": [], "scatter": [], "gather": []}

    # --- LMCache
    lm_res: dict = {"enabled": cfg.lmcache, "available": False, "version": None,
                    "backend": ("lmcache.v1.distributed.l2_adapters.fs_l2_adapter.FSL2Adapter "
                                "(the MP server's 'fs' L2 adapter), use_odirect=True, one "
                                "task per batch of qd blocks"),
                    "venv": str(cfg.lmcache_venv) if cfg.lmcache else None,
                    "write_runs": [], "read_runs": [], "reason": None}
    lm_py: Path | None = None
    tmpdir = tempfile.TemporaryDirectory(prefix="saria-bench-io-")
    lm_script = Path(tmpdir.name) / "lmcache_io.py"
    if cfg.lmcache:
        lm_script.write_text(LMCACHE_SCRIPT)
        try:
            lm_py = ensure_lmcache_venv(cfg.lmcache_venv,
                                           progress=lambda d: report(d, False))
            lm_res["available"] = True
        except BenchIoError as exc:
            lm_res["reason"] = str(exc)
    else:
        lm_res["reason"] = "not requested (--lmcache)"

    paired: dict[str, list[float]] = {"ssd_write_vs_fio": [], "ssd_read_vs_fio": [],
                                      "ssd_write_vs_lmcache": [], "ssd_read_vs_lmcache": []}
    try:
        for r in range(cfg.repeat):
            tag = f"[{r + 1}/{cfg.repeat}]"
            step(f"{tag} fio write")
            fw = _attempt(fio_res, "write_runs", lambda: fio.run(cfg, fio_file, "write") / 1e9,
                          BenchIoError) if fio is not None else None
            step(f"{tag} saria SSD store write")
            sw = _attempt(ssd_res, "write_runs", lambda: ssd.write(r), Exception,
                          "write failed: ") if ssd is not None else None
            step(f"{tag} fio read")
            fr = _attempt(fio_res, "read_runs", lambda: fio.run(cfg, fio_file, "read") / 1e9,
                          BenchIoError) if fio is not None else None
            step(f"{tag} saria SSD store read")
            sr = _attempt(ssd_res, "read_runs", ssd.read, Exception,
                          "read failed: ") if ssd is not None and sw is not None else None
            step(f"{tag} DRAM pool vs memcpy")
            for k, v in dram_round(src2, dst2, pool, handles).items():
                dram_runs[k].append(v)
            lw = lr = None
            if cfg.lmcache:
                step(f"{tag} LMCache fs L2 adapter")
                if lm_py is not None and lm_res["reason"] is None:
                    try:
                        lm = lmcache_round(lm_py, lm_script, cfg, r)
                        lw, lr = lm["write_gbps"], lm["read_gbps"]
                        lm_res["write_runs"].append(lw)
                        lm_res["read_runs"].append(lr)
                        lm_res["version"] = lm["lmcache_version"]
                    except (BenchIoError, ValueError, KeyError) as exc:
                        lm_res["reason"] = str(exc)
            for key, a, b in (("ssd_write_vs_fio", sw, fw), ("ssd_read_vs_fio", sr, fr),
                              ("ssd_write_vs_lmcache", sw, lw),
                              ("ssd_read_vs_lmcache", sr, lr)):
                if a is not None and b:
                    paired[key].append(a / b)
        pool.gather(handles, dst2)
        if not np.array_equal(dst, src):
            raise BenchIoError("DRAM pool gather returned wrong bytes")
    finally:
        if ssd is not None:
            ssd.close()
        if not cfg.keep_files:
            fio_file.unlink(missing_ok=True)
        pool.close()
        tmpdir.cleanup()

    fio_res["ioengine"] = fio.engine if fio is not None else None
    ssd_res["payload_bytes_per_run"] = cfg.size
    ssd_res["device_bytes_written_last_run"] = ssd.device_bytes_written if ssd else None
    for res in (fio_res, ssd_res, lm_res):
        res["write_gbps"] = _median(res["write_runs"])
        res["read_gbps"] = _median(res["read_runs"])
    dram_res = {"bytes": dram_bytes, "slots": nslots, "slot_bytes": cfg.block,
                "pinned": pool.pinned, "pin_method": pool.pin_method, "threads": 1,
                "memcpy_gbps": _median(dram_runs["memcpy"]),
                "scatter_gbps": _median(dram_runs["scatter"]),
                "gather_gbps": _median(dram_runs["gather"]),
                "memcpy_runs": dram_runs["memcpy"], "scatter_runs": dram_runs["scatter"],
                "gather_runs": dram_runs["gather"]}
    scatter_r = _ratio(dram_res["scatter_gbps"], dram_res["memcpy_gbps"])
    gather_r = _ratio(dram_res["gather_gbps"], dram_res["memcpy_gbps"])
    result.update({
        "fio": fio_res,
        "saria_ssd": ssd_res,
        "dram": dram_res,
        "lmcache": lm_res,
        "ssd_write_vs_fio": _ratio(ssd_res["write_gbps"], fio_res["write_gbps"]),
        "ssd_read_vs_fio": _ratio(ssd_res["read_gbps"], fio_res["read_gbps"]),
        "dram_scatter_vs_memcpy": scatter_r,
        "dram_gather_vs_memcpy": gather_r,
        "dram_vs_memcpy": min(scatter_r, gather_r) if scatter_r and gather_r else None,
        "ssd_write_vs_lmcache": _ratio(ssd_res["write_gbps"], lm_res["write_gbps"]),
        "ssd_read_vs_lmcache": _ratio(ssd_res["read_gbps"], lm_res["read_gbps"]),
        "paired_ratio_runs": paired,
    })
    return result

