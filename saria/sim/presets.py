"""Hardware and model presets for the replay, each figure with its source.

Sizes are bytes, rates bytes/s, times seconds.

Sources:
[cfg]   the models' public config.json on Hugging Face (num_hidden_layers,
        num_key_value_heads, head_dim, hidden_size); KV bytes per token =
        layers x kv_heads x head_dim x 2 (K and V) x 2 bytes (bf16).
[h100]  NVIDIA H100 SXM datasheet: 989 TFLOP/s dense bf16; 80 GB HBM3.
[mfu]   SARIA brief / common prefill MFU on H100 ~0.55 (about 35K tok/s for an
        8B model at short context).
[pcie]  PCIe Gen5 x16 pinned host-to-device ~50 GB/s measured, Gen4 ~25 GB/s;
        pageable copies ~0.4x pinned (CUDA bandwidthTest-style measurements).
[nvme]  Datacenter NVMe datasheets: Gen4 (e.g. Samsung PM9A3 / Kioxia CD6)
        ~6.5 GB/s read, ~6 GB/s write (sequential, large blocks); Gen5 (e.g.
        Kioxia CM7 / Samsung PM1743) ~13 GB/s read, ~9.5 GB/s write.
[dgx]   NVIDIA DGX H100 user guide: 8x 3.84 TB U.2 NVMe data drives for 8
        GPUs (one per GPU); datacenter read-intensive drives are rated 1 DWPD.
[saria] SARIA paper (arXiv 2610.31169) §2.2: C_min = 86.4 B TB per GPU at 1 DWPD.
[nic]   NVIDIA DGX H100 user guide: one ConnectX-7 400 Gb/s (50 GB/s line rate)
        per GPU for the cluster fabric; the cluster tier is assumed to get 80% of
        it (40 GB/s) over RDMA.
[mc]    Mooncake Store here: batch_is_exist of 64 keys p50 60-107 us over
        loopback TCP (issue 22); an RDMA round trip to the master and the first
        byte of a transfer is taken as 50 us.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from saria.errors import ConfigError

GB = 1e9
TB = 1e12
KiB = 1024


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What prefill costs and what one token of KV weighs.

    ``kv_bytes_per_token`` counts the attention layers that keep KV (for a
    hybrid model only its full-attention layers); ``state_bytes`` is a hybrid
    model's recurrent state per sequence (0 for full attention);
    ``attn_layers`` is the number of layers whose attention cost grows with
    context (the quadratic term of the prefill FLOPs).
    """

    name: str
    params: float
    layers: int
    attn_layers: int
    hidden: int
    kv_bytes_per_token: int
    state_bytes: int = 0

    @property
    def hybrid(self) -> bool:
        return self.state_bytes > 0

    def prefill_flops(self, new_tokens: int, context_tokens: int) -> float:
        """FLOPs to prefill `new_tokens` after `context_tokens - new_tokens`
        cached ones: 2*N per new token plus causal attention
        2*attn_layers*d*(L^2 - h^2) (the brief's FLOPs ~ 2*N*L + 2*n_layer*d*L^2
        with the cached prefix h removed)."""
        h = context_tokens - new_tokens
        return 2.0 * self.params * new_tokens + 2.0 * self.attn_layers * self.hidden * (
            float(context_tokens) ** 2 - float(h) ** 2)


