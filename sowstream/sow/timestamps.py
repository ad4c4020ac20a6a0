"""Points in time as users write them: AMPS bookmark timestamps and ISO-8601, always UTC."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from sowstream.errors import InvalidCommandError

# AMPS's timestamp bookmark form: 20261123T080000, optionally with fractions and a trailing Z.
_AMPS = re.compile(r"^(\d{8})T(\d{6})(?:\.(\d{1,6}))?Z?$")


def parse_timestamp(text: str, what: str = "timestamp") -> int:
    """Milliseconds since the epoch for ``20261123T080000[.ffffff][Z]`` or an ISO-8601 time.

    A time without a zone is UTC, like the broker's log timestamps.
    """
    raw = text.strip()
    match = _AMPS.match(raw)
    try:
        if match:
            date, clock, frac = match.groups()
            moment = datetime.strptime(date + clock, "%Y%m%d%H%M%S").replace(tzinfo=UTC)
            micros = int((frac or "0").ljust(6, "0"))
            return int(moment.timestamp()) * 1000 + micros // 1000
        moment = datetime.fromisoformat(raw)
    except ValueError:
        moment = None
    if moment is None:
        raise InvalidCommandError(
            f"{what}: {text!r} is not a timestamp (use 20261123T080000 or 2026-11-23T08:00:00Z)"
        )
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def format_timestamp(millis: int) -> str:
    """The AMPS bookmark form of a time, with milliseconds (``20261123T080000.123Z``)."""
    moment = datetime.fromtimestamp(millis / 1000, tz=UTC)
    return moment.strftime("%Y%m%dT%H%M%S") + f".{millis % 1000:03d}Z"
