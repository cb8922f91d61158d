"""``saria bench remote``: the cluster tier beside Mooncake's own client calls.

One run, one client, the same objects: a batch of ``batch`` objects of each
size is put and got back by

* **raw**: Mooncake's zero-copy calls on registered memory
  (``batch_put_from`` / ``batch_get_into``), the bytes as they are;
* **saria**: ``RemoteTier.put`` / ``get`` from and into the same registered
  rows -- a 64-byte header per object signed with HMAC-SHA256 over header,
  key and payload, the ``batch_is_exist`` a put asks first, the
  verification of every row;
* **unsigned** (``row_mac_off=True``, ``--compare-row-mac``): the same tier
  writing and reading unsigned v1 rows (crc32c only), another client of its
  own -- what signing costs, in the same run (``*_mac_paired_ratio``:
  signed over unsigned, each repetition's runs side by side). ``mac`` is
  the MAC's raw cost per block: ``SignedRowCodec.encode`` and ``verify`` of
  ``batch`` rows in memory, no transport.

The paths take turns within each repetition (the order rotates) after one uncounted warm-up
repetition, objects are removed after each, and the figure is payload bytes
per second (saria's headers not counted): the medians of each path, their
ratio, and the median of each repetition's own ratio (``*_paired_ratio``:
the two runs of a repetition are seconds apart, so they share the machine's
noise). A holder process (``saria.tiers.remote.holder``) contributes the
cluster's memory and the bench's client contributes none, so every byte
crosses the transport (loopback TCP here), as between two nodes. Lookup:
``batch_is_exist`` of ``lookup_keys`` keys, raw against ``RemoteTier.exists``
with its answer cache off.

**Core**: what the cache core adds on a node's load of a prefix only the
cluster holds -- ``TieredCache.lookup`` (the bounded ``batch_is_exist``
past the local prefix) and ``load`` (DRAM slots, the zero-copy get into
the pool, verification, the copy out of the pool) -- beside the tier alone
(``exists`` and ``get`` of the same objects into registered rows), ABBA,
the DRAM copies dropped after each core load so every load goes to the
cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from saria.tiers.remote import MooncakeMaster, RemoteTier, client_env
from saria.tiers.remote.holder import start_holder

__all__ = ["run_remote_bench"]


def _median(xs: Sequence[float]) -> float:
    return float(np.median(np.asarray(xs, np.float64)))


def _timed(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _mac_cost(codec, src: np.ndarray, keys: np.ndarray, reps: int) -> dict:
    """Median seconds per block of signing and of verifying ``src``'s rows."""
    heads = np.zeros((len(src), 64), np.uint8)
    idx = np.arange(len(src))
    enc, ver = [], []
    for _ in range(max(3, reps)):
        t, _ = _timed(lambda: codec.encode(heads, src, idx, keys))
        enc.append(t / len(src))
        t, ok = _timed(lambda: codec.verify(heads, src, idx, keys))
        if not ok.all():
            raise RuntimeError("mac cost: a signed row did not verify")
        ver.append(t / len(src))
    n = src.shape[1]
    return {"sign_us": _median(enc) * 1e6, "verify_us": _median(ver) * 1e6,
            "sign_GBps": n / _median(enc) / 1e9, "verify_GBps": n / _median(ver) / 1e9}


