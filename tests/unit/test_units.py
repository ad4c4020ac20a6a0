"""AMPS intervals and sizes."""

from __future__ import annotations

import pytest

from sowstream.units import parse_interval, parse_size


@pytest.mark.parametrize(
    ("text", "millis"),
    [
        ("30s", 30_000),
        ("30S", 30_000),
        ("30 s", 30_000),
        (" 5m ", 300_000),
        ("1.5s", 1_500),
        ("1.1s", 1_100),
        (".5s", 500),
        ("2.s", 2_000),
        ("250ms", 250),
        ("250MS", 250),
        ("1h", 3_600_000),
        ("1d", 86_400_000),
        ("7d", 604_800_000),
        ("1w", 604_800_000),
        ("2000000ns", 2),
        ("3000us", 3),
        ("500us", 1),  # non-zero never rounds to zero
        ("1ns", 1),
        ("0", 0),
        ("0s", 0),
        ("0ms", 0),
        ("45", 45_000),  # a bare number is seconds, as in AMPS
        (45, 45_000),
        (1.5, 1_500),
    ],
)
def test_parse_interval(text: str | int | float, millis: int) -> None:
    assert parse_interval(text) == millis


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("-5s", "negative"),
        ("5 parsecs", "unknown unit 'parsecs'"),
        ("5x", "unknown unit 'x'"),
        ("s", "'s' is not a number"),
        ("five seconds", "'five seconds'"),
        ("1e3s", "'1e3s'"),
        ("1.2.3s", "'1.2.3s'"),
        ("+5s", "'+5s'"),
    ],
)
def test_parse_interval_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="interval") as caught:
        parse_interval(text)
    assert message in str(caught.value)


@pytest.mark.parametrize("value", [True, None, [1]])
def test_parse_interval_rejects_non_text(value: object) -> None:
    with pytest.raises(ValueError, match="interval must be text"):
        parse_interval(value)  # type: ignore[arg-type]


def test_unknown_unit_message_lists_the_units() -> None:
    with pytest.raises(ValueError) as caught:
        parse_interval("3y")
    assert "ns, us, ms, s, m, h, d, w" in str(caught.value)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("512", 512),
        (512, 512),
        ("512B", 512),
        ("512KB", 512 * 1024),
        ("512kb", 512 * 1024),
        ("1MB", 1024**2),
        ("5MB", 5 * 1024**2),
        ("5 MB", 5 * 1024**2),
        ("1.5KB", 1536),
        ("1GB", 1024**3),
        ("1GiB", 1024**3),
        ("2TB", 2 * 1024**4),
        ("64M", 64 * 1024**2),
    ],
)
def test_parse_size(text: str | int, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(
    ("text", "message"), [("", "empty"), ("-1MB", "negative"), ("5XB", "'xb'"), ("lots", "'lots'")]
)
def test_parse_size_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="size") as caught:
        parse_size(text)
    assert message in str(caught.value)
