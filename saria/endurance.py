"""SSD write-endurance budget: how long a drive lives under a write rate, and the reverse.

All quantities are in bytes, bytes per second, days and years (365 days, the datasheet
convention). A drive rated ``D`` drive writes per day (DWPD) over a warranty of ``Y`` years
may absorb, by the datasheet convention (JEDEC JESD218 "TBW"; e.g. a 3.84 TB 1-DWPD,
5-year drive is rated 7,008 TBW):

    writable_bytes   W     = C x D x 365 x Y                     (the lifetime budget, "TBW")
    daily budget           = C x D bytes per day  =  C x D / 86,400 B/s
    days to exhaustion     = W / (rate x 86,400)
    budget fraction        = rate x 86,400 / (C x D)             (1.0 = wears out at Y years)

Minimum capacity (SARIA paper, §2.2 "Endurance-constrained SSD provisioning": "At 1 DWPD,
sustaining B GB/s per GPU for five years requires at least C_min = 86.4 B TB of aggregate SSD
capacity per GPU"): B GB/s is B x 86,400 GB/day = 86.4 B TB/day, and a drive of C TB at D DWPD
may take C x D TB/day, so the write rate fits the daily budget, and the drive lasts exactly its
rated Y years, when

    C_min = 86.4 x B / D  TB        (B in GB/s; the rated years cancel out)

For a target life of L days instead of the rated 365 x Y, C_min scales by L / (365 x Y).
Worked example (the paper's §1, the brief): a 4 TB, 1-DWPD, 5-year drive may take
4 x 1 x 365 x 5 = 7,300 TB; at 1.21 GB/s (104.5 TB/day) that is gone in 69.8 days.

Several drives (``drives``): capacity is per drive; the write rate is spread evenly over the
drives unless per-drive rates are given, and the first drive to wear out sets the lifetime.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from saria.errors import ConfigError
from saria.units import SECONDS_PER_DAY

DAYS_PER_YEAR = 365
# DGX H100: 8 x 3.84 TB U.2 NVMe data/cache drives for 8 GPUs, i.e. one per GPU (NVIDIA DGX H100
# user guide, hardware overview); read-intensive drives of that class are rated 1 DWPD over a
# 5-year warranty (the brief's reference figures; check the datasheet of the actual drive).
DGX_H100_DRIVE_BYTES = 3_840_000_000_000
DEFAULT_DWPD = 1.0
DEFAULT_YEARS = 5.0


def _check(name: str, value: float, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ConfigError(name, f"expected a number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ConfigError(name, f"must be {'positive' if positive else 'non-negative'}, got {value!r}")
    if math.isinf(value):
        raise ConfigError(name, "must be finite")
    return float(value)


def writable_bytes(capacity_bytes: float, dwpd: float, years: float) -> float:
    """Bytes the drive may absorb over its rating: ``C x DWPD x 365 x years`` (TBW)."""
    c, d, y = _check("capacity", capacity_bytes), _check("dwpd", dwpd, positive=True), \
        _check("years", years, positive=True)
    return c * d * DAYS_PER_YEAR * y


def daily_budget_bytes(capacity_bytes: float, dwpd: float) -> float:
    """Bytes per day the rating allows on average: ``C x DWPD``."""
    return _check("capacity", capacity_bytes) * _check("dwpd", dwpd, positive=True)


def days_to_exhaustion(capacity_bytes: float, dwpd: float, years: float, write_rate_Bps: float) -> float:
    """Days of continuous writing at ``write_rate_Bps`` (B/s) until the rated budget is used.

    ``writable_bytes / (rate x 86,400)``; ``math.inf`` for a zero rate.
    """
    w = writable_bytes(capacity_bytes, dwpd, years)
    rate = _check("write_rate", write_rate_Bps)
    return math.inf if rate == 0 else w / (rate * SECONDS_PER_DAY)


def min_capacity_bytes(write_rate_Bps: float, dwpd: float, *, years: float | None = None,
                       lifetime_days: float | None = None) -> float:
    """Smallest capacity whose rating absorbs ``write_rate_Bps`` for the rated life.

    ``rate x 86,400 / DWPD`` bytes, i.e. 86.4 x B / DWPD TB for B GB/s (SARIA §2.2). With a
    target ``lifetime_days`` (needs ``years``): scaled by ``lifetime_days / (365 x years)``.
    """
    rate, d = _check("write_rate", write_rate_Bps), _check("dwpd", dwpd, positive=True)
    c = rate * SECONDS_PER_DAY / d
    if lifetime_days is None:
        return c
    if years is None:
        raise ConfigError("years", "needed with a target lifetime")
    return c * _check("target_days", lifetime_days, positive=True) / (
        DAYS_PER_YEAR * _check("years", years, positive=True))


def allowed_write_rate(capacity_bytes: float, dwpd: float, years: float | None = None,
                       lifetime_days: float | None = None) -> float:
    """Sustained write rate (B/s) that uses the budget up exactly at the target lifetime.

    Default target = the rated years, giving the daily budget as a rate: ``C x DWPD / 86,400``.
    With ``lifetime_days`` (needs ``years``): ``writable_bytes / (lifetime_days x 86,400)``.
    """
    if lifetime_days is None:
        return daily_budget_bytes(capacity_bytes, dwpd) / SECONDS_PER_DAY
    if years is None:
        raise ConfigError("years", "needed with a target lifetime")
    days = _check("target_days", lifetime_days, positive=True)
    return writable_bytes(capacity_bytes, dwpd, years) / (days * SECONDS_PER_DAY)


def budget_fraction(write_rate_Bps: float, capacity_bytes: float, dwpd: float) -> float:
    """Fraction of the daily write budget used: ``rate x 86,400 / (C x DWPD)``.

    Above 1.0 the drive wears out before its rated years (rated days / fraction).
    ``math.inf`` for a positive rate on a zero-capacity drive.
    """
    rate, budget = _check("write_rate", write_rate_Bps), daily_budget_bytes(capacity_bytes, dwpd)
    if budget == 0:
        return 0.0 if rate == 0 else math.inf
    return rate * SECONDS_PER_DAY / budget


@dataclass(frozen=True)
class EnduranceReport:
    """Every endurance figure for one setup: ``drives`` drives of ``capacity_bytes`` each,
    rated ``dwpd`` over ``years``, written at ``write_rate_Bps`` in total (B/s).

    ``per_drive_rates`` (B/s, one per drive) overrides the even spread. Totals (writable bytes,
    daily budget, allowed rate, minimum capacity) are over all drives; the lifetime is that of
    the first drive to wear out, and the budget fraction that of the busiest drive. The allowed
    rate and the minimum capacity assume the writes are spread evenly.
    """

    capacity_bytes: float
    dwpd: float = DEFAULT_DWPD
    years: float = DEFAULT_YEARS
    write_rate_Bps: float = 0.0
    drives: int = 1
    per_drive_rates: tuple[float, ...] | None = None
    target_days: float | None = None
    label: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.drives, bool) or not isinstance(self.drives, int) or self.drives < 1:
            raise ConfigError("drives", f"must be a positive whole number, got {self.drives!r}")
        writable_bytes(self.capacity_bytes, self.dwpd, self.years)  # validates all three
        _check("write_rate", self.write_rate_Bps)
        if self.target_days is not None:
            _check("target_days", self.target_days, positive=True)
        if self.per_drive_rates is not None:
            rates = tuple(_check("write_rate", r) for r in self.per_drive_rates)
            if len(rates) != self.drives:
                raise ConfigError("drives", f"{len(rates)} per-drive rates given for {self.drives} drives")
            object.__setattr__(self, "per_drive_rates", rates)
            object.__setattr__(self, "write_rate_Bps", float(sum(rates)))

    @property
    def drive_rates(self) -> tuple[float, ...]:
        """Write rate of each drive (B/s)."""
        return self.per_drive_rates or (self.write_rate_Bps / self.drives,) * self.drives

    @property
    def writable_bytes(self) -> float:
        return self.drives * writable_bytes(self.capacity_bytes, self.dwpd, self.years)

    @property
    def daily_budget_bytes(self) -> float:
        return self.drives * daily_budget_bytes(self.capacity_bytes, self.dwpd)

    @property
    def days_to_exhaustion(self) -> float:
        return min(days_to_exhaustion(self.capacity_bytes, self.dwpd, self.years, r) for r in self.drive_rates)

    @property
    def years_to_exhaustion(self) -> float:
        return self.days_to_exhaustion / DAYS_PER_YEAR

    @property
    def budget_fraction(self) -> float:
        return max(budget_fraction(r, self.capacity_bytes, self.dwpd) for r in self.drive_rates)

    @property
    def min_capacity_bytes(self) -> float:
        """Aggregate capacity (all drives) for the rated life at this rate: 86.4 x B / DWPD TB."""
        return min_capacity_bytes(self.write_rate_Bps, self.dwpd)

    @property
    def allowed_write_rate_Bps(self) -> float:
        """Total rate (all drives, even spread) that lasts exactly the rated years."""
        return self.drives * allowed_write_rate(self.capacity_bytes, self.dwpd)

    @property
    def target_write_rate_Bps(self) -> float | None:
        """Total rate (even spread) that lasts exactly ``target_days``; None without one."""
        if self.target_days is None:
            return None
        return self.drives * allowed_write_rate(self.capacity_bytes, self.dwpd, self.years, self.target_days)

    @property
    def target_min_capacity_bytes(self) -> float | None:
        """Aggregate capacity that lasts ``target_days`` at this rate; None without a target."""
        if self.target_days is None:
            return None
        return min_capacity_bytes(self.write_rate_Bps, self.dwpd, years=self.years,
                                  lifetime_days=self.target_days)

    def to_dict(self) -> dict:
        """Inputs and results as plain JSON-ready values; an infinite lifetime is ``None``."""

        def fin(x: float | None) -> float | None:
            return None if x is None or math.isinf(x) else x

        return {
            "label": self.label,
            "capacity_bytes": self.capacity_bytes,
            "drives": self.drives,
            "dwpd": self.dwpd,
            "years": self.years,
            "write_rate_Bps": self.write_rate_Bps,
            "drive_write_rates_Bps": list(self.drive_rates),
            "writable_bytes": self.writable_bytes,
            "daily_budget_bytes": self.daily_budget_bytes,
            "days_to_exhaustion": fin(self.days_to_exhaustion),
            "years_to_exhaustion": fin(self.years_to_exhaustion),
            "budget_fraction": fin(self.budget_fraction),
            "min_capacity_bytes": self.min_capacity_bytes,
            "allowed_write_rate_Bps": self.allowed_write_rate_Bps,
            "target_days": self.target_days,
            "target_write_rate_Bps": self.target_write_rate_Bps,
            "target_min_capacity_bytes": self.target_min_capacity_bytes,
        }


def replay_write_rates(data: Mapping, *, source: str = "replay") -> dict[str, float | list[float]]:
    """SSD write rate (B/s) of each policy in a ``saria replay --json`` result.

    Per policy, in order of preference: ``ssd_bytes_written_per_drive`` (a list: per-drive
    rates, returned as a list) with a duration; ``ssd_write_rate_Bps``; ``ssd_bytes_written``, divided by
    ``duration_s`` taken from the policy entry or else from ``config``. Raises ConfigError
    naming ``source`` and the missing key.
    """
    if not isinstance(data, Mapping) or not isinstance(data.get("policies"), Mapping):
        raise ConfigError(source, "expected a JSON object with a 'policies' object (saria replay --json)")
    config = data.get("config") or {}
    rates: dict[str, float | list[float]] = {}
    for name, entry in data["policies"].items():
        where = f"{source}: policies.{name}"
        if not isinstance(entry, Mapping):
            raise ConfigError(where, "expected an object")
        per_drive = "ssd_bytes_written_per_drive" in entry and (
            "duration_s" in entry or (isinstance(config, Mapping) and "duration_s" in config))
        if "ssd_write_rate_Bps" in entry and not per_drive:  # per-drive bytes say more: the drive count
            rates[name] = _check(f"{where}.ssd_write_rate_Bps", entry["ssd_write_rate_Bps"])
            continue
        key = "ssd_bytes_written_per_drive" if "ssd_bytes_written_per_drive" in entry else "ssd_bytes_written"
        if key not in entry:
            raise ConfigError(where, "missing key 'ssd_bytes_written' (or 'ssd_write_rate_Bps')")
        duration = entry.get("duration_s", config.get("duration_s") if isinstance(config, Mapping) else None)
        if duration is None:
            raise ConfigError(where, "missing key 'duration_s' (in the policy or in 'config'), "
                                     "needed to turn 'ssd_bytes_written' into a rate")
        seconds = _check(f"{where}.duration_s", duration, positive=True)
        written = entry[key]
        if isinstance(written, Sequence) and not isinstance(written, str):
            rates[name] = [_check(f"{where}.{key}", b) / seconds for b in written]
        else:
            rates[name] = _check(f"{where}.{key}", written) / seconds
    return rates


def reports_from_replay(source: str | Path | Mapping, *, capacity_bytes: float = DGX_H100_DRIVE_BYTES,
                        dwpd: float = DEFAULT_DWPD, years: float = DEFAULT_YEARS,
                        drives: int | None = None, target_days: float | None = None) -> dict[str, EnduranceReport]:
    """One :class:`EnduranceReport` per policy of a replay result (a path or the parsed JSON).

    ``drives`` defaults to the replay's per-drive count where it gives one, else 1; a
    per-drive list whose length differs from an explicit ``drives`` is an error.
    """
    if isinstance(source, Mapping):
        data, name = source, "replay"
    else:
        path = Path(source)
        name = f"replay-json {path}"
        try:
            data = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            raise ConfigError(name, "no such file") from None
        except orjson.JSONDecodeError as exc:
            raise ConfigError(name, f"not valid JSON: {exc}") from None
    reports = {}
    for policy, rate in replay_write_rates(data, source=name).items():
        if isinstance(rate, list):
            n = drives if drives is not None else len(rate)
            if len(rate) != n:
                raise ConfigError("drives", f"the replay's policy {policy!r} wrote to {len(rate)} drives, not {n}")
            reports[policy] = EnduranceReport(capacity_bytes, dwpd, years, drives=n, per_drive_rates=tuple(rate),
                                              target_days=target_days, label=policy)
        else:
            reports[policy] = EnduranceReport(capacity_bytes, dwpd, years, rate, drives=drives or 1,
                                              target_days=target_days, label=policy)
    return reports
