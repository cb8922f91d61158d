"""What a replay reports per policy: SSD traffic, hits by tier, TTFT, endurance."""

from __future__ import annotations

import math

import numpy as np

from saria.endurance import EnduranceReport
from saria.sim.engine import Replay


def policy_report(replay: Replay) -> dict:
    """The JSON entry of one policy (keys that scripts rely on are stable:
    ssd_bytes_written, ssd_bytes_read, hit_ratio_tokens, dram_hit_ratio_tokens,
    ssd_hit_ratio_tokens, ttft_mean_s, ttft_p90_s, ttft_p99_s,
    ttft_worst25_mean_s, ssd_lifetime_days)."""
    st = replay.stats
    core = replay.cache.stats
    hw = replay.setup.preset.hardware
    ttft = np.asarray(st.ttft, dtype=float)
    written = st.ssd_bytes_written
    read = st.ssd_bytes_read
    duration = max(st.last_done - st.first_arrival, 1e-9) if st.requests else 0.0
    tokens = max(st.input_tokens, 1)
    hits = st.hit_tokens
    srt = np.sort(ttft)
    worst = srt[len(srt) - max(1, len(srt) // 4):] if len(srt) else srt
    rate = float(written.sum()) / duration if duration else 0.0
    per_drive_rates = [float(w) / duration if duration else 0.0 for w in written]
    # Endurance from the drive replayed (--ssd), not the preset's: a 200 GB
    # drive wears 19x faster than the preset's 3.84 TB under the same writes.
    capacity = replay.setup.ssd_bytes_per_drive
    if replay.ssd_on and math.isfinite(capacity):  # an SSD tier, under a policy that writes
        end = EnduranceReport(capacity_bytes=capacity, dwpd=hw.dwpd,
                              years=hw.endurance_years, write_rate_Bps=rate,
                              drives=replay.n_drives, per_drive_rates=tuple(per_drive_rates))
        lifetime = end.days_to_exhaustion
        budget = end.budget_fraction
    elif replay.ssd_on:  # an unlimited drive has no rating to wear out
        lifetime, budget = float("inf"), None
    else:
        lifetime, budget = float("inf"), 0.0
    # bytes per second the drives' rating allows (0 for an unlimited drive: no window check)
    rating = capacity * hw.dwpd * replay.n_drives / 86_400.0 if math.isfinite(capacity) else 0.0
    written_blocks, unread_blocks = replay.ssd_writes_never_read()
    return {
        "requests": st.requests,
        "input_tokens": st.input_tokens,
        "duration_s": duration,
        "ssd_bytes_written": int(written.sum()),
        "ssd_bytes_read": int(read.sum()),
        "state_bytes_read_dram": st.state_bytes_read["DRAM"],
        "state_bytes_read_ssd": st.state_bytes_read["SSD"],
        "ssd_bytes_written_per_drive": [int(x) for x in written],
        "ssd_bytes_read_per_drive": [int(x) for x in read],
        "ssd_write_rate_Bps": rate,
        "dram_evictions": core.dram_evictions,
        "ssd_evictions": core.ssd_evictions,
        "promoted_blocks": core.promoted_blocks,
        "hit_ratio_tokens": (hits["GPU"] + hits["DRAM"] + hits["SSD"]) / tokens,
        "gpu_hit_ratio_tokens": hits["GPU"] / tokens,
        "dram_hit_ratio_tokens": hits["DRAM"] / tokens,
        "ssd_hit_ratio_tokens": hits["SSD"] / tokens,
        "tier_by_tier_hit_blocks": st.baseline_hit_blocks,
        "unified_hit_blocks": st.unified_hit_blocks,
        "ttft_mean_s": float(ttft.mean()) if len(ttft) else 0.0,
        "ttft_p50_s": _pct(ttft, 50),
        "ttft_p90_s": _pct(ttft, 90),
        "ttft_p99_s": _pct(ttft, 99),
        "ttft_worst25_mean_s": float(worst.mean()) if len(worst) else 0.0,
        "gpu_utilization": (st.load_s + st.prefill_s) / duration if duration else 0.0,
        "reload_s_total": st.load_s,
        "prefill_s_total": st.prefill_s,
        "ssd_lifetime_days": None if lifetime == float("inf") else lifetime,
        "write_budget_fraction": budget,  # None: an unlimited drive
        "ssd_bytes_per_drive": None if math.isinf(capacity) else capacity,
        "ssd_drives": replay.n_drives,
        "gpu_queue": gpu_queue(st, duration),
        "write_excess_h": write_excess_h(st.write_log, rating, st.first_arrival),
        "write_day_peak_fraction": write_day_peak(st.write_log, rating),
        "ssd_blocks_written_distinct": written_blocks,
        "ssd_writes_never_read_fraction": unread_blocks / written_blocks if written_blocks else None,
        "dram_hit_bytes_share": hits["DRAM"] / max(hits["DRAM"] + hits["SSD"], 1),
        **_cluster_report(replay, hits, tokens),
    }


def write_excess_h(log, rating_Bps: float, start: float = 0.0) -> float:
    """The most a policy wrote above the drives' rating over any window of
    the replay, in hours of the rating: ``max over a <= b of (written in
    [a, b] - rating x (b - a)) / (rating x 3600)``. 0 when no window beats
    the rating; a token bucket of room B hours stays within B."""
    if not log or rating_Bps <= 0:
        return 0.0
    t = np.array([start] + [x[0] for x in log], float)
    w = np.array([0.0] + [float(x[1]) for x in log])
    # D(t) = written up to and including t, less the rating's accrual; the
    # excess is the largest rise of D (before the writes at a to after those at b)
    d_after = np.cumsum(w) - rating_Bps * t
    d_before = d_after - w
    low = np.minimum.accumulate(d_before)
    return max(float(np.max(d_after - low)), 0.0) / (rating_Bps * 3600.0)


def write_day_peak(log, rating_Bps: float, day_s: float = 86_400.0) -> float:
    """The most written in any window of a day, ``(t - day, t]``, as a share
    of a day's rating (budget admission's guarantee keeps it at most 1)."""
    if not log or rating_Bps <= 0:
        return 0.0
    t = np.array([x[0] for x in log], float)
    c = np.concatenate([[0.0], np.cumsum([float(x[1]) for x in log])])
    first = np.searchsorted(t, t - day_s, side="right")  # the window's first write
    return float(np.max(c[1:] - c[first])) / (rating_Bps * day_s)


def _cluster_report(replay: Replay, hits: dict, tokens: int) -> dict:
    """The core's own cluster tier (a preset with ``remote_bytes``; nothing otherwise)."""
    if getattr(replay, "cluster_model", None) is None:
        return {}
    core = replay.cache.stats
    return {"cluster_hit_ratio_tokens": hits.get("CLUSTER", 0) / tokens,
            "cluster_published_blocks": core.remote_published_blocks,
            "cluster_found_blocks": core.remote_found_blocks,
            "ssd_writes_skipped_cluster_blocks": core.ssd_writes_skipped_remote,
            "ssd_bytes_saved_cluster": core.ssd_writes_skipped_remote * replay.block_bytes}


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if len(x) else 0.0


# A queue that has not drained for this long while its wait kept rising is
# one the GPU cannot keep up with (the 12 h default slice's longest busy
# stretch is 0.5 h under dram-only; the 6 h window's 2.7 h, its wait rising
# from 19 to 26 minutes).
SATURATION_BUSY_S = 3600.0


def gpu_queue(st, duration: float) -> dict:
    """How the one GPU's FIFO queue fared: the work found queued on arrival
    (mean, P90, most), its longest busy stretch (arrivals that each found
    work queued), and ``saturated``: that stretch lasted at least
    ``SATURATION_BUSY_S`` and the wait in its last quarter of requests was
    longer than in its first -- arrivals outran the GPU, so TTFT there says
    more about the load than about the cache."""
    q = np.asarray(st.queue_s, dtype=float)
    t = np.asarray(st.arrival_s, dtype=float)
    i, j = longest_busy_run(q, t)
    busy_s = float(t[j] - t[i]) if j >= i else 0.0
    rising = False
    if j >= i:
        seg = q[i:j + 1]
        k = max(1, len(seg) // 4)
        rising = float(seg[-k:].mean()) > float(seg[:k].mean())
    return {"wait_mean_s": float(q.mean()) if len(q) else 0.0, "wait_p90_s": _pct(q, 90),
            "wait_max_s": float(q.max()) if len(q) else 0.0, "busy_longest_s": busy_s,
            "saturated": bool(busy_s >= SATURATION_BUSY_S and rising)}


def longest_busy_run(queued: np.ndarray, times: np.ndarray) -> tuple[int, int]:
    """First and last index of the longest run (in time, arrival to arrival)
    of consecutive arrivals that each found work queued; (0, -1) when none did."""
    busy = np.concatenate([[0], (queued > 0).astype(np.int8), [0]])
    edges = np.flatnonzero(np.diff(busy))
    if not len(edges):
        return 0, -1
    starts, ends = edges[0::2], edges[1::2]
    k = int(np.argmax(times[ends - 1] - times[starts]))
    return int(starts[k]), int(ends[k]) - 1
