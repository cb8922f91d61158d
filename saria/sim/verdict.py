"""What a replay's reports say to an operator: which policy to run on this
drive and this trace, and whether the GPU kept up at all.

``recommend`` picks, among the policies whose writes fit the drive's rating
(``write_budget_fraction <= 1``: the drive lasts its warranty at the
replay's rate), the one with the lowest mean TTFT, and says by how much it
beats the runner-up that also fits and what the fastest policy overall would
cost in endurance if it does not fit.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Recommendation:
    policy: str
    ttft_mean_s: float
    budget_fraction: float
    runner_up: str | None          # the next best that fits the rating
    runner_up_ttft_s: float | None
    faster: str | None             # the fastest policy overall, when it does not fit
    faster_ttft_s: float | None
    faster_budget: float | None
    faster_lifetime_days: float | None


def fits(report: dict) -> bool:
    """The policy's writes fit the drive's rating (an unlimited drive has none: no)."""
    b = report.get("write_budget_fraction")
    return b is not None and b <= 1.0


def recommend(results: dict[str, dict]) -> Recommendation | None:
    """The policy to run (see the module docstring); None when none fits."""
    ok = sorted((r["ttft_mean_s"], name) for name, r in results.items() if fits(r))
    if not ok:
        return None
    ttft, best = ok[0]
    runner = ok[1] if len(ok) > 1 else (None, None)
    fastest_ttft, fastest = min((r["ttft_mean_s"], n) for n, r in results.items())
    faster = fastest if fastest_ttft < ttft and not fits(results[fastest]) else None
    f = results[faster] if faster else {}
    return Recommendation(best, ttft, results[best]["write_budget_fraction"], runner[1], runner[0],
                          faster, f.get("ttft_mean_s"), f.get("write_budget_fraction"),
                          f.get("ssd_lifetime_days"))


def saturated(results: dict[str, dict]) -> list[str]:
    """Policies under which the GPU queue grew without draining (report's ``gpu_queue``)."""
    return [n for n, r in results.items() if r.get("gpu_queue", {}).get("saturated")]
