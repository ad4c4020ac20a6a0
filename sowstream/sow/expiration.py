"""When a SOW record expires: the topic's Expiration policy plus the per-message override."""

from __future__ import annotations

from sowstream.errors import InvalidMessageError
from sowstream.sow.ports import ExpirationRule
from sowstream.units import parse_interval
from sowstream.wire import headers as h

# A stored expiry is a signed 64-bit number of ms (sowstream.sow.record, native/): one beyond it
# cannot be stored, so the record that asks for it is refused rather than crashing the batch write.
LATEST_MS = 2**63 - 1


def parse_expiration_header(topic: str, text: str | None) -> int | None:
    """Milliseconds from a message's expiration header (AMPS: seconds; ``0`` = never expire).

    Interval forms such as ``30s`` are accepted too. ``None`` means the header was absent.
    """
    if text is None or text == "":
        return None
    try:
        ms = int(text) * 1000 if text.strip().isdigit() else parse_interval(text)
    except (ValueError, OverflowError) as exc:
        raise InvalidMessageError(
            f"topic {topic!r}: bad expiration {_quoted(text)} in header {h.EXPIRATION}: give "
            "seconds (0 = never) or an interval like 30s",
            topic=topic,
            reason="bad_expiration",
        ) from exc
    if ms > LATEST_MS:
        raise InvalidMessageError(
            f"topic {topic!r}: expiration {_quoted(text)} in header {h.EXPIRATION} is beyond "
            f"what a 64-bit millisecond time holds (at most {LATEST_MS // 1000} s)",
            topic=topic,
            reason="bad_expiration",
        )
    return ms


def expiration_time(
    policy: ExpirationRule, header_ms: int | None, log_time_ms: int, topic: str = ""
) -> int | None:
    """Absolute expiry (ms) to store with a record updated at ``log_time_ms``; None = never.

    Every update recomputes it, which is what resets the clock. With the policy ``disabled`` the
    per-message value is still stored (not processed), so enabling expiration later honours it.
    An expiry beyond 64 bits (a log time near 2**63) is an InvalidMessageError.
    """
    if header_ms is not None:
        if header_ms == 0:
            return None
        return _within(topic, log_time_ms, header_ms, f"the expiration in header {h.EXPIRATION}")
    if policy.mode == "default" and policy.default_ms:
        return _within(topic, log_time_ms, policy.default_ms, "the topic's Expiration")
    return None


def _within(topic: str, log_time_ms: int, after_ms: int, source: str) -> int:
    """``log_time_ms + after_ms``, refused when it leaves the signed 64-bit range."""
    at = log_time_ms + after_ms
    if not -LATEST_MS - 1 <= at <= LATEST_MS:
        raise InvalidMessageError(
            f"topic {topic!r}: {source} ({after_ms} ms) from the record's log timestamp "
            f"{log_time_ms} ms ends beyond what a 64-bit millisecond time holds",
            topic=topic,
            reason="bad_expiration",
        )
    return at


def _quoted(text: str) -> str:
    """``text`` quoted, cut to a readable length (a header may be any size)."""
    return repr(text) if len(text) <= 40 else repr(text[:40]) + f"... ({len(text)} characters)"


def processes_expiration(policy: ExpirationRule) -> bool:
    """Whether records of a topic with this policy are ever removed on expiry."""
    return policy.mode != "disabled"
