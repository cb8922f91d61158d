"""saria: a tiered KV cache (GPU HBM -> pinned DRAM -> NVMe SSD) for LLM serving.

Parts, one module or folder each:

- ``saria.keys``    block identity: chained block hashes, trace-id keys
- ``saria.index``   the unified radix-tree metadata store (native core)
- ``saria.traces``  public trace loaders and their statistics
- ``saria.cli``     the ``saria`` command
"""

__version__ = "0.2.0"
