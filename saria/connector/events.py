"""saria's residency events in vLLM's own KV-event format.

DRAM is vLLM's ``CPU`` medium and the SSD its ``STORAGE`` medium, ``locality`` ``LOCAL``
(the engine's own storage; a cluster tier would be ``REMOTE``). Block hashes
are saria's block keys; they equal the engine's own block hashes when the
engine hashes with the same algorithm and seed (``--prefix-caching-hash-algo
sha256_cbor`` and saria's default seed, vLLM's ``"vllm-none-hash"``), so a
KV-aware router can join them with the engine's GPU events. Token ids are
filled in for blocks stored from a request in the same step; blocks whose
tokens saria no longer has (SSD writes of DRAM victims, recovered blocks)
carry none, as vLLM's own offloading events do.
"""

from __future__ import annotations

from vllm.distributed.kv_events import (MEDIUM_CPU, MEDIUM_STORAGE, BlockRemoved, BlockStored,
                                        KVCacheEvent)
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

from saria.index import Tier
from saria.runtime import CacheEvent

MEDIUM = {Tier.DRAM: MEDIUM_CPU, Tier.SSD: MEDIUM_STORAGE}
# the SSD is the engine's own storage tier (vLLM's locality, relative to the publisher)
LOCALITY = {Tier.DRAM: None, Tier.SSD: "LOCAL"}


def to_vllm_events(events: list[CacheEvent], tokens_of: dict, block_size: int,
                   digest_size: int = 32) -> list[KVCacheEvent]:
    out: list[KVCacheEvent] = []
    h = lambda k: maybe_convert_block_hash(k[:digest_size])  # noqa: E731
    for ev in events:
        medium, locality = MEDIUM[ev.tier], LOCALITY[ev.tier]
        if ev.kind == "removed":
            out.append(BlockRemoved(block_hashes=[h(k) for k in ev.keys], medium=medium,
                                    locality=locality))
            continue
        known = [tokens_of.get(k) for k in ev.keys]
        if ev.chained and all(known):
            lora = known[0][1]
            out.append(BlockStored(
                block_hashes=[h(k) for k in ev.keys],
                parent_block_hash=h(ev.parent) if ev.parent is not None else None,
                token_ids=[t for toks, _ in known for t in toks], block_size=block_size,
                lora_id=lora.lora_int_id if lora else None, medium=medium,
                lora_name=lora.lora_name if lora else None, locality=locality))
            continue
        for k in ev.keys:  # no tokens: one self-contained event per block
            out.append(BlockStored(block_hashes=[h(k)], parent_block_hash=None, token_ids=[],
                                   block_size=0, lora_id=None, medium=medium, lora_name=None,
                                   locality=locality))
    return out
