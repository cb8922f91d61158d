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

from saria.bench.io.config import DEFAULT_LMCACHE_VENV, BenchIoError, IoBenchConfig
from saria.bench.io.run import run_io_bench, steps

__all__ = ["DEFAULT_LMCACHE_VENV", "BenchIoError", "IoBenchConfig", "run_io_bench", "steps"]
