"""Sizes, rates and durations as people write them.

    parse_size("4TB") == 4_000_000_000_000      parse_size("512GiB") == 512 * 2**30
    parse_rate("1.2GB/s") == 1.2e9               parse_rate("300MBps") == 3e8
    parse_duration("5y") == 5 * 365 * 86400      format_size(3.84e12) == "3.84 TB"

Rules (the ``saria`` command line and configuration files use these):

* Decimal SI prefixes: K/KB, M/MB, G/GB, T/TB, P/PB are 10^3 .. 10^15 bytes (drive vendors
  quote capacities this way: a "3.84 TB" drive holds 3.84e12 bytes). Binary IEC prefixes:
  Ki/KiB, Mi/MiB, Gi/GiB, Ti/TiB, Pi/PiB are 2^10 .. 2^50. A bare number is bytes.
  The trailing "B" is optional; space between number and unit is allowed.
* Units are case-insensitive ("4tb", "4 Tb" is not: see below), except for the one case that means
  something else: **bits**. A unit whose final "b" is lower-case while a letter before it is
  upper-case ("Gb", "Mb", "Gib") is read as bits, and so is any rate written with "bps"
  ("Gbps", "gbps", "Mbps": the networking convention). Bits are rejected with a message
  saying so, because saria counts bytes and a silent factor of 8 is the worst outcome.
  An all-lower-case size unit ("4tb", "512gib", "1.2gb/s") is read as bytes: people type
  that meaning bytes, and a storage size in bits is rare enough that guessing bytes is safer
  than refusing.
* Rates: a size followed by "/s", "/sec", "/second", "ps" (bytes per second) or "/d",
  "/day" (bytes per day, converted to per second with 86,400 s/day). A bare number is B/s.
* "unlimited" (also "inf", "infinite", "infinity") gives ``math.inf`` only where the caller
  passes ``allow_unlimited=True``; negative numbers, NaN and empty strings are rejected.

Every error is a :class:`saria.errors.ConfigError` naming the value (``name``), e.g.
``size: cannot parse '4XB': unknown unit 'XB' (use B, KB, MB, GB, TB, PB, KiB, MiB, GiB,
TiB, PiB)``.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

from saria.errors import ConfigError

SECONDS_PER_DAY = 86_400
# Drive datasheets count a year as 365 days when they turn DWPD into TBW.
SECONDS_PER_YEAR = 365 * SECONDS_PER_DAY

_PREFIX = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15}
_IEC = {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40, "pi": 2**50}
_UNIT_HELP = "use B, KB, MB, GB, TB, PB, KiB, MiB, GiB, TiB, PiB"
_MAX_FLOAT = 1.7976931348623157e308
_UNLIMITED = {"unlimited", "inf", "+inf", "infinite", "infinity"}

# number, optional spaces, the rest (unit and any rate suffix); "_" groups digits as in Python.
_NUMBER = re.compile(r"^\s*([+-]?(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*(.*?)\s*$")
_PER_SECOND = ("/second", "/sec", "/s", "ps")
_PER_DAY = ("/day", "/d")


def _unit_factor(unit: str, name: str, text: str) -> int:
    """Bytes in one ``unit`` ("" for bytes); rejects bits and unknown units."""
    if unit.endswith("b") and any(c.isupper() for c in unit[:-1]):
        raise ConfigError(name, f"cannot parse {text!r}: {unit!r} means bits; give bytes "
                                f"(e.g. {unit[:-1]}B, or divide a bit count by 8)")
    u = unit.lower()
    if u.endswith("b"):
        u = u[:-1]
    if u in _PREFIX:
        return _PREFIX[u]
    if u in _IEC:
        return _IEC[u]
    raise ConfigError(name, f"cannot parse {text!r}: unknown unit {unit!r} ({_UNIT_HELP})")


def _number(value: str, name: str, text: str) -> Decimal:
    try:
        return Decimal(value.replace("_", ""))
    except InvalidOperation:
        raise ConfigError(name, f"cannot parse {text!r}: {value!r} is not a number") from None


def _as_number(x: Decimal) -> int | float:
    # Decimal arithmetic keeps "3.84TB" exactly 3840000000000, so whole byte counts are ints.
    return int(x) if x == x.to_integral_value() else float(x)


def _finite(x: int | float, name: str, text: str) -> int | float:
    if not -_MAX_FLOAT <= x <= _MAX_FLOAT:  # e.g. "1e400": would become inf downstream
        raise ConfigError(name, f"cannot parse {text!r}: too large")
    return x


def _check_plain(value: object, name: str, allow_unlimited: bool) -> int | float:
    """Validate a number passed as a number rather than as text."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(name, f"expected a string or a number, got {type(value).__name__}")
    if math.isnan(value):
        raise ConfigError(name, "NaN is not a valid value")
    if value < 0:
        raise ConfigError(name, f"must not be negative, got {value!r}")
    if math.isinf(value) and not allow_unlimited:
        raise ConfigError(name, "must be finite ('unlimited' is not accepted here)")
    return value


def _split(text: object, name: str, allow_unlimited: bool) -> tuple[Decimal | float, str]:
    """Common front end: returns (number, rest-of-text) or (math.inf, "")."""
    if not isinstance(text, str):
        return _check_plain(text, name, allow_unlimited), ""
    s = text.strip()
    if not s:
        raise ConfigError(name, "empty value (expected e.g. 4TB, 512GiB, 1.2GB/s)")
    low = s.lower()
    if low in _UNLIMITED:
        if not allow_unlimited:
            raise ConfigError(name, f"{text!r} is not accepted here: give a finite value")
        return math.inf, ""
    if low.startswith("-") and low[1:] in _UNLIMITED:
        raise ConfigError(name, f"cannot parse {text!r}: must not be negative")
    if low.lstrip("+-").startswith("nan"):
        raise ConfigError(name, f"cannot parse {text!r}: NaN is not a valid value")
    m = _NUMBER.match(s)
    if m is None:
        raise ConfigError(name, f"cannot parse {text!r}: expected a number with an optional "
                                f"unit, e.g. 4TB, 3.84 TB, 512GiB")
    num = _number(m.group(1), name, text)
    if num < 0:
        raise ConfigError(name, f"cannot parse {text!r}: must not be negative")
    return num, m.group(2)


