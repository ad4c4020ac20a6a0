"""Field helpers of the configuration models: the bottom of ``sowstream.config``.

The checks every model shares (names Kafka can hold, AMPS topic names, bounded numbers, choices,
field paths, intervals, RecoveryPoints) and the immutable base model. They read nothing of the
other config modules, so topics, queues, views and conflated topics build on them without a cycle.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from sowstream.errors import InvalidCommandError
from sowstream.messagetypes import registry
from sowstream.sow.timestamps import parse_timestamp
from sowstream.units import parse_interval
from sowstream.wire.topics import kafka_part

# A message type's name: a built-in one (below) or one added through the entry-point group
# ``sowstream.message_types`` (sowstream.messagetypes.registry); validation asks the registry.
MessageType = str
# A RecoveryPoint is one of these words or a timestamp (kept as written, see recovery_point_ms).
RECOVERY_WORDS = ("epoch", "now")

# The built-in types a view or conflated topic may produce: not those that need a topic's Schema
# or Parts (protobuf, composite), which a view or conflated topic does not carry.
SUPPORTED_MESSAGE_TYPES: tuple[str, ...] = tuple(
    name for name in registry.BUILT_IN if name not in ("protobuf", *registry.COMPOSITE)
)


def message_type_name(value: object) -> str:
    """``value`` as a known message type's name (lower case), else a ValueError listing them."""
    if isinstance(value, str) and value.strip().lower() in registry.names():
        return value.strip().lower()
    supported = ", ".join(registry.names())
    raise ValueError(f"message type {value!r} is not supported; supported: {supported}")


# Kafka caps topic names at 249 characters; the engine derives names such as
# "<prefix>.log.<topic>" and "<app_id>-sow-<topic>-changelog", so both parts get a share.
MAX_TOPIC_NAME = 180
MAX_PREFIX = 48
MIN_PARTITIONS = 1
MAX_PARTITIONS = 1024

KAFKA_NAME_CHARS = re.compile(r"[A-Za-z0-9._-]+")
_KAFKA_BAD_CHAR = re.compile(r"[^A-Za-z0-9._-]")

MIB = 1024 * 1024


class Frozen(BaseModel):
    """Immutable and closed: unknown fields are errors, not silently dropped typos."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def kafka_safe_name(value: object, what: str, limit: int) -> str:
    """``value`` if Kafka can use it inside a topic name, else a ValueError that says why."""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {value!r} (quote it in YAML)")
    if not value:
        raise ValueError(f"{what} is empty")
    if not KAFKA_NAME_CHARS.fullmatch(value):
        bad = "".join(sorted(set(_KAFKA_BAD_CHAR.findall(value))))
        suggestion = _KAFKA_BAD_CHAR.sub("_", value)
        raise ValueError(
            f"{what} {value!r} contains {bad!r}, which Kafka topic names cannot hold: use only "
            f"letters, digits, '.', '_' and '-' (for example {suggestion!r})"
        )
    if len(value) > limit:
        raise ValueError(
            f"{what} {value[:20]!r}... is {len(value)} characters; the limit is {limit} so the "
            "Kafka topic names derived from it stay within Kafka's 249"
        )
    return value


def amps_topic_name(value: object, what: str) -> str:
    """An AMPS topic name: any text without spaces or control characters (``/ett/order`` too);
    names Kafka cannot hold are encoded inside Kafka's names (``wire.topics.kafka_part``)."""
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {value!r} (quote it in YAML)")
    if not value:
        raise ValueError(f"{what} is empty")
    bad = sorted({c for c in value if c.isspace() or not c.isprintable()})
    if bad:
        raise ValueError(
            f"{what} {value!r} contains {''.join(bad)!r}: no spaces or control characters"
        )
    if len(kafka_part(value)) > MAX_TOPIC_NAME:
        raise ValueError(
            f"{what} {value[:20]!r}... is too long: {len(kafka_part(value))} characters in Kafka "
            f"names, the limit is {MAX_TOPIC_NAME} so the names derived from it stay within 249"
        )
    return value


def schema_path(path: str, source: str) -> str:
    """A schema file named in the configuration ``source``: relative to that file's folder."""
    given = Path(path.strip())
    if given.is_absolute() or source.startswith("<"):
        return str(given)
    return str(Path(source).parent / given)


def bounded_int(value: object, what: str, low: int, high: int) -> int:
    """``value`` as an int in ``low..high``; bools and fractions are refused, digit strings not."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be a whole number, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{what} must be between {low} and {high}, got {value}")
    return value


def one_of(value: object, what: str, options: tuple[str, ...]) -> str:
    """``value`` lower-cased if it is one of ``options``; AMPS spells these in lower case."""
    if isinstance(value, str) and value.strip().lower() in options:
        return value.strip().lower()
    raise ValueError(f"{what} must be one of {', '.join(options)}, got {value!r}")


def parse_recovery_point(value: object, aliases: Mapping[str, str] | None = None) -> str:
    """A RecoveryPoint as stored: ``epoch``, ``now`` (lower case) or a timestamp as written.

    ``aliases`` maps further words onto those (a queue reads ``creation`` as ``now``). Shared by
    SOW topics and queues so both accept the same forms.
    """
    aliases = aliases or {}
    words = (*RECOVERY_WORDS, *aliases)
    if isinstance(value, str) and value.strip():
        text = value.strip()
        word = text.lower()
        if word in RECOVERY_WORDS:
            return word
        if word in aliases:
            return aliases[word]
        try:
            parse_timestamp(text, "RecoveryPoint")
            return text
        except InvalidCommandError:
            pass
    raise ValueError(
        f"RecoveryPoint must be {', '.join(words)} or a timestamp like 20261123T080000 or "
        f"2026-11-23T08:00:00Z, got {value!r}"
    )


def recovery_point_ms(point: str) -> int | None:
    """A stored RecoveryPoint's timestamp as epoch milliseconds; None for ``epoch`` and ``now``."""
    if point in RECOVERY_WORDS:
        return None
    return parse_timestamp(point, "RecoveryPoint")


def check_path(path: object, what: str = "path") -> str:
    """An XPath-like field path such as ``/order/id``: leading ``/``, no empty segments."""
    if not isinstance(path, str):
        raise ValueError(f"{what} must be a path like '/id', got {path!r}")
    text = path.strip()
    if not text.startswith("/"):
        raise ValueError(f"{what} {path!r} must start with '/', like '/id' or '/order/id'")
    if any(not segment.strip() for segment in text[1:].split("/")):
        raise ValueError(f"{what} {path!r} has an empty segment: write it like '/order/id'")
    return text


def field_paths(value: object, what: str) -> tuple[str, ...]:
    """One path or a list of them, each checked, order kept."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple):
        raise ValueError(f"{what} must be a path or a list of paths, got {value!r}")
    return tuple(check_path(p, what) for p in value)


def interval_millis(value: object, what: str) -> int:
    """Milliseconds from an interval string (``15m``) or an int that already counts milliseconds."""
    if isinstance(value, str):
        try:
            return parse_interval(value)
        except ValueError as exc:
            raise ValueError(f"{what}: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an interval like '15m', got {value!r}")
    return value


def no_repeats(paths: tuple[str, ...], what: str) -> tuple[str, ...]:
    """``paths`` unchanged, or a ValueError naming the first path listed twice."""
    seen: set[str] = set()
    for path in paths:
        if path in seen:
            raise ValueError(f"{what} lists {path!r} twice")
        seen.add(path)
    return paths