MODELS = {
    # [cfg] meta-llama/Meta-Llama-3-8B: 32 layers, 8 KV heads, head_dim 128, hidden 4096.
    "llama3-8b": ModelSpec("llama3-8b", 8.03e9, 32, 32, 4096, 32 * 8 * 128 * 2 * 2),
    # [cfg] Qwen/Qwen3-8B: 36 layers, 8 KV heads, head_dim 128, hidden 4096.
    "qwen3-8b": ModelSpec("qwen3-8b", 8.19e9, 36, 36, 4096, 36 * 8 * 128 * 2 * 2),
    # [cfg] Qwen/Qwen3-32B: 64 layers, 8 KV heads, head_dim 128, hidden 5120.
    "qwen3-32b": ModelSpec("qwen3-32b", 32.8e9, 64, 64, 5120, 64 * 8 * 128 * 2 * 2),
    # Qwen3.5-9B (hybrid, the brief's figures): 8 of 32 layers full attention,
    # 32 KiB of KV per token, ~51.5 MB of recurrent (linear-attention) state.
    "qwen3.5-9b": ModelSpec("qwen3.5-9b", 9.0e9, 32, 8, 4096, 32 * KiB, state_bytes=51_500_000),
}


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """One GPU server slice: a GPU, its share of host DRAM and its SSDs."""

    name: str
    gpu_flops: float = 989e12            # [h100] dense bf16
    mfu: float = 0.55                    # [mfu]
    gpu_cache_bytes: float = 20 * GB     # HBM left for the prefix cache (80 GB - weights - running batch)
    dram_bytes: float = 256 * GB         # pinned DRAM pool per GPU (2 TB DGX host / 8 GPUs)
    link_Bps: float = 50 * GB            # [pcie] Gen5 x16 pinned H2D
    dram_copy_Bps: float = 50 * GB       # [pcie] pinned; pageable would be 0.4x
    ssd_count: int = 1                   # [dgx] one drive per GPU
    ssd_read_Bps: float = 6.5 * GB       # [nvme] per drive, Gen4
    ssd_write_Bps: float = 6.0 * GB      # [nvme] per drive, Gen4
    ssd_bytes: float = 3.84 * TB         # [dgx] per drive
    dwpd: float = 1.0                    # [dgx]
    endurance_years: float = 5.0         # datacenter warranty period
    gds: bool = True                     # SSD -> GPU direct (else bounced via DRAM)
    pacing_efficiency: float = 0.9       # assumption: throttled chunked copies lose ~10%
    contention_ssd_share: float = 0.5    # assumption: GDS rate kept under unpaced DRAM copies
    remote_bytes: float = 0.0            # cluster memory saria's namespace may use (0: no cluster tier)
    remote_link_Bps: float = 40 * GB     # [nic] this GPU's share of the cluster fabric
    remote_latency_s: float = 50e-6      # [mc] one round trip (lookup, transfer start)

    @property
    def ssd_total_read_Bps(self) -> float:
        rate = self.ssd_count * self.ssd_read_Bps
        if not self.gds:  # bounced through a pinned DRAM buffer: also a host copy
            rate = min(rate, self.dram_copy_Bps)
        return min(rate, self.link_Bps)

    @property
    def prefill_flops_per_s(self) -> float:
        return self.gpu_flops * self.mfu


HARDWARE = {
    # PCIe Gen5 host link, one Gen4 NVMe per GPU (DGX H100-like).
    "h100-gen5-1ssd": HardwareSpec("h100-gen5-1ssd"),
    "h100-gen5-2ssd": HardwareSpec("h100-gen5-2ssd", ssd_count=2),
    # PCIe Gen4 host link (25 GB/s), one Gen4 NVMe.
    "h100-gen4-1ssd": HardwareSpec("h100-gen4-1ssd", link_Bps=25 * GB, dram_copy_Bps=25 * GB),
    "h100-gen4-2ssd": HardwareSpec("h100-gen4-2ssd", link_Bps=25 * GB, dram_copy_Bps=25 * GB,
                                   ssd_count=2),
    # Gen5 link with a Gen5 drive.
    "h100-gen5-gen5ssd": HardwareSpec("h100-gen5-gen5ssd", ssd_read_Bps=13 * GB,
                                      ssd_write_Bps=9.5 * GB),
    # No GPUDirect Storage: SSD reads bounce through a pinned DRAM buffer.
    "h100-gen5-nogds": HardwareSpec("h100-gen5-nogds", gds=False),
    # Pageable host memory (no pinned pool): 0.4x the pinned copy rate [pcie].
    "h100-gen5-pageable": HardwareSpec("h100-gen5-pageable", dram_copy_Bps=0.4 * 50 * GB),
    # A cluster tier (Mooncake Store over RDMA): assumption, 8 nodes lending
    # 512 GB of DRAM each, 4 TB for saria's namespace [nic] [mc].
    "h100-gen5-1ssd-cluster": HardwareSpec("h100-gen5-1ssd-cluster", remote_bytes=4 * TB),
}


