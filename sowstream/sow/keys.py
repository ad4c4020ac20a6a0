"""SowKey generation: a stable, opaque key from the key domain and the values of the Key fields.

Identical in every process and across restarts (no salted ``hash()``), so clients, workers and the
Spark pipeline all compute the same key and Kafka routes every update of a record to one partition.
"""

from __future__ import annotations

import binascii
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from functools import cache, lru_cache
from typing import Any

from sowstream.errors import InvalidMessageError
from sowstream.filters.values import canonical_text, get_path, is_null, path_steps

_BASE64_CHARS = re.compile(r"^[A-Za-z0-9+/=_-]+$")
MAX_USER_KEY_LENGTH = 1024


def sow_key_from_values(key_domain: str, values: Sequence[str]) -> str:
    """Hash the key domain and the key values into a SowKey.

    Each part is length-prefixed, so ``("ab", "c")`` and ``("a", "bc")`` can never collide by
    concatenation; a 96-bit BLAKE2b digest keeps accidental collisions negligible at billions of
    records while the key stays short (16 Base64 characters).
    """
    h = _domain_state(key_domain).copy()
    for part in values:
        raw = part.encode()
        h.update(len(raw).to_bytes(4, "big") + raw)
    # 12 bytes: 16 Base64 characters, no padding; what base64.urlsafe_b64encode spells, faster.
    return binascii.b2a_base64(h.digest(), newline=False).translate(_URLSAFE).decode()


_URLSAFE = bytes.maketrans(b"+/", b"-_")


@lru_cache(maxsize=4096)  # one per key domain (a Pattern topic has one per topic name)
def _domain_state(key_domain: str) -> Any:
    """The hash state after the key domain, copied per key (one update less per record)."""
    h = hashlib.blake2b(digest_size=12)
    raw = key_domain.encode()
    h.update(len(raw).to_bytes(4, "big"))
    h.update(raw)
    return h


@cache
def _steps(path: str) -> tuple[str, ...]:
    return path_steps(path)


def field_values(record: Mapping[str, Any], path: str) -> list[Any]:
    """``get_path`` with a fast walk for the usual case: nested objects, no arrays."""
    node: Any = record
    for step in _steps(path):
        if type(node) is not dict:
            return get_path(record, path)
        node = node.get(step)
        if node is None:
            return []
    return get_path(record, path) if type(node) is list else [node]


def key_values(topic: str, key_paths: Sequence[str], record: Mapping[str, Any]) -> list[str]:
    """The canonical string of each Key field of ``record``; a missing or NULL one is an error."""
    values: list[str] = []
    for path in key_paths:
        steps = _steps(path)
        if len(steps) == 1 and type(record) is dict:
            # The usual Key: a top-level string or integer (what canonical_text gives them).
            value: Any = record.get(steps[0])
            kind = type(value)
            if kind is str and value:
                values.append(value)
                continue
            if kind is int:
                values.append(str(value))
                continue
        found = field_values(record, path)
        if not found or is_null(found[0]):
            raise InvalidMessageError(
                f"topic {topic!r}: key field {path} is missing from the message",
                topic=topic,
                reason="missing_key_field",
            )
        if len(found) > 1 or isinstance(found[0], dict | list):
            raise InvalidMessageError(
                f"topic {topic!r}: key field {path} must be a single scalar value",
                topic=topic,
                reason="bad_key_field",
            )
        values.append(canonical_text(found[0]))
    return values


def generated_sow_key(
    topic: str, key_domain: str, key_paths: Sequence[str], record: Mapping[str, Any]
) -> str:
    """The SowKey the engine assigns to ``record`` on a topic with Key fields."""
    return sow_key_from_values(key_domain, key_values(topic, key_paths, record))


def validate_user_sow_key(topic: str, sow_key: str | None) -> str:
    """Check a publisher-supplied SowKey: present, Base64 characters only, bounded length."""
    if not sow_key:
        raise InvalidMessageError(
            f"topic {topic!r} has no Key fields: the publisher must supply a SowKey",
            topic=topic,
            reason="missing_sow_key",
        )
    if len(sow_key) > MAX_USER_KEY_LENGTH or not _BASE64_CHARS.match(sow_key):
        raise InvalidMessageError(
            f"topic {topic!r}: SowKey {sow_key[:40]!r} may contain only Base64 characters "
            f"(A-Z a-z 0-9 + / = - _) and at most {MAX_USER_KEY_LENGTH} of them",
            topic=topic,
            reason="bad_sow_key",
        )
    return sow_key


_SCALARS = (str, int, bool, type(None))


def same_values(paths: Iterable[str], before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    """Whether ``before`` and ``after`` hold the very same values at every path in ``paths``.

    Strict, so that anything derived from those values (index entries) is certainly equal:
    same types (``1``, ``1.0`` and ``True`` differ), floats bit for bit (``-0.0`` is not
    ``0.0``), and anything but a scalar counts as changed.
    """
    for path in paths:
        old = field_values(before, path)
        new = field_values(after, path)
        if len(old) != len(new):
            return False
        for a, b in zip(old, new, strict=True):
            kind = type(a)
            if kind is not type(b):
                return False
            if kind is float:
                if a.hex() != b.hex():
                    return False
            elif kind not in _SCALARS or a != b:
                return False
    return True
