"""Experiment 10: saria inside LMCache -- LMCache's ``fs`` adapter against
saria's L2 adapter, through LMCache 0.5.6's own multiprocess StorageManager.

The same chunk stream for every configuration: the first sessions of the
bundled WEKA trace (12 h window of session starts, as ``saria replay``),
each request's full 256-token chunks (prefix-chained hashes, as LMCache's),
replayed in order, paced at `--speedup` times the trace's speed. Per request
LMCache's path: prefetch (L1, then the L2 adapter: lookup and lock, load),
read the hit prefix (bytes verified), write the rest into L1, which the
store controller mirrors to the L2 adapter. A chunk is 65,408 B (scaled
down from a real model's MiBs: the counts are what matters), so that saria's
slot -- 64-byte slot header, 64-byte chunk header, chunk -- is exactly 64 KiB;
the bytes of every 8th request's hits are checked.

Same DRAM for everyone: ``fs`` gets an L1 of `--l1-share` of the unique
chunks; saria's L1 is smaller by its DRAM buffer (`--buffer-share` of it).
saria's admission under ``full-duplicate``, ``saria`` (E2) and ``budget``
(a `--dwpd` drive of `--capacity-x` times the working set). The replay runs
`--speedup` times faster than the trace, and so does the clock saria's core
reads here: budget's day, its bucket and the return gaps are the trace's.

Then ``lmcache bench l2`` (store / lookup / load throughput) against ``fs``
(page cache), ``fs`` with O_DIRECT, and saria (full-duplicate, a 4-chunk
buffer so loads come from the drive). Medians of `--reps` runs.

    python experiments/10_lmcache_adapter.py             # ~20 min (3 x 4 replays of ~80 s)
    python experiments/10_lmcache_adapter.py --quick     # ~2 min

Writes runs.csv, bench_l2.csv, summary.json and lmcache_adapter.png.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _common as C

NAME = "10_lmcache_adapter"
CONFIGS = ("fs", "saria:full-duplicate", "saria:saria", "saria:budget")


def chunk_stream(sessions: int, limit: int | None):
    """[(trace time, [chunk hash, ...]), ...] in arrival order."""
    from saria.keys.trace import trace_block_keys
    from saria.traces import ArrivalModel, schedule

    trace = C.load_weka(sessions)
    out = []
    for sr in schedule(trace, ArrivalModel.from_spec(C.WEKA_ARRIVALS))[:limit]:
        r = sr.request
        keys = trace_block_keys(r.hash_ids, namespace=r.namespace, trace_block_size=64,
                                engine_block_size=256, num_tokens=r.input_tokens)
        h, hashes = b"", []
        for k in keys:  # prefix-chained, as LMCache's chunk hashes are
            h = hashlib.sha256(h + bytes(k)).digest()
            hashes.append(h)
        out.append((sr.time, hashes))
    return out


def replay(config: str, stream, unique: int, args, tmp: Path) -> dict:
    from saria.lmcache.harness import MPDriver, StoreCounter, fill_from_hash, l2_adapter, \
        storage_manager

    chunk = args.chunk_bytes
    l1 = max(64, int(unique * args.l1_share)) * chunk
    span = stream[-1][0] - stream[0][0]
    d = tmp / config.replace(":", "-")
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    if config == "fs":
        l2 = {"type": "fs", "base_path": str(d)}
    else:
        policy = config.split(":")[1]
        buffer = int(l1 * args.buffer_share)
        l1 -= buffer
        capacity = max(64 << 20, int(args.capacity_x * unique * slot_bytes(chunk)))
        params = {"path": str(d), "capacity": capacity,
                  "admission": policy, "dram": buffer, "chunk_bytes": chunk,
                  "dwpd": args.dwpd}
        l2 = {"type": "plugin", "module_path": "saria.lmcache", "class_name": "SariaL2Adapter",
              "adapter_params": params}
    # saria's clock runs at the replay's speed, as the replay's virtual clock
    # does: budget's day and room and the return gaps are then the trace's.
    import saria.runtime.cache as runtime_cache

    runtime_cache.wall_clock = lambda: time.monotonic() * args.speedup
    sm = storage_manager(l2, l1)
    try:
        counter = StoreCounter()
        sm.register_l2_listener(counter)
        drv = MPDriver(sm, chunk, fill_from_hash)
        tot = {"chunks": 0, "l1_hits": 0, "l2_hits": 0, "recomputed": 0, "written": 0,
               "mismatched": 0}
        t0, lag = time.monotonic(), 0.0
        for i, (t, hashes) in enumerate(stream):
            due = t0 + (t - stream[0][0]) / args.speedup
            now = time.monotonic()
            if now < due:
                time.sleep(due - now)
            else:
                lag = max(lag, now - due)
            drv.verify = i % 8 == 0
            r = drv.request(hashes)
            tot["chunks"] += len(hashes)
            for k in ("l1_hits", "l2_hits", "written", "mismatched"):
                tot[k] += getattr(r, k)
            tot["recomputed"] += len(hashes) - r.l1_hits - r.l2_hits  # past the hit prefix
            if args.progress and i % 200 == 0:
                print(f"  {config}: {i}/{len(stream)} requests", file=sys.stderr, flush=True)
        wall = time.monotonic() - t0
        time.sleep(1.0)  # the store controller's last batches
        adapter = l2_adapter(sm)
        if config == "fs":
            written = sum(f.stat().st_size for f in d.rglob("*.data"))
            stored_chunks = sum(1 for _ in d.rglob("*.data"))
        else:
            adapter.store.flush()
            st = adapter.report_status()
            written, stored_chunks = st["ssd_bytes_written"], st["ssd_writes"]
        return {"config": config, **tot, "ssd_bytes_written": int(written),
                "ssd_chunks_written": int(stored_chunks), "wall_s": round(wall, 1),
                "max_lag_s": round(lag, 2), "trace_span_s": round(span), "l1_bytes": l1}
    finally:
        sm.close()


def slot_bytes(chunk: int) -> int:
    from saria.lmcache.chunks import HEADER
    from saria.tiers.ssd import slot_bytes_for

    return slot_bytes_for(chunk + HEADER)


def bench_l2(name: str, l2: dict, args) -> dict:
    """One ``lmcache bench l2`` run; its store / lookup / load throughput."""
    out = Path(tempfile.mkstemp(suffix=".json")[1])
    cmd = [str(Path(sys.executable).with_name("lmcache")), "bench", "l2", "--l2-adapter",
           json.dumps(l2), "--num-keys", str(args.bench_keys), "--data-size-kb",
           str(args.bench_kib), "--rounds", "3", "--warmup-rounds", "1", "--l1-align-bytes", "4096",
           "--lookup-max-hit-rate", "1.0", "--no-skip-verify", "--format", "json",
           "--output", str(out), "-q"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "LMCACHE_DISABLE_BANNER": "1"})
    if p.returncode:
        C.fail(f"lmcache bench l2 ({name}) failed: {(p.stdout + p.stderr)[-2000:]}")
    metrics = json.loads(out.read_text())["metrics"]
    out.unlink()
    row = {"adapter": name}
    for m in metrics.values():
        if isinstance(m, dict) and "operation" in m:
            row[m["operation"].lower() + "_mb_s"] = round(float(m["throughput_avg_mbps"]), 1)
    return row


def _read_runs(path: Path) -> list[dict]:
    import csv

    if not path.exists():
        C.fail(f"--bench-only needs the replays of an earlier run: {path} is missing")
    with open(path, newline="") as f:
        return [{k: (float(v) if k.endswith("_s") else int(v)) if k != "config" else v
                 for k, v in r.items()} for r in csv.DictReader(f)]


def main() -> None:
    ap = C.parser(NAME, __doc__)
    ap.add_argument("--sessions", type=int, default=6, help="first N WEKA sessions (6)")
    ap.add_argument("--speedup", type=float, default=1000.0, help="replay speed vs the trace (1000)")
    ap.add_argument("--chunk-bytes", type=int, default=65408, help="bytes of one chunk (65408)")
    ap.add_argument("--l1-share", type=float, default=0.2,
                    help="DRAM for everyone, as a share of the unique chunks (0.2)")
    ap.add_argument("--buffer-share", type=float, default=0.125,
                    help="saria's DRAM buffer, as a share of that DRAM (0.125)")
    ap.add_argument("--capacity-x", type=float, default=1.5,
                    help="saria's SSD capacity, times the unique chunks (1.5)")
    ap.add_argument("--dwpd", type=float, default=0.3, help="the drive's rating for budget (0.3)")
    ap.add_argument("--reps", type=int, default=3, help="runs per configuration (3)")
    ap.add_argument("--bench-keys", type=int, default=256, help="lmcache bench l2 keys (256)")
    ap.add_argument("--bench-kib", type=int, default=1024, help="lmcache bench l2 KiB per key")
    ap.add_argument("--progress", action="store_true", help="requests done, on stderr")
    ap.add_argument("--bench-only", action="store_true",
                    help="only lmcache bench l2; the replays from --out's runs.csv")
    args = ap.parse_args()
    t_start, plt = C.start(args)
    try:
        import lmcache  # noqa: F401
    except ImportError:
        C.fail("LMCache is not installed: pip install 'saria[lmcache]'")
    if args.quick:
        args.sessions, args.reps, args.bench_keys, args.bench_kib = 2, 1, 32, 256
        args.speedup = 5000.0
    stream = chunk_stream(args.sessions, 150 if args.quick else None)
    unique = len({h for _, hs in stream for h in hs})
    print(f"{len(stream)} requests, {sum(len(h) for _, h in stream)} chunk references, "
          f"{unique} unique chunks, trace span {stream[-1][0] - stream[0][0]:.0f} s", flush=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="saria-e10-", dir=os.environ.get("SARIA_E10_DIR")) as tmp:
        if args.bench_only:  # the replays of an earlier run in --out
            runs = _read_runs(args.out / "runs.csv")
        for rep in range(0 if args.bench_only else args.reps):
            for config in CONFIGS:
                row = {"rep": rep, **replay(config, stream, unique, args, Path(tmp))}
                print(json.dumps(row), flush=True)
                runs.append(row)
            C.write_csv(args.out / "runs.csv", runs, list(runs[0]))
        from saria.lmcache.chunks import HEADER

        chunk = args.bench_kib << 10
        benches = []
        for rep in range(args.reps):
            for name, l2 in (
                ("fs", {"type": "fs", "base_path": f"{tmp}/b-fs"}),
                ("fs O_DIRECT", {"type": "fs", "base_path": f"{tmp}/b-fsd", "use_odirect": True}),
                # saria's buffer holds the benchmark's chunks (as fs's page cache
                # does), so the row is the adapter's own overhead; with a smaller
                # buffer the loads come from the SSD (BENCHMARKS.md: 4-chunk buffer).
                ("saria", {"type": "plugin", "module_path": "saria.lmcache",
                           "class_name": "SariaL2Adapter", "adapter_params": {
                               "path": f"{tmp}/b-saria", "admission": "full-duplicate",
                               "capacity": 2 * args.bench_keys * slot_bytes(chunk),
                               "dram": 2 * args.bench_keys * (chunk + HEADER),
                               "chunk_bytes": chunk}})):
                shutil.rmtree(l2.get("base_path") or l2["adapter_params"]["path"],
                              ignore_errors=True)  # each run starts on an empty directory
                row = {"rep": rep, **bench_l2(name, l2, args)}
                print(json.dumps(row), flush=True)
                benches.append(row)
    C.write_csv(args.out / "bench_l2.csv", benches, list(benches[0]))
    med = {}
    for config in CONFIGS:
        rs = [r for r in runs if r["config"] == config]
        med[config] = {k: statistics.median(r[k] for r in rs)
                       for k in ("ssd_bytes_written", "ssd_chunks_written", "l2_hits", "l1_hits",
                                 "recomputed", "chunks", "mismatched", "max_lag_s", "wall_s")}
    bmed = {}
    for name in ("fs", "fs O_DIRECT", "saria"):
        bs = [b for b in benches if b["adapter"] == name]
        bmed[name] = {k: statistics.median(b[k] for b in bs) for k in bs[0] if k.endswith("mb_s")}
    fs = med["fs"]["ssd_bytes_written"]
    summary = {"requests": len(stream), "unique_chunks": unique, "chunk_bytes": args.chunk_bytes,
               "args": {k: str(v) for k, v in vars(args).items()}, "replay": med,
               "writes_vs_fs": {c: round(m["ssd_bytes_written"] / fs, 3) for c, m in med.items()},
               "bench_l2": bmed, "seconds": round(time.perf_counter() - t_start)}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    labels = [c.replace("saria:", "saria\n") for c in CONFIGS]
    a1.bar(labels, [med[c]["ssd_bytes_written"] / 1e6 for c in CONFIGS], color="#4c72b0")
    a1.set_ylabel("SSD MB written (median)")
    a2.bar(labels, [med[c]["l2_hits"] for c in CONFIGS], color="#dd8452")
    a2.set_ylabel("chunks served by L2 (median)")
    png = C.save_figure(fig, f"LMCache MP, WEKA {args.sessions} sessions: fs vs saria adapter",
                        args.out / "lmcache_adapter.png")
    print(json.dumps(summary["writes_vs_fs"]), json.dumps(bmed))
    C.done(t_start, [args.out / "runs.csv", args.out / "bench_l2.csv",
                     args.out / "summary.json", png])


if __name__ == "__main__":
    main()