@dataclass(frozen=True, slots=True)
class Preset:
    """A named (model, hardware, engine block size) triple."""

    name: str
    model: ModelSpec
    hardware: HardwareSpec
    block_size: int = 64  # tokens per block: WEKA's own granularity

    def with_(self, **changes) -> "Preset":
        hw = {k: v for k, v in changes.items() if k in HardwareSpec.__dataclass_fields__}
        rest = {k: v for k, v in changes.items() if k not in hw}
        out = replace(self, hardware=replace(self.hardware, **hw)) if hw else self
        return replace(out, **rest) if rest else out


def _presets() -> dict[str, Preset]:
    out = {}
    for m in MODELS.values():
        for h in HARDWARE.values():
            name = f"{m.name}/{h.name}"
            out[name] = Preset(name, m, h)
    return out


PRESETS = _presets()
#: The default: a full-attention 8B model on a DGX H100-like slice.
DEFAULT_PRESET = "qwen3-8b/h100-gen5-1ssd"


def get_preset(name: str) -> Preset:
    """A preset by name (``MODEL/HARDWARE``, or a model name alone for its
    default hardware); HARDWARE may also be a JSON file of measured figures
    (``saria bench reload --json``: ``MODEL/path/measured.json``); unknown
    names list the valid ones."""
    if name in PRESETS:
        return PRESETS[name]
    if name in MODELS:
        return PRESETS[f"{name}/h100-gen5-1ssd"]
    model, sep, hardware = name.partition("/")
    if sep and hardware.endswith(".json") and model in MODELS:
        hw = load_hardware(hardware)
        return Preset(f"{model}/{hw.name}", MODELS[model], hw)
    raise ConfigError("preset", f"unknown preset {name!r}; valid: "
                      f"{', '.join(sorted(PRESETS))} (or a model: {', '.join(MODELS)}; "
                      "or MODEL/measured.json)")


def load_hardware(path: str) -> HardwareSpec:
    """A ``HardwareSpec`` from a JSON file: ``{"hardware": {"base": NAME,
    FIELD: value, ...}}`` (what ``saria bench reload --json`` writes) or the
    inner object alone; fields not given come from the ``base`` preset."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise ConfigError("preset", f"cannot read {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ConfigError("preset", f"{path}:{e.lineno}: not valid JSON: {e.msg}") from None
    fields = data.get("hardware", data) if isinstance(data, dict) else None
    if not isinstance(fields, dict):
        raise ConfigError("preset", f"{path}: must hold a JSON object")
    fields = dict(fields)
    base = fields.pop("base", "h100-gen5-1ssd")
    if base not in HARDWARE:
        raise ConfigError("preset", f"{path}: unknown base hardware {base!r}; valid: "
                          f"{', '.join(HARDWARE)}")
    known = set(HardwareSpec.__dataclass_fields__) - {"name"}
    bad = sorted(set(fields) - known - {"name"})
    if bad:
        raise ConfigError("preset", f"{path}: unknown hardware field {bad[0]!r}; valid: "
                          f"{', '.join(sorted(known))}")
    name = str(fields.pop("name", os.path.basename(path)))
    try:
        return replace(HARDWARE[base], name=name, **fields)
    except TypeError as e:
        raise ConfigError("preset", f"{path}: {e}") from None
