"""Transfer coordination: how DRAM copies and SSD (GPUDirect Storage) reads
share the GPU's ingress link during a mixed-source reload."""

from saria.transfer.coordinator import (COORDINATOR_MODES, LinkModel, ReloadQueue, paced_dram_rate,
                                        reload_time)

__all__ = ["COORDINATOR_MODES", "LinkModel", "ReloadQueue", "paced_dram_rate", "reload_time"]
