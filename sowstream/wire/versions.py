"""Which version of the protocol's Avro schemas a Command, Reply, Subscription, TopicInfo or
DeadLetter record was written with.

The value of these records is schemaless Avro: without knowing the writer's schema a reader cannot
even find a field in it, so the version travels outside the value, in the Kafka header
``sow.schema`` (absent: version 1, what every client wrote before the header existed). A reader
decodes an older version with that version's schema (``schemas/versions/<n>/``) resolved to its
own, so the fields added since take their defaults; a newer version is read with its own schema
as far as it goes (later versions only append fields) and refused when it is outside what the
reader accepts. ``docs/protocol.md`` (*Schema versions*) says what may change within a version.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from functools import cache
from typing import Any

import fastavro

from sowstream.errors import SchemaVersionError
from sowstream.wire import headers as h
from sowstream.wire.avro import SCHEMA_DIR, SchemaName, schema

# The version this code writes, and the oldest one it still reads (raised by an incompatible
# change: older writers are then refused with a reply naming both versions).
PROTOCOL_VERSION = 1
OLDEST_ACCEPTED = 1

# The CRC-64-AVRO fingerprint of each versioned schema's Parsing Canonical Form, per version.
# A schema file that no longer has its version's fingerprint was changed without a new version
# (tests/unit/test_schema_versions.py).
FINGERPRINTS: Mapping[int, Mapping[str, str]] = {
    1: {
        "Command": "fa067a63d4db3576",
        "Reply": "3acd99937a02480e",
        "Subscription": "0f653371d00e0cfb",
        "TopicInfo": "379b6f9e3899a97f",
        "DeadLetter": "7c6da5a49628814b",
    },
}
VERSIONED: tuple[SchemaName, ...] = ("Command", "Reply", "Subscription", "TopicInfo", "DeadLetter")

# The header every record of these schemas carries: as the engine's Sender takes headers, and
# as confluent-kafka's produce() does.
VERSION_HEADER: list[tuple[str, bytes]] = [(h.SCHEMA, str(PROTOCOL_VERSION).encode())]
PRODUCE_HEADERS: dict[str, str | bytes | None] = {h.SCHEMA: str(PROTOCOL_VERSION)}
# Reply.reason of a command refused for its version.
SCHEMA_VERSION = "schema_version"


def accepted() -> tuple[int, int]:
    """The versions a reader here accepts: (oldest, newest)."""
    return OLDEST_ACCEPTED, PROTOCOL_VERSION


def version_of(headers: Mapping[str, str] | None) -> int:
    """The version a record says it was written with (1 without the header); SchemaVersionError
    when the header is not a positive number."""
    text = (headers or {}).get(h.SCHEMA)
    if text is None or text == "":
        return 1
    try:
        version = int(text)
    except ValueError:
        version = 0
    if version < 1:
        raise SchemaVersionError(
            f"header {h.SCHEMA}={text!r} is not a schema version (a positive integer)",
            written=None,
            accepted=accepted(),
        )
    return version


def check(version: int, what: str) -> None:
    """Refuse ``version`` unless this reader accepts it, naming both sides' versions."""
    oldest, newest = accepted()
    if version > newest:
        raise SchemaVersionError(
            f"{what} was written with protocol schema version {version}; this side reads "
            f"versions {oldest} to {newest}: upgrade it, or write version {newest}",
            written=version,
            accepted=(oldest, newest),
        )
    if version < oldest:
        raise SchemaVersionError(
            f"{what} was written with protocol schema version {version}, which is no longer "
            f"accepted (this side reads versions {oldest} to {newest}): update the client's "
            "copy of the schemas",
            written=version,
            accepted=(oldest, newest),
        )


@cache
def writer_schema(name: SchemaName, version: int) -> Any:
    """``name``'s schema as version ``version`` wrote it (the current one for this version and
    for newer ones, whose records begin with the current fields)."""
    if version >= PROTOCOL_VERSION:
        return schema(name)
    path = SCHEMA_DIR / "versions" / str(version) / f"{name}.avsc"
    if not path.exists():  # unchanged in that version
        return schema(name)
    return fastavro.parse_schema(fastavro.schema.load_schema(str(path)))


def decode_headed(
    name: SchemaName, payload: bytes, headers: Mapping[str, str] | None
) -> dict[str, Any]:
    """Read a record the engine writes for readers of any release (a TopicInfo or a
    DeadLetter) with the version its ``sow.schema`` header names (1 without one, as records
    written before the header existed are): an older one with its own schema, a newer one as far
    as this version goes. SchemaVersionError for a header that is no version; the Avro decoder's
    own errors for a value that does not decode."""
    return decode_versioned(name, payload, version_of(headers))


def decode_versioned(name: SchemaName, payload: bytes, version: int) -> dict[str, Any]:
    """Read ``payload`` written with version ``version`` of ``name``, as the current schema
    (fields added since take their defaults; a newer version's added fields are skipped)."""
    writer = writer_schema(name, version)
    reader = None if writer is schema(name) else schema(name)
    result = fastavro.schemaless_reader(io.BytesIO(payload), writer, reader)
    assert isinstance(result, dict)
    return result
