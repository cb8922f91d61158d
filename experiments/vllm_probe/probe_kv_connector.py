"""A logging KVConnectorBase_V1 subclass for vLLM 0.32 (CPU).

Loaded by vLLM through
    KVTransferConfig(kv_connector="ProbeConnector",
                     kv_connector_module_path="probe_kv_connector", ...)
(the probe dir must be on PYTHONPATH of the engine-core and worker processes).

It is also a *minimal working* prefix connector: whole KV blocks are stored on
disk keyed by vLLM's block hash (request.block_hashes), so a second prompt that
shares a prefix with an earlier one loads those blocks instead of recomputing.
Every call is appended as one JSON line to extra_config["log_path"].
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)


def _t(x: Any) -> Any:
    """Compact description of a tensor for the log."""
    if isinstance(x, torch.Tensor):
        d = {"shape": list(x.shape), "dtype": str(x.dtype), "device": str(x.device)}
        if x.numel() <= 16:
            d["values"] = x.tolist()
        else:
            d["head"] = x.flatten()[:8].tolist()
        return d
    return x


@dataclass
class ProbeMeta(KVConnectorMetadata):
    # req_id -> list of (block_id, block_hash_hex)
    loads: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    stores: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    step: int = 0


class ProbeConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config
        self.log_path = extra["log_path"]
        self.store_dir = extra["store_dir"]
        os.makedirs(self.store_dir, exist_ok=True)
        self.block_size = vllm_config.cache_config.block_size
        # scheduler state
        self._step = 0
        self._local_hit: dict[str, int] = {}
        self._pending_load: dict[str, list[tuple[int, str]]] = {}
        self._stored: set[str] = set()
        self._take_events_calls = 0
        # block hashes live on vllm.v1.request.Request, not on NewRequestData,
        # so capture them in get_num_new_matched_tokens for build_connector_meta.
        self._hashes: dict[str, list[str]] = {}
        # worker state
        self.kv_caches: dict[str, torch.Tensor] = {}
        cc = vllm_config.cache_config
        self._log(
            "__init__",
            role=role.name,
            kv_connector_extra_config=extra,
            kv_role=self._kv_transfer_config.kv_role,
            block_size=cc.block_size,
            hash_block_size=cc.hash_block_size,
            prefix_caching_hash_algo=cc.prefix_caching_hash_algo,
            enable_prefix_caching=cc.enable_prefix_caching,
            kv_cache_layout=cc.kv_cache_layout,
            kv_cache_config_num_blocks=kv_cache_config.num_blocks,
            kv_cache_config_layout=kv_cache_config.kv_cache_layout,
            kv_cache_config_hash_block_size=kv_cache_config.hash_block_size,
            kv_cache_groups=[
                {
                    "layers": g.layer_names,
                    "spec": type(g.kv_cache_spec).__name__,
                    "block_size": g.kv_cache_spec.block_size,
                }
                for g in kv_cache_config.kv_cache_groups
            ],
            kv_cache_tensors=[
                {
                    "size": t.size,
                    "layers": t.layers,
                    "layer_stride": t.layer_stride,
                    "block_stride": t.block_stride,
                    "offset": t.offset,
                    "host_resident": t.host_resident,
                }
                for t in kv_cache_config.kv_cache_tensors
            ],
        )

    # ------------------------------------------------------------ utilities
    def _log(self, method: str, **kw: Any) -> None:
        rec = {
            "t": round(time.time(), 4),
            "pid": os.getpid(),
            "thread": threading.current_thread().name,
            "role": self._role.name,
            "method": method,
            **kw,
        }
        with open(self.log_path, "a") as f:
            f.write(json.dumps(rec, default=str) + "\n")

    def _path(self, h: str) -> str:
        return os.path.join(self.store_dir, h + ".pt")

    @staticmethod
    def _bypass(request) -> bool:
        sp = getattr(request, "sampling_params", None)
        return bool(sp is not None and sp.extra_args and sp.extra_args.get("probe_bypass"))

    # ============================================================ scheduler
    def on_new_request(self, request) -> None:
        self._log(
            "on_new_request",
            req_id=request.request_id,
            num_prompt_tokens=request.num_prompt_tokens,
            num_block_hashes=len(request.block_hashes),
            block_hash_type=type(request.block_hashes[0]).__name__ if request.block_hashes else None,
            block_hash_len=len(request.block_hashes[0]) if request.block_hashes else None,
            first_block_hash=request.block_hashes[0].hex() if request.block_hashes else None,
            cache_salt=request.cache_salt,
            lora_request=request.lora_request,
            kv_transfer_params=request.kv_transfer_params,
        )

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        bs = self.block_size
        self._hashes[request.request_id] = [h.hex() for h in request.block_hashes]
        n_hit = 0
        if not self._bypass(request):
            # Never claim the whole prompt: vLLM must compute >= 1 token.
            max_blocks = (request.num_tokens - 1) // bs
            for h in request.block_hashes[:max_blocks]:
                if not os.path.exists(self._path(h.hex())):
                    break
                n_hit += 1
        ext = max(0, n_hit * bs - num_computed_tokens)
        self._local_hit[request.request_id] = num_computed_tokens
        self._log(
            "get_num_new_matched_tokens",
            req_id=request.request_id,
            num_computed_tokens=num_computed_tokens,
            num_tokens=request.num_tokens,
            num_block_hashes=len(request.block_hashes),
            ret=(ext, False),
        )
        return ext, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        block_ids = blocks.get_block_ids()
        self._log(
            "update_state_after_alloc",
            req_id=request.request_id,
            block_ids=block_ids,
            num_external_tokens=num_external_tokens,
        )
        if num_external_tokens > 0:
            bs = self.block_size
            first = self._local_hit.get(request.request_id, 0) // bs
            last = first + num_external_tokens // bs
            self._pending_load[request.request_id] = [
                (block_ids[0][i], request.block_hashes[i].hex()) for i in range(first, last)
            ]

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        self._step += 1
        meta = ProbeMeta(step=self._step)
        meta.loads = self._pending_load
        self._pending_load = {}
        bs = self.block_size
        new_reqs = []
        for nr in scheduler_output.scheduled_new_reqs:
            n_sched = scheduler_output.num_scheduled_tokens[nr.req_id]
            new_reqs.append(
                {
                    "req_id": nr.req_id,
                    "num_prompt_tokens": len(nr.prompt_token_ids or []),
                    "block_ids": nr.block_ids,
                    "num_computed_tokens": nr.num_computed_tokens,
                    "num_scheduled_tokens": n_sched,
                }
            )
            if nr.sampling_params and (nr.sampling_params.extra_args or {}).get("probe_bypass"):
                continue
            # Store every full prompt block that will be computed by the end of this step.
            done_tokens = min(nr.num_computed_tokens + n_sched, len(nr.prompt_token_ids or []))
            hashes = self._hashes.get(nr.req_id, [])
            todo = []
            for i in range(done_tokens // bs):
                if i < len(hashes) and hashes[i] not in self._stored:
                    todo.append((nr.block_ids[0][i], hashes[i]))
                    self._stored.add(hashes[i])
            if todo:
                meta.stores[nr.req_id] = todo
        cr = scheduler_output.scheduled_cached_reqs
        self._log(
            "build_connector_meta",
            step=self._step,
            total_num_scheduled_tokens=scheduler_output.total_num_scheduled_tokens,
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs={
                "req_ids": cr.req_ids,
                "new_block_ids": cr.new_block_ids,
                "num_computed_tokens": cr.num_computed_tokens,
            },
            finished_req_ids=sorted(scheduler_output.finished_req_ids),
            has_sync_kv_loads=getattr(scheduler_output, "has_sync_kv_loads", None),
            new_block_ids_to_zero=scheduler_output.new_block_ids_to_zero,
            meta_loads=meta.loads,
            meta_stores=meta.stores,
        )
        return meta

    def update_connector_output(self, connector_output) -> None:
        if connector_output.finished_sending or connector_output.finished_recving:
            self._log("update_connector_output", out=repr(connector_output))

    def request_finished(self, request, block_ids: list[int]):
        self._log(
            "request_finished",
            req_id=request.request_id,
            block_ids=block_ids,
            num_computed_tokens=request.num_computed_tokens,
            num_block_hashes=len(request.block_hashes),
            status=str(request.status),
        )
        self._hashes.pop(request.request_id, None)
        return False, None

    def take_events(self):
        self._take_events_calls += 1
        if self._take_events_calls <= 2:
            self._log("take_events", calls=self._take_events_calls)
        return ()

    # ============================================================ worker
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        self.kv_caches = kv_caches
        info = {}
        for name, t in kv_caches.items():
            info[name] = {
                "type": type(t).__name__,
                "shape": list(t.shape),
                "dtype": str(t.dtype),
                "device": str(t.device),
                "stride": list(t.stride()),
                "contiguous": t.is_contiguous(),
                "data_ptr": t.data_ptr(),
                "untyped_storage_nbytes": t.untyped_storage().nbytes(),
                "storage_data_ptr": t.untyped_storage().data_ptr(),
            }
        self._log("register_kv_caches", kv_caches=info)

    def set_host_xfer_buffer_ops(self, copy_operation):
        self._log("set_host_xfer_buffer_ops", op=getattr(copy_operation, "__qualname__", repr(copy_operation)))

    def handle_preemptions(self, kv_connector_metadata):
        pass  # called every step; silent

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        am = forward_context.attn_metadata
        sm = forward_context.slot_mapping
        self._log(
            "start_load_kv",
            step=meta.step,
            kwargs=list(kwargs),
            attn_metadata_type=type(am).__name__,
            attn_metadata_keys=list(am) if isinstance(am, dict) else None,
            fwd_slot_mapping=({k: _t(v) for k, v in sm.items()} if isinstance(sm, dict) else _t(sm)),
            loads=meta.loads,
        )
        for req_id, blocks in meta.loads.items():
            for block_id, h in blocks:
                saved = torch.load(self._path(h))  # {layer_name: block tensor}
                for name, kv in self.kv_caches.items():
                    kv[block_id].copy_(saved[name])

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._log("wait_for_layer_load", layer_name=layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        am = attn_metadata
        self._log(
            "save_kv_layer",
            step=meta.step,
            layer_name=layer_name,
            kv_layer=_t(kv_layer) | {"is_registered_tensor": kv_layer.data_ptr() == self.kv_caches[layer_name].data_ptr()},
            attn_metadata_type=type(am).__name__,
            num_actual_tokens=getattr(am, "num_actual_tokens", None),
            slot_mapping=_t(getattr(am, "slot_mapping", None)),
            query_start_loc=_t(getattr(am, "query_start_loc", None)),
            seq_lens=_t(getattr(am, "seq_lens", None)),
            block_table=_t(getattr(am, "block_table", None)),
            kwargs=list(kwargs),
        )

    def wait_for_save(self):
        meta = self._get_connector_metadata()
        n = 0
        for req_id, blocks in meta.stores.items():
            for block_id, h in blocks:
                blob = {name: kv[block_id].clone() for name, kv in self.kv_caches.items()}
                tmp = self._path(h) + ".tmp"
                torch.save(blob, tmp)
                os.replace(tmp, self._path(h))
                n += 1
        self._log("wait_for_save", step=meta.step, blocks_saved=n, stores=meta.stores)

    def get_finished(self, finished_req_ids: set[str]):
        if finished_req_ids:
            self._log("get_finished", finished_req_ids=sorted(finished_req_ids))
        return None, None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return set()

    def shutdown(self):
        self._log("shutdown")
