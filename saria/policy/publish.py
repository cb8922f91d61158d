"""Publishing admission: what a node puts into the cluster tier, and whether
a DRAM victim the cluster holds still needs a local SSD copy.

The cache core asks a ``PublishPolicy`` from one place (``saria.core.remote``)
at two moments, with the blocks' history (the index's counters, this
request or this eviction counted):

* ``on_access``: DRAM residents a request referenced. A block that proved
  reuse (``reuse >= min_reuse``: the index's reuse counts the requests that
  came back to a block after it was stored, so 1 is its first return) is
  worth a copy another node can find.
* ``on_evict``: DRAM victims. A victim with history (it proved reuse, or it
  has left DRAM before) is published before its slot is freed, so the fleet
  keeps it when this node lets go.

* ``on_store`` (only with ``computed``): the blocks a request computed, once
  they are in DRAM -- write-through publishing, every new block put as soon
  as it exists (LMCache's ``mooncakestore`` backend, SGLang HiCache's L3
  write-through). Off by default: a fleet's copy of a block that never comes
  back costs a put and cluster memory for nothing.

and ``keep_local`` for a victim the cluster already holds: only hot blocks
(``hits >= keep_local_hits``) keep a local SSD copy; the others are served
from the cluster, one copy per fleet instead of one per node -- SSD
endurance saved. ``keep_local_hits = 0`` keeps every SSD copy (publishing
then changes nothing local).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class PublishPolicy:
    """Masks, like the admission policies (see the module docstring)."""

    min_reuse: int = 1            # requests that came back to a block after it was stored
    accessed: bool = True         # publish reused DRAM residents a request referenced
    victims: bool = True          # publish DRAM victims with history before they leave
    keep_local_hits: int = 4      # a victim the cluster holds keeps its SSD copy at this many hits
    computed: bool = False        # write-through: publish every block a request computed

    def __post_init__(self) -> None:
        if self.min_reuse < 1:
            raise ValueError(f"publish.min_reuse must be >= 1, got {self.min_reuse}")
        if self.keep_local_hits < 0:
            raise ValueError(f"publish.keep_local_hits must be >= 0, got {self.keep_local_hits}")

    def on_access(self, reuse: np.ndarray, hits: np.ndarray) -> np.ndarray:
        """Residents a request referenced: publish the ones that proved reuse."""
        if not self.accessed:
            return np.zeros(len(reuse), bool)
        return np.asarray(reuse) >= self.min_reuse

    def on_evict(self, reuse: np.ndarray, hits: np.ndarray,
                 dram_evictions: np.ndarray) -> np.ndarray:
        """DRAM victims (this eviction counted): publish those with history."""
        if not self.victims:
            return np.zeros(len(reuse), bool)
        return (np.asarray(reuse) >= self.min_reuse) | (np.asarray(dram_evictions) >= 2)

    def on_store(self, count: int) -> np.ndarray:
        """Blocks a request computed, now in DRAM: all of them under write-through."""
        return np.full(count, self.computed, bool)

    def keep_local(self, hits: np.ndarray) -> np.ndarray:
        """Victims the cluster holds that still get a local SSD copy (hot ones)."""
        if self.keep_local_hits == 0:
            return np.ones(len(hits), bool)
        return np.asarray(hits) >= self.keep_local_hits


#: The named publishing choices: ``reuse`` (the default: what proved reuse,
#: and victims with history) and ``write-through`` (also every block a request
#: computed, as LMCache and HiCache publish; the fleet replay's choice, so its
#: cluster holds what any node computed, as the deployments it models do).
PUBLISH_POLICIES = {
    "reuse": PublishPolicy(),
    "write-through": PublishPolicy(computed=True),
}

__all__ = ["PUBLISH_POLICIES", "PublishPolicy"]