def _size_case(master: MooncakeMaster, object_bytes: int, batch: int, reps: int,
               seed: int, unsigned: bool = False) -> dict:
    settings = master.settings(segment_bytes=0, staging_rows=batch, deadline_s=120.0, lane=1,
                               exist_cache_s=0.0, local_buffer_bytes=16 << 20)
    tier = RemoteTier(settings, "bench", object_bytes)
    plain = RemoteTier(settings, "bench", object_bytes, signed=False) if unsigned else None
    store = tier._store  # the same client, for Mooncake's own calls
    rng = np.random.default_rng(seed)
    src = rng.integers(0, 256, (batch, object_bytes), dtype=np.uint8)
    dst = np.zeros_like(src)
    for t in (tier, plain):
        if t is not None:
            t.register(src)
            t.register(dst)
    modes = ["raw", "saria"] + (["unsigned"] if unsigned else [])
    ptr_src = [src.ctypes.data + i * object_bytes for i in range(batch)]
    ptr_dst = [dst.ctypes.data + i * object_bytes for i in range(batch)]
    sizes = [object_bytes] * batch
    rates: dict[str, list[float]] = {f"{m}_{op}": [] for m in modes for op in ("put", "get")}
    payload = batch * object_bytes
    try:
        for rep in range(-1, reps):  # rep -1 warms every path (the holder's pages) uncounted
            k = (rep + 1) % len(modes)
            order = modes[k:] + modes[:k] if rep % 2 == 0 else (modes[k:] + modes[:k])[::-1]
            for mode in order:
                keys = rng.integers(0, 256, (batch, 32), dtype=np.uint8)
                dst[:] = 0
                if mode == "raw":
                    names = [f"raw/{k.tobytes().hex()}" for k in keys]
                    tp, rc = _timed(lambda: store.batch_put_from(names, ptr_src, sizes))
                    if any(r != 0 for r in rc):
                        raise RuntimeError(f"raw put failed: {rc}")
                    tg, rc = _timed(lambda: store.batch_get_into(names, ptr_dst, sizes))
                    if any(r != object_bytes for r in rc):
                        raise RuntimeError(f"raw get failed: {rc}")
                    store.batch_remove(names, True)
                else:
                    t = tier if mode == "saria" else plain
                    tp, put = _timed(lambda: t.put(keys, src))
                    if not put.stored.all():
                        raise RuntimeError(f"{mode} put failed: {t.snapshot()['counters']}")
                    tg, got = _timed(lambda: t.get(keys, dst))
                    if not got.ok.all():
                        raise RuntimeError(f"{mode} get failed: {t.snapshot()['counters']}")
                    t.remove(keys, force=True)
                if not np.array_equal(dst, src):
                    raise RuntimeError(f"{mode} get returned other bytes")
                if rep >= 0:
                    rates[f"{mode}_put"].append(payload / tp)
                    rates[f"{mode}_get"].append(payload / tg)
        mac = _mac_cost(tier.codec, src, rng.integers(0, 256, (batch, 32), dtype=np.uint8), reps)
    finally:
        tier.close()
        if plain is not None:
            plain.close()
    out = {"object_bytes": object_bytes, "batch": batch, "reps": reps, "mac": mac}
    for k, v in rates.items():
        out[f"{k}_GBps"] = _median(v) / 1e9
        out[f"{k}_runs_GBps"] = [x / 1e9 for x in v]
    for op in ("put", "get"):
        out[f"{op}_ratio"] = out[f"saria_{op}_GBps"] / out[f"raw_{op}_GBps"]
        paired = [a / b for a, b in zip(rates[f"saria_{op}"], rates[f"raw_{op}"])]
        out[f"{op}_paired_ratio"] = _median(paired)  # each repetition's two runs side by side
        if unsigned:
            paired = [a / b for a, b in zip(rates[f"saria_{op}"], rates[f"unsigned_{op}"])]
            out[f"{op}_mac_paired_ratio"] = _median(paired)
    return out


