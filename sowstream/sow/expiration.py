"""When a SOW record expires: the topic's Expiration policy plus the per-message override."""

from __future__ import annotations

from sowstream.errors import InvalidMessageError
from sowstream.sow.ports import ExpirationRule
from sowstream.units import parse_interval


def parse_expiration_header(topic: str, text: str | None) -> int | None:
    """Milliseconds from a message's expiration header (AMPS: seconds; ``0`` = never expire).

    Interval forms such as ``30s`` are accepted too. ``None`` means the header was absent.
    """
    if text is None or text == "":
        return None
    try:
        return int(text) * 1000 if text.strip().isdigit() else parse_interval(text)
    except ValueError as exc:
        raise InvalidMessageError(
            f"topic {topic!r}: bad expiration {text!r}: give seconds (0 = never) or an interval "
            "like 30s",
            topic=topic,
            reason="bad_expiration",
        ) from exc


def expiration_time(policy: ExpirationRule, header_ms: int | None, log_time_ms: int) -> int | None:
    """Absolute expiry (ms) to store with a record updated at ``log_time_ms``; None = never.

    Every update recomputes it, which is what resets the clock. With the policy ``disabled`` the
    per-message value is still stored (not processed), so enabling expiration later honours it.
    """
    if header_ms is not None:
        return None if header_ms == 0 else log_time_ms + header_ms
    if policy.mode == "default" and policy.default_ms:
        return log_time_ms + policy.default_ms
    return None


def processes_expiration(policy: ExpirationRule) -> bool:
    """Whether records of a topic with this policy are ever removed on expiry."""
    return policy.mode != "disabled"
