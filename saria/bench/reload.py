"""``saria bench reload``: the engine's reload paths measured on this machine.

Every figure comes from the vLLM worker's own handlers (``saria.connector.
worker``), on KV pages in the best device torch sees (CUDA when present,
else host memory), beside the reference a user would compare with, in the
same run (medians of ``repeat`` interleaved rounds; the machines are shared):

* **DRAM -> KV pages** (``PageCopier``, one layer at a time from pool slots)
  and **KV -> DRAM** against ``np.copyto`` of the same bytes (memcpy), and the
  pool's ``scatter`` / ``gather``. Goal: >= 0.9 of memcpy.
* **SSD -> KV pages** (``SsdPageReader``: O_DIRECT reads of whole blocks,
  verified, into a staging buffer, then every layer's pages into place)
  against ``fio`` reading the same bytes in the same I/O size at queue depth
  16 (when fio is installed). Goal: >= 0.9 of fio.
* **Tensor parallelism** (``tp`` ranks, default 2): the same bytes per block
  split over ``tp`` ranks (pages of ``page_bytes / tp``), written once to a
  store of ``tp`` parts per slot; each rank's ``SsdPageReader`` loads its
  part alone, beside a whole-slot read by each rank of the same blocks
  (what every rank read before parts): bytes each rank read from the drive
  (the reader's own counter) and seconds, per rank.
* **The coordinator**: loads that take a share of their blocks from the SSD
  (0 .. 100%) under ``serial``, ``overlap`` and ``paced``, each measured
  beside what the replay's model (``saria.transfer.reload_time``) predicts
  from the rates measured above -- where the model and the machine agree.

``hardware`` in the JSON is a replay preset built from these figures
(``saria replay --preset MODEL/measured.json``): ``link_Bps`` is the
memcpy rate on a machine without a GPU (the bus both paths share), the
host-to-device rate with one; ``dram_copy_Bps`` the DRAM -> KV page rate;
``ssd_read_Bps`` the SSD -> KV rate per drive; ``ssd_write_Bps`` the store's
write rate; ``gds`` false (reads bounce through host memory).
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from saria.bench.io.config import BenchIoError
from saria.bench.io.fio import find_fio
from saria.bench.io.machine import machine_info

MODES = ("serial", "overlap", "paced")
SHARES = (0.0, 0.25, 0.5, 0.75, 1.0)


@dataclass
class ReloadBenchConfig:
    dir: Path
    page_bytes: int = 64 << 10        # one layer's page of a block (Llama-3-8B, 16 tokens, 1 layer)
    layers: int = 32
    blocks: int = 256                 # per load (256 x 2 MiB = 512 MiB)
    repeat: int = 3
    base: str = "h100-gen5-1ssd"      # the preset the measured figures replace fields of
    tp: int = 2                       # ranks of the tensor-parallel section (1: skip it)

    @property
    def slot_bytes(self) -> int:
        return self.page_bytes * self.layers

    def validate(self) -> None:
        if self.page_bytes < 512 or self.page_bytes % 512:
            raise BenchIoError(f"--page-bytes must be a positive multiple of 512, got {self.page_bytes}")
        if self.layers < 1 or self.blocks < 4 or self.repeat < 1:
            raise BenchIoError("--layers >= 1, --blocks >= 4 and --repeat >= 1 are needed")
        if self.tp < 1 or self.page_bytes % self.tp:
            raise BenchIoError(f"--tp must be >= 1 and divide --page-bytes ({self.page_bytes}), got {self.tp}")


def run_reload_bench(cfg: ReloadBenchConfig,
                     progress: Callable[[str], None] | None = None) -> dict:
    """Runs every measurement; returns the JSON-ready result."""
    import torch

    from saria.connector.layout import Geometry
    from saria.connector.meta import Medium, Transfer
    from saria.connector.movers import PageCopier, SsdPageReader
    from saria.connector.pages import KVPages
    from saria.tiers.dram import DramPool
    from saria.tiers.ssd import DATA_OFFSET, SsdStore, slot_bytes_for

    cfg.validate()
    say = progress or (lambda text: None)
    cfg.dir.mkdir(parents=True, exist_ok=True)
    n = cfg.blocks
    total = n * cfg.slot_bytes
    need = 1.2 * total + (64 << 20)
    free = shutil.disk_usage(cfg.dir).free
    if free < need:
        raise BenchIoError(f"{cfg.dir}: {free / 2**30:.1f} GiB free, the benchmark needs about "
                           f"{need / 2**30:.1f} GiB")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    names = tuple(f"l{i}" for i in range(cfg.layers))
    geo = Geometry(16, cfg.page_bytes, names, 1, 0, 2 * n, "torch.uint8", "bench", device)
    kv = {name: torch.zeros(2 * n, cfg.page_bytes, dtype=torch.uint8, device=device)
          for name in names}
    pages = KVPages(kv, geo)
    work = Path(tempfile.mkdtemp(prefix="saria-bench-reload-", dir=cfg.dir))
    pool = DramPool(2 * n, cfg.slot_bytes)
    store = None
    try:
        slots = np.random.default_rng(0).permutation(pool.alloc(n))
        rng = np.random.default_rng(1)
        pool.scatter(slots, rng.integers(0, 256, (n, cfg.slot_bytes), dtype=np.uint8))
        copier = PageCopier(pages, pool, geo)
        say("writing the SSD blocks")
        store = SsdStore([work / "d0"], DATA_OFFSET + (n + 8) * slot_bytes_for(cfg.slot_bytes),
                         cfg.slot_bytes)
        keys = np.zeros((n, 32), np.uint8)
        keys[:, :8] = np.arange(n, dtype=np.uint64).view(np.uint8).reshape(n, 8)
        rows = np.empty((n, cfg.slot_bytes), np.uint8)
        pool.gather(slots, rows)
        t = time.perf_counter()
        handles = store.write(keys, rows)
        write_s = time.perf_counter() - t
        if (handles < 0).any():
            raise BenchIoError("the SSD store could not write the benchmark's blocks")
        reader_pages = SsdPageReader((str(work / "d0"),), pages, geo)
        src, dst = np.empty(total, np.uint8), np.empty(total, np.uint8)
        src[:] = 7
        dst[:] = 0  # fault every page in: memcpy must not pay for first touches
        fio = find_fio()
        runs: dict[str, list[float]] = {k: [] for k in (
            "memcpy", "dram_to_kv", "kv_to_dram", "scatter", "gather", "ssd_read", "ssd_to_kv",
            "fio_read")}
        ids = list(range(n))

        def timed(fn) -> float:
            a = time.perf_counter()
            fn()
            return time.perf_counter() - a

        load = Transfer(1, "b", Medium.DRAM, Medium.KV, slots.tolist(), ids)
        save = Transfer(2, "b", Medium.KV, Medium.DRAM, ids, slots.tolist())
        ssd_t = Transfer(3, "b", Medium.SSD, Medium.KV, handles.tolist(), list(range(n, 2 * n)),
                         keys.tobytes())
        for r in range(cfg.repeat):
            say(f"[{r + 1}/{cfg.repeat}] memcpy, DRAM <-> KV pages")
            runs["memcpy"].append(total / timed(lambda: np.copyto(dst, src)))
            runs["dram_to_kv"].append(total / timed(
                lambda: [copier.copy(load, layer) for layer in range(cfg.layers)]))
            runs["kv_to_dram"].append(total / timed(
                lambda: [copier.copy(save, layer) for layer in range(cfg.layers)]))
            runs["scatter"].append(total / timed(lambda: pool.scatter(slots, rows)))
            runs["gather"].append(total / timed(lambda: pool.gather(slots, rows)))
            say(f"[{r + 1}/{cfg.repeat}] SSD -> KV pages")
            out = np.empty((n, cfg.slot_bytes), np.uint8)
            read_s = timed(lambda: store.read(handles, keys, out))   # the store alone
            got = {}
            load_s = timed(lambda: got.update(ok=reader_pages.load([ssd_t])))  # reads + pages
            if not got["ok"].all():
                raise BenchIoError(f"{int((~got['ok']).sum())} SSD blocks failed their read")
            runs["ssd_read"].append(total / read_s)
            runs["ssd_to_kv"].append(total / load_s)
            if fio is not None:
                say(f"[{r + 1}/{cfg.repeat}] fio read")
                from saria.bench.io.config import IoBenchConfig

                fcfg = IoBenchConfig(dir=work, size=total, block=cfg.slot_bytes, qd=16, repeat=1)
                runs["fio_read"].append(fio.run(fcfg, work / "fio.dat", "read"))
        med = {k: (statistics.median(v) if v else None) for k, v in runs.items()}
        ok_pages = all(torch.equal(kv[name][n:2 * n].cpu(), kv[name][:n].cpu()) for name in names)
        if not ok_pages:
            raise BenchIoError("the pages read from the SSD differ from the ones copied from DRAM")
        result = {
            "params": {"dir": str(cfg.dir), "page_bytes": cfg.page_bytes, "layers": cfg.layers,
                       "blocks": n, "slot_bytes": cfg.slot_bytes, "repeat": cfg.repeat,
                       "device": device, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
            "machine": machine_info(cfg.dir),
            "rates_Bps": med,
            "runs_Bps": runs,
            "ssd_write_Bps": total / write_s,
            "ratios": _ratios(med, fio is not None),
        }
        link = med["memcpy"] if device == "cpu" else _h2d_rate(torch, total)
        result["hardware"] = {"base": cfg.base, "name": f"measured-{result['machine']['hostname']}",
                              "link_Bps": link, "dram_copy_Bps": med["dram_to_kv"],
                              "ssd_count": 1, "ssd_read_Bps": med["ssd_to_kv"],
                              "ssd_write_Bps": total / write_s, "gds": False}
        if cfg.tp > 1:
            say(f"tensor parallelism: {cfg.tp} ranks")
            result["tensor_parallel"] = _tp_rows(cfg, work, rows, keys, device)
        say("coordinator modes")
        result["coordinator"] = _coordinator_rows(cfg, copier, reader_pages, slots, handles, keys,
                                                  result["hardware"])
        copier.close()
        return result
    finally:
        if store is not None:
            store.close()
        pool.close()
        shutil.rmtree(work, ignore_errors=True)


def _tp_rows(cfg: ReloadBenchConfig, work: Path, rows: np.ndarray, keys: np.ndarray, device: str) -> dict:
    """Each rank of a ``cfg.tp``-way engine loads its part of every block from
    a store of ``tp`` parts per slot, beside a whole-slot read of the same
    blocks (before parts, every rank read every slot): bytes each rank read
    from the drive and seconds (medians of ``repeat`` interleaved rounds)."""
    import torch

    from saria.connector.layout import Geometry
    from saria.connector.meta import Medium, Transfer
    from saria.connector.movers import SsdPageReader
    from saria.connector.pages import KVPages
    from saria.tiers.ssd import DATA_OFFSET, SsdStore, slot_bytes_for

    n, tp, page = cfg.blocks, cfg.tp, cfg.page_bytes // cfg.tp
    names = tuple(f"l{i}" for i in range(cfg.layers))
    d = work / "tp"
    store = SsdStore([d], DATA_OFFSET + (n + 8) * slot_bytes_for(cfg.slot_bytes, tp), cfg.slot_bytes, parts=tp)
    try:
        handles = store.write(keys, rows)
        if (handles < 0).any():
            raise BenchIoError("the SSD store could not write the tensor-parallel blocks")
        ranks = []
        for r in range(tp):
            geo = Geometry(16, page, names, tp, r, n, "torch.uint8", "bench", device)
            kv = {name: torch.zeros(n, page, dtype=torch.uint8, device=device) for name in names}
            ranks.append((geo, kv, SsdPageReader((str(d),), KVPages(kv, geo), geo),
                          SsdStore.reader([d], cfg.slot_bytes, parts=tp)))
        t = Transfer(4, "b", Medium.SSD, Medium.KV, handles.tolist(), list(range(n)), keys.tobytes())
        part_s: list[list[float]] = [[] for _ in range(tp)]
        whole_s: list[list[float]] = [[] for _ in range(tp)]
        part_bytes, whole_bytes = [0] * tp, [0] * tp
        out = np.empty((n, cfg.slot_bytes), np.uint8)
        for _ in range(cfg.repeat):
            for r, (geo, kv, reader, whole) in enumerate(ranks):
                b0, a = reader.bytes_read, time.perf_counter()
                ok = reader.load([t])
                part_s[r].append(time.perf_counter() - a)
                part_bytes[r] = reader.bytes_read - b0
                if not ok.all():
                    raise BenchIoError(f"rank {r}: {int((~ok).sum())} parts failed their read")
                w0, a = int(whole.stats()["total"]["bytes_read"]), time.perf_counter()
                whole.read(handles, keys, out)
                whole_s[r].append(time.perf_counter() - a)
                whole_bytes[r] = int(whole.stats()["total"]["bytes_read"]) - w0
        for r, (geo, kv, reader, whole) in enumerate(ranks):  # each rank holds exactly its pages
            for i, name in enumerate(names):
                off = r * geo.rank_bytes + i * page
                if not np.array_equal(kv[name].cpu().numpy(), rows[:, off: off + page]):
                    raise BenchIoError(f"rank {r}: the pages read from its parts differ from the blocks written")
            reader.close()
            whole.close()
        return {"tp": tp, "blocks": n, "block_bytes": cfg.slot_bytes, "slot_bytes": store.slot_bytes,
                "bytes_read_per_rank": part_bytes, "whole_slot_bytes_read_per_rank": whole_bytes,
                "part_s_per_rank": [statistics.median(v) for v in part_s],
                "whole_slot_s_per_rank": [statistics.median(v) for v in whole_s],
                "read_traffic_ratio": sum(part_bytes) / sum(whole_bytes)}
    finally:
        store.close()


def _ratios(med: dict, have_fio: bool) -> dict:
    def r(a, b):
        return med[a] / med[b] if med.get(a) and med.get(b) else None

    return {"dram_to_kv_vs_memcpy": r("dram_to_kv", "memcpy"),
            "kv_to_dram_vs_memcpy": r("kv_to_dram", "memcpy"),
            "scatter_vs_memcpy": r("scatter", "memcpy"), "gather_vs_memcpy": r("gather", "memcpy"),
            "ssd_to_kv_vs_fio": r("ssd_to_kv", "fio_read") if have_fio else None,
            "ssd_read_vs_fio": r("ssd_read", "fio_read") if have_fio else None}


def _h2d_rate(torch, nbytes: int) -> float:
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    a = time.perf_counter()
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    return nbytes / (time.perf_counter() - a)


def _coordinator_rows(cfg, copier, reader, slots, handles, keys, hw) -> list[dict]:
    """Loads of `blocks` blocks, a share from the SSD, per mode: measured time
    and the model's, from the rates just measured."""
    from saria.connector.meta import Medium, Transfer
    from saria.connector.loads import LoadCoordinator
    from saria.transfer import LinkModel, reload_time

    n = cfg.blocks
    link = LinkModel(hw["link_Bps"], hw["dram_copy_Bps"], hw["ssd_read_Bps"])
    rows = []
    for share in SHARES:
        k_ssd = int(round(share * n))
        for mode in MODES:
            times = []
            for _ in range(cfg.repeat):
                coord = LoadCoordinator(mode, copier, reader, cfg.layers,
                                        ingress_Bps=hw["link_Bps"])
                coord.dram_Bps, coord.ssd_Bps = hw["dram_copy_Bps"], hw["ssd_read_Bps"]
                dram = [Transfer(1, "b", Medium.DRAM, Medium.KV, slots[k_ssd:].tolist(),
                                 list(range(k_ssd, n)))] if k_ssd < n else []
                ssd = [Transfer(1, "b", Medium.SSD, Medium.KV, handles[:k_ssd].tolist(),
                                list(range(n, n + k_ssd)), keys[:k_ssd].tobytes())] if k_ssd else []
                a = time.perf_counter()
                step = coord.run(dram, ssd)
                step.finish()
                times.append(time.perf_counter() - a)
                timeline = [(s - a, e - a, src, b) for s, e, src, b in coord.timeline]
                coord.close()
            d_bytes = (n - k_ssd) * cfg.slot_bytes
            s_bytes = k_ssd * cfg.slot_bytes
            rows.append({"ssd_share": share, "mode": mode, "measured_s": statistics.median(times),
                         "model_s": reload_time(d_bytes, s_bytes, link, mode),
                         "runs_s": times, "timeline": timeline})
    return rows