def _core_case(master: MooncakeMaster, object_bytes: int, batch: int, reps: int,
               seed: int) -> dict:
    from saria.runtime import CacheConfig, TieredCache

    settings = master.settings(segment_bytes=0, staging_rows=batch, deadline_s=120.0, lane=1,
                               exist_cache_s=0.0, local_buffer_bytes=16 << 20,
                               max_lookup_keys=batch)
    tier = RemoteTier(settings, "bench-core", object_bytes)
    cache = TieredCache(CacheConfig(block_bytes=object_bytes, dram_bytes=2 * batch * object_bytes,
                                    write_mode="sync"), remote=tier)
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 256, (batch, 32), dtype=np.uint8)
    src = rng.integers(0, 256, (batch, object_bytes), dtype=np.uint8)
    out = np.zeros_like(src)
    tier.register(out)
    rates: dict[str, list[float]] = {"tier": [], "core": []}
    try:
        if not tier.put(keys, src).stored.all():
            raise RuntimeError(f"core case: put failed: {tier.snapshot()['counters']}")
        for rep in range(-1, reps):
            for mode in (("tier", "core") if rep % 2 == 0 else ("core", "tier")):
                out[:] = 0
                if mode == "tier":
                    t, ok = _timed(lambda: tier.exists(keys).all() and tier.get(keys, out).ok.all())
                else:
                    def core() -> bool:
                        return (cache.lookup(keys).num_blocks == batch
                                and cache.load(keys, out).remote_blocks == batch)
                    t, ok = _timed(core)
                    cache.remove(keys)  # its DRAM copies: the next load goes to the cluster again
                if not ok or not np.array_equal(out, src):
                    raise RuntimeError(f"core case: {mode} load returned other bytes")
                if rep >= 0:
                    rates[mode].append(batch * object_bytes / t)
    finally:
        cache.close()
        tier.close()
    paired = [a / b for a, b in zip(rates["core"], rates["tier"])]
    return {"object_bytes": object_bytes, "batch": batch, "reps": reps,
            "tier_GBps": _median(rates["tier"]) / 1e9, "core_GBps": _median(rates["core"]) / 1e9,
            "core_paired_ratio": _median(paired)}


def _lookup_case(master: MooncakeMaster, n_keys: int, calls: int, seed: int) -> dict:
    settings = master.settings(segment_bytes=0, deadline_s=10.0, exist_cache_s=0.0,
                               max_lookup_keys=max(64, n_keys))
    tier = RemoteTier(settings, "bench", 4096)
    store = tier._store
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 256, (n_keys, 32), dtype=np.uint8)
    half = np.zeros((n_keys // 2, 4096), np.uint8)
    tier.put(keys[: n_keys // 2], half)  # half of them present
    names = [tier.codec.key(k.tobytes()) for k in keys]
    lat: dict[str, list[float]] = {"raw": [], "saria": []}
    try:
        for i in range(calls):
            for mode in (("raw", "saria") if i % 2 == 0 else ("saria", "raw")):
                if mode == "raw":
                    t, _ = _timed(lambda: store.batch_is_exist(names))
                else:
                    t, _ = _timed(lambda: tier.exists(keys))
                lat[mode].append(t)
        tier.remove(keys, force=True)
    finally:
        tier.close()
    out: dict = {"keys": n_keys, "calls": calls}
    for mode, v in lat.items():
        p50, p99 = np.percentile(np.asarray(v) * 1e6, [50, 99])
        out[f"{mode}_p50_us"], out[f"{mode}_p99_us"] = float(p50), float(p99)
    return out


def run_remote_bench(object_sizes: Sequence[int], *, batch: int = 8, reps: int = 5,
                     lookup_keys: int = 64, lookup_calls: int = 500,
                     holder_bytes: int | None = None, seed: int = 0, compare_row_mac: bool = False,
                     progress: Callable[[str], None] | None = None) -> dict:
    """Starts a master and a holder on loopback, runs every case, stops them."""
    client_env()
    need = 2 * batch * (max(object_sizes) + 64) + (64 << 20)
    holder_bytes = holder_bytes or max(256 << 20, need * 2)
    with MooncakeMaster() as master:
        holder = start_holder(master.settings(), holder_bytes)
        try:
            sizes = []
            for i, size in enumerate(object_sizes):
                if progress:
                    progress(f"objects of {size / 2**20:g} MiB")
                sizes.append(_size_case(master, int(size), batch, reps, seed + i, compare_row_mac))
            core = []
            for i, size in enumerate(object_sizes):
                if progress:
                    progress(f"core loads of {size / 2**20:g} MiB blocks")
                core.append(_core_case(master, int(size), batch, reps, seed + 100 + i))
            if progress:
                progress(f"lookups of {lookup_keys} keys")
            lookup = _lookup_case(master, lookup_keys, lookup_calls, seed)
        finally:
            holder.stdin.close()
            try:
                holder.wait(timeout=10)
            except Exception:  # noqa: BLE001
                holder.kill()
                holder.wait()
    return {"transport": "tcp (loopback)", "holder_bytes": holder_bytes, "sizes": sizes,
            "core": core, "lookup": lookup}
