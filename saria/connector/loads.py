"""A step's loads: DRAM copies and SSD reads run together under one mode.

``LoadCoordinator`` runs a step's DRAM copies and SSD reads as the
``coordinator`` setting says -- ``serial`` (DRAM, then SSD), ``overlap``
(both at once, DRAM at full speed) or ``paced`` (DRAM copies throttled by
``saria.transfer.paced_dram_rate`` while SSD reads are in flight, full speed
once they are done) -- and records bytes and seconds per source;
``StepLoad`` is one step's loads in progress, waited for layer by layer.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict, deque
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from saria.connector.meta import Transfer
from saria.connector.movers import PageCopier, SsdPageReader
from saria.transfer import LinkModel, paced_dram_rate

log = logging.getLogger("saria.connector")


class LoadCoordinator:
    """Runs a step's loads -- DRAM copies and SSD reads -- under one mode and
    measures them. Rates for pacing are learnt from the step's own past
    loads (exponential averages of each source alone), unless given."""

    def __init__(self, mode: str, copier: PageCopier, reader: SsdPageReader | None,
                 num_layers: int, ingress_Bps: float | None = None) -> None:
        self.mode = mode
        self.copier = copier
        self.reader = reader
        self.num_layers = num_layers
        self.ingress_Bps = ingress_Bps
        self.dram_Bps = 10e9   # first guesses, replaced by measurements
        self.ssd_Bps = 2e9
        self._io = ThreadPoolExecutor(1, thread_name_prefix="saria-ssd-read")
        self.totals = {"dram_bytes": 0, "dram_us": 0, "ssd_bytes": 0, "ssd_us": 0,
                       "load_us": 0, "ssd_blocks_failed": 0}
        self.timeline: deque = deque(maxlen=4096)  # (start, end, source, bytes) per copy/read

    def link(self) -> LinkModel:
        ingress = self.ingress_Bps or max(self.dram_Bps, self.ssd_Bps)
        return LinkModel(ingress, self.dram_Bps, self.ssd_Bps)

    def run(self, dram: list[Transfer], ssd: list[Transfer]) -> "StepLoad":
        """Starts the step's loads; DRAM copies of every layer are done (CPU)
        or queued (CUDA) when it returns, SSD reads may still be in flight."""
        step = StepLoad(self, ssd)
        t0 = time.perf_counter()
        step.t0 = t0
        if ssd and self.mode != "serial":
            step.start_reads()
        d_bytes = sum(len(t) for t in dram) * self.copier.geo.page_bytes * self.num_layers
        s_bytes = sum(len(t) for t in ssd) * self.copier.geo.slot_bytes
        rate = None
        if self.mode == "paced" and ssd and d_bytes:
            rate = paced_dram_rate(self.link(), d_bytes, s_bytes)
        done = 0
        for layer in range(self.num_layers):
            for t in dram:
                a = time.perf_counter()
                step.futures[layer].append((t, self.copier.submit(t, layer)))
                n = len(t) * self.copier.geo.page_bytes
                done += n
                self.timeline.append((a, time.perf_counter(), "dram", n))
                if rate and step.reading():  # pace while the SSD path runs
                    wait = t0 + done / rate - time.perf_counter() if rate > 0 else 0.0
                    if wait > 0:
                        step.wait_reads(wait)
        if d_bytes:
            dt = time.perf_counter() - t0
            self.totals["dram_bytes"] += d_bytes
            self.totals["dram_us"] += int(dt * 1e6)
            if not ssd or self.mode == "serial":  # alone: a clean rate sample
                self.dram_Bps = _ewma(self.dram_Bps, d_bytes / max(dt, 1e-9))
        if ssd and self.mode == "serial":
            step.start_reads()
        return step

    def close(self) -> None:
        self._io.shutdown(wait=True)


class StepLoad:
    """One step's loads in progress: per-layer DRAM copy futures and the SSD
    job (read and pages put in place, on the coordinator's I/O thread)."""

    def __init__(self, coord: LoadCoordinator, ssd: list[Transfer]) -> None:
        self.coord = coord
        self.ssd = ssd
        self.futures: dict[int, list[tuple[Transfer, Future]]] = defaultdict(list)
        self.errors: dict[int, BaseException] = {}  # op id -> its first failed DRAM copy
        self.read: Future | None = None
        self.done_reading = False
        self.t0 = 0.0
        self.read_start = 0.0
        self.failed: list[tuple[Transfer, list[int], list[int]]] = []  # (t, kv ids, handles)

    def start_reads(self) -> None:
        self.read_start = time.perf_counter()
        self.read = self.coord._io.submit(self.coord.reader.load, self.ssd, self.coord.timeline)

    def reading(self) -> bool:
        return self.read is not None and not self.read.done()

    def wait_reads(self, timeout: float) -> None:
        try:
            self.read.result(timeout=timeout)
        except Exception:  # noqa: BLE001 -- a timeout, or a failure collected later
            pass

    def layer_ready(self, layer: int) -> None:
        """Waits for `layer`'s DRAM copies and for the SSD blocks' pages."""
        for t, f in self.futures.pop(layer, ()):
            err = f.exception()  # waits
            if err is not None:
                self.errors.setdefault(t.op_id, err)
        if self.read is not None and not self.done_reading:
            self._finish_read()

    def _finish_read(self) -> None:
        self.done_reading = True
        n = sum(len(t) for t in self.ssd)
        try:
            ok = self.read.result()
        except Exception as e:  # noqa: BLE001 -- the whole read failed: every block recomputed
            log.error("saria: SSD read failed: %s", e)
            ok = np.zeros(n, bool)
        end = time.perf_counter()
        c = self.coord
        n_bytes = n * c.reader.row_bytes  # this rank's part of each block (the whole block at TP 1)
        c.totals["ssd_bytes"] += n_bytes
        c.totals["ssd_us"] += int((end - self.read_start) * 1e6)
        if c.mode == "serial" or not any(self.futures.values()):
            c.ssd_Bps = _ewma(c.ssd_Bps, n_bytes / max(end - self.read_start, 1e-9))
        start = 0
        for t in self.ssd:
            mask = ok[start: start + len(t)]
            if not mask.all():
                self.failed.append((t, [b for b, m in zip(t.dst_ids, mask) if not m],
                                    [h for h, m in zip(t.src_ids, mask) if not m]))
            start += len(t)
        c.totals["ssd_blocks_failed"] += int(np.count_nonzero(~ok))

    def finish(self) -> None:
        """Every layer in place (the step's loads end)."""
        for layer in range(self.coord.num_layers):
            self.layer_ready(layer)
        self.coord.totals["load_us"] += int((time.perf_counter() - self.t0) * 1e6)


def _ewma(old: float, sample: float, weight: float = 0.3) -> float:
    return (1 - weight) * old + weight * sample
