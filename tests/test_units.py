"""saria.units: sizes, rates and durations as people write them."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from saria.errors import ConfigError
from saria.units import (
    format_duration,
    format_rate,
    format_size,
    parse_duration,
    parse_rate,
    parse_size,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4TB", 4 * 10**12),
        ("3.84T", 3_840_000_000_000),
        ("3.84 TB", 3_840_000_000_000),
        ("3.84tb", 3_840_000_000_000),  # all lower case: bytes
        ("512GiB", 512 * 2**30),
        ("512gib", 512 * 2**30),
        ("512 Gi", 512 * 2**30),
        ("1.5 GB", 1_500_000_000),
        ("1.5G", 1_500_000_000),
        ("6.5e9", 6_500_000_000),
        ("0", 0),
        ("0TB", 0),
        ("100", 100),
        ("100B", 100),
        ("100b", 100),  # a lone lower-case b: bytes (no prefix to make it bits)
        ("2KB", 2000),
        ("2K", 2000),
        ("2kB", 2000),
        ("2KiB", 2048),
        ("3MB", 3 * 10**6),
        ("3MiB", 3 * 2**20),
        ("1PB", 10**15),
        ("1PiB", 2**50),
        ("1TiB", 2**40),
        ("  4 TB  ", 4 * 10**12),
        ("1_000", 1000),
        ("+4TB", 4 * 10**12),
        (".5TB", 5 * 10**11),
    ],
)
def test_parse_size_spellings(text, expected):
    got = parse_size(text)
    assert got == expected
    assert isinstance(got, int)  # whole byte counts come back exact


def test_parse_size_fractional_bytes_is_a_float():
    assert parse_size("1.5") == 1.5


def test_parse_size_accepts_numbers():
    assert parse_size(4e12) == 4e12
    assert parse_size(7) == 7


def test_unlimited_only_where_allowed():
    assert parse_size("unlimited", allow_unlimited=True) == math.inf
    assert parse_size("INF", allow_unlimited=True) == math.inf
    with pytest.raises(ConfigError, match="not accepted here"):
        parse_size("unlimited")
    with pytest.raises(ConfigError, match="finite"):
        parse_size(math.inf)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("300MB/s", 3e8),
        ("1.2GB/s", 1.2e9),
        ("1.2 GB/s", 1.2e9),
        ("1.2gb/s", 1.2e9),
        ("1.21GB/s", 1.21e9),
        ("300MBps", 3e8),
        ("1GB/sec", 1e9),
        ("1 GiB/s", 2**30),
        ("6.5e9", 6.5e9),
        ("1.2GB", 1.2e9),  # no time suffix: per second
        ("86.4TB/day", 1e9),
        ("86.4TB/d", 1e9),
        ("0", 0.0),
        ("0 B/s", 0.0),
    ],
)
def test_parse_rate_spellings(text, expected):
    assert parse_rate(text) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5y", 5 * 365 * 86400), ("70d", 70 * 86400), ("12h", 12 * 3600), ("30m", 1800),
     ("90s", 90), ("90", 90), ("2 weeks", 14 * 86400), ("1.5d", 1.5 * 86400), ("250ms", 0.25)],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("func", "text", "message"),
    [
        (parse_size, "4XB", "unknown unit 'XB'"),
        (parse_size, "4 TB TB", "unknown unit"),
        (parse_size, "-4TB", "negative"),
        (parse_size, "-inf", "negative"),
        (parse_size, "nan", "NaN"),
        (parse_size, "NaN GB", "NaN"),
        (parse_size, "", "empty"),
        (parse_size, "   ", "empty"),
        (parse_size, "TB", "expected a number"),
        (parse_size, "abc", "expected a number"),
        (parse_size, "10Gb", "bits"),
        (parse_size, "10Mb", "bits"),
        (parse_size, "10Gib", "bits"),
        (parse_size, "1.2GB/s", "not a rate"),
        (parse_size, "1e400", "too large"),
        (parse_size, True, "expected a string or a number"),
        (parse_size, float("nan"), "NaN"),
        (parse_size, -1, "negative"),
        (parse_rate, "10Gbps", "bits per second"),
        (parse_rate, "10gbps", "bits per second"),
        (parse_rate, "10Mbps", "bits per second"),
        (parse_rate, "1Gb/s", "bits"),
        (parse_rate, "1.2XB/s", "unknown unit"),
        (parse_rate, "-1GB/s", "negative"),
        (parse_rate, "nan", "NaN"),
        (parse_rate, "", "empty"),
        (parse_rate, "unlimited", "not accepted here"),
        (parse_duration, "5 fortnights", "unknown unit"),
        (parse_duration, "-5d", "negative"),
    ],
)
def test_errors_are_config_errors_naming_the_value(func, text, message):
    with pytest.raises(ConfigError, match=message) as info:
        func(text, name="--flag")
    assert info.value.key == "--flag"
    assert str(info.value).startswith("--flag: ")
    assert "\n" not in str(info.value)


def test_unknown_unit_message_lists_the_units():
    with pytest.raises(ConfigError) as info:
        parse_size("4XB")
    assert str(info.value) == ("size: cannot parse '4XB': unknown unit 'XB' "
                               "(use B, KB, MB, GB, TB, PB, KiB, MiB, GiB, TiB, PiB)")


@pytest.mark.parametrize(
    ("n", "text"),
    [(3.84e12, "3.84 TB"), (4e12, "4 TB"), (0, "0 B"), (999, "999 B"), (1.5e9, "1.5 GB"),
     (7.3e15, "7.3 PB"), (512 * 2**30, "549.8 GB"), (math.inf, "unlimited")],
)
def test_format_size(n, text):
    assert format_size(n) == text


def test_format_size_binary_and_rate_and_duration():
    assert format_size(512 * 2**30, binary=True) == "512 GiB"
    assert format_rate(1.21e9) == "1.21 GB/s"
    assert format_duration(70 * 86400) == "70.0 days"
    assert format_duration(math.inf) == "never"


sizes = st.floats(min_value=0, max_value=1e21, allow_nan=False, allow_infinity=False)


@given(sizes)
def test_size_round_trip(x):
    # 4 significant digits: within 0.05% (plus an absolute half-byte for tiny values).
    assert parse_size(format_size(x)) == pytest.approx(x, rel=5e-4, abs=0.5)


@given(sizes)
def test_binary_size_round_trip(x):
    assert parse_size(format_size(x, binary=True)) == pytest.approx(x, rel=5e-4, abs=0.5)


@given(sizes)
def test_rate_round_trip(x):
    assert parse_rate(format_rate(x)) == pytest.approx(x, rel=5e-4, abs=0.5)


@given(st.integers(min_value=0, max_value=10**18))
def test_plain_integers_parse_exactly(n):
    assert parse_size(str(n)) == n
