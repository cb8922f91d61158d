"""Prefix-aware routing across a fleet, fed by KV events.

``FleetIndex`` learns from every node's events (``saria serve --events``, in
vLLM's ``KVEventBatch`` format, beside vLLM's own GPU events) which node holds
which block in which medium; ``StaticWeights`` and ``TierAware`` pick a node
for a request from it. ``EventSubscriber`` feeds an index from live
publishers. Usable from an existing Python router; the fleet replay uses the
same code.
"""

from saria.routing.index import BIT, FleetIndex
from saria.routing.scoring import (DYNAMO_WEIGHTS, LLMD_WEIGHTS, Choice, NodeCosts, NodeLoad,
                                   StaticWeights, TierAware)
from saria.routing.subscriber import EventSubscriber

__all__ = ["BIT", "DYNAMO_WEIGHTS", "LLMD_WEIGHTS", "Choice", "EventSubscriber", "FleetIndex",
           "NodeCosts", "NodeLoad", "StaticWeights", "TierAware"]
