"""Avro encoding of the wire and state records, with the schemas in the repository's ``schemas/``.

Schemaless (no per-message schema header): both ends know the schema from ``docs/protocol.md``.
"""

from __future__ import annotations

import io
from functools import cache
from pathlib import Path
from typing import Any, Literal

import fastavro

from sowstream.errors import WireFormatError

SchemaName = Literal[
    "SowRecord", "Command", "Reply", "TopicInfo", "DeadLetter", "Subscription", "QueueStatus"
]

SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"


@cache
def schema(name: SchemaName) -> Any:
    """The parsed schema ``name`` (parsed once per process)."""
    return fastavro.parse_schema(fastavro.schema.load_schema(str(SCHEMA_DIR / f"{name}.avsc")))


def encode(name: SchemaName, record: dict[str, Any]) -> bytes:
    """Serialise ``record`` with schema ``name``."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema(name), record)
    return buf.getvalue()


def decode(name: SchemaName, payload: bytes) -> dict[str, Any]:
    """Deserialise ``payload`` written with schema ``name`` (WireFormatError when it is not
    one: fastavro raises anything from EOFError to IndexError on damaged bytes)."""
    try:
        result = fastavro.schemaless_reader(io.BytesIO(payload), schema(name), None)
    except Exception as exc:
        raise WireFormatError(f"not a {name} record: {type(exc).__name__}: {exc}") from None
    if not isinstance(result, dict):
        raise WireFormatError(f"not a {name} record")
    return result