def parse_size(text: str | float, *, name: str = "size", allow_unlimited: bool = False) -> int | float:
    """Bytes in ``text`` ("4TB", "3.84 T", "512GiB", "6.5e9", "0"; see the module rules).

    Returns an ``int`` when the byte count is whole, else a ``float``; ``math.inf`` for
    "unlimited" when ``allow_unlimited``. Numbers (int/float) are validated and returned.
    """
    num, unit = _split(text, name, allow_unlimited)
    if not isinstance(num, Decimal):
        return num
    if "/" in unit or unit.lower().endswith("ps"):
        raise ConfigError(name, f"cannot parse {text!r}: expected a size, not a rate")
    return _finite(_as_number(num * _unit_factor(unit, name, text)), name, text)


def parse_rate(text: str | float, *, name: str = "rate", allow_unlimited: bool = False) -> float:
    """Bytes per second in ``text`` ("1.2GB/s", "300MBps", "2TB/day", "6.5e9"; module rules).

    Per-day rates are divided by 86,400 s. A unit without a time suffix ("1.2GB") is taken
    as per second, as a bare number is.
    """
    num, rest = _split(text, name, allow_unlimited)
    if not isinstance(num, Decimal):
        return float(num)
    low = rest.lower()
    if low.endswith("bps") and not rest.endswith("Bps"):
        # "Gbps"/"gbps"/"Mbps": the networking convention is bits per second.
        raise ConfigError(name, f"cannot parse {text!r}: {rest!r} means bits per second; "
                                f"give bytes per second (e.g. GB/s; 8 Gbps = 1 GB/s)")
    per_second = 1
    for suffix, seconds in [(s, 1) for s in _PER_SECOND] + [(s, SECONDS_PER_DAY) for s in _PER_DAY]:
        if low.endswith(suffix):
            rest, per_second = rest[: -len(suffix)].rstrip(), seconds
            break
    return _finite(float(num * _unit_factor(rest, name, text) / per_second), name, text)


_DURATION = {
    "": 1, "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1,
    "ms": Decimal("0.001"),
    "m": 60, "min": 60, "mins": 60, "minute": 60, "minutes": 60,  # "m" is minutes, not months
    "h": 3600, "hr": 3600, "hrs": 3600, "hour": 3600, "hours": 3600,
    "d": SECONDS_PER_DAY, "day": SECONDS_PER_DAY, "days": SECONDS_PER_DAY,
    "w": 7 * SECONDS_PER_DAY, "wk": 7 * SECONDS_PER_DAY, "week": 7 * SECONDS_PER_DAY,
    "weeks": 7 * SECONDS_PER_DAY,
    "y": SECONDS_PER_YEAR, "yr": SECONDS_PER_YEAR, "yrs": SECONDS_PER_YEAR,
    "year": SECONDS_PER_YEAR, "years": SECONDS_PER_YEAR,
}


def parse_duration(text: str | float, *, name: str = "duration", allow_unlimited: bool = False) -> float:
    """Seconds in ``text`` ("5y", "70d", "12h", "30m", "90s", "2 weeks"; bare number = s).

    A year is 365 days (the datasheet convention for DWPD); "m" is minutes.
    """
    num, unit = _split(text, name, allow_unlimited)
    if not isinstance(num, Decimal):
        return float(num)
    factor = _DURATION.get(unit.lower())
    if factor is None:
        raise ConfigError(name, f"cannot parse {text!r}: unknown unit {unit!r} "
                                f"(use s, m, h, d, w, y)")
    return _finite(float(num * factor), name, text)


def format_size(n: float, *, binary: bool = False, digits: int = 4) -> str:
    """``n`` bytes as "3.84 TB" (decimal SI, default) or "512 GiB" (``binary``).

    ``digits`` significant digits, trailing zeros dropped; ``parse_size`` reads the result
    back to within that precision. ``math.inf`` gives "unlimited".
    """
    if math.isinf(n) and n > 0:
        return "unlimited"
    if math.isnan(n):
        return "nan"
    base, units = (1024, ("B", "KiB", "MiB", "GiB", "TiB", "PiB")) if binary else \
        (1000, ("B", "KB", "MB", "GB", "TB", "PB"))
    value, i = float(n), 0
    while abs(value) >= base and i < len(units) - 1:
        value, i = value / base, i + 1
    unit = units[i]
    text = f"{value:.{digits}g}"
    if "e" in text:  # beyond PB: write the plain number rather than 1.2e+03
        text = f"{value:.0f}"
    return f"{text} {unit}"


def format_rate(bytes_per_s: float, *, binary: bool = False, digits: int = 4) -> str:
    """``bytes_per_s`` as "1.21 GB/s" (see :func:`format_size`)."""
    return format_size(bytes_per_s, binary=binary, digits=digits) + "/s"


def format_duration(seconds: float) -> str:
    """``seconds`` as "69.8 days" / "5.0 years" / "12.0 hours", for reports."""
    if math.isinf(seconds):
        return "never"
    for unit, size in (("years", SECONDS_PER_YEAR), ("days", SECONDS_PER_DAY), ("hours", 3600),
                       ("minutes", 60)):
        if abs(seconds) >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.1f} s"
