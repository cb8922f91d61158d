"""What a replay reports per policy: SSD traffic, hits by tier, TTFT, endurance."""

from __future__ import annotations

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
    if replay.ssd_on:  # an SSD tier with capacity, under a policy that writes
        end = EnduranceReport(capacity_bytes=float(hw.ssd_bytes), dwpd=hw.dwpd,
                              years=hw.endurance_years, write_rate_Bps=rate,
                              drives=replay.n_drives, per_drive_rates=tuple(per_drive_rates))
        lifetime = end.days_to_exhaustion
        budget = end.budget_fraction
    else:
        lifetime, budget = float("inf"), 0.0
    rating = float(hw.ssd_bytes) * hw.dwpd * replay.n_drives / 86_400.0  # bytes per second
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
        "write_budget_fraction": budget,
        "write_excess_h": write_excess_h(st.write_log, rating, st.first_arrival),
        "write_day_peak_fraction": write_day_peak(st.write_log, rating),
        "ssd_blocks_written_distinct": written_blocks,
        "ssd_writes_never_read_fraction": unread_blocks / written_blocks if written_blocks else None,
        "dram_hit_bytes_share": hits["DRAM"] / max(hits["DRAM"] + hits["SSD"], 1),
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


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if len(x) else 0.0
