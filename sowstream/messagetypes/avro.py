"""``avro``: schemaless Avro records described by a schema file named in the topic's config.

A message is the record's Avro binary encoding with no header (as Kafka users write it without a
registry); the schema is the topic's ``Schema`` file, parsed once with fastavro. Paths are field
names: ``/qty``, ``/customer/name`` for a nested record.

Deltas: a full record cannot leave fields out, so a ``delta_publish`` body and a delta
subscription's message are written with a *delta schema* derived from the topic's: the same
record (named ``<Name>Delta``) with every top-level field made optional (a union with ``null``,
default ``null``), where ``null`` means "unchanged". Consequently a delta cannot set a field to
null; publish the whole record for that. Nested records are replaced whole.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import fastavro
import orjson

from sowstream.messagetypes.base import (
    MessageParseError,
    MessageSerialiseError,
    MessageType,
    MessageTypeConfigError,
    TypeOptions,
)
from sowstream.messagetypes.changes import same_value


class AvroType(MessageType):
    """Avro records of one schema; see the module docstring for deltas."""

    name: ClassVar[str] = "avro"
    delta_form_is_full: ClassVar[bool] = False

    def __init__(self, options: TypeOptions | None = None) -> None:
        super().__init__(options)
        raw = _raw_schema(self.options)
        where = f"topic {self.options.topic!r}" if self.options.topic else "the avro schema"
        if not isinstance(raw, dict) or raw.get("type") != "record":
            raise MessageTypeConfigError(f"{where}: the Avro schema must be a record")
        self.schema_text = orjson.dumps(raw).decode()
        self.fields: tuple[str, ...] = tuple(f["name"] for f in raw.get("fields", ()))
        try:
            self._schema = fastavro.parse_schema(raw)
            self._delta_schema = fastavro.parse_schema(delta_schema(raw))
        except Exception as exc:  # fastavro raises several kinds for a bad schema
            raise MessageTypeConfigError(f"{where}: not a valid Avro schema: {exc}") from None

    def parse(self, data: bytes) -> dict[str, Any]:
        return self._read(data, self._schema, "record")

    def parse_delta(self, data: bytes) -> dict[str, Any]:
        fields = self._read(data, self._delta_schema, "delta")
        return {name: value for name, value in fields.items() if value is not None}

    def serialise(self, record: Mapping[str, Any]) -> bytes:
        return self._write(record, self._schema, "record")

    def serialise_delta(self, fields: Mapping[str, Any]) -> bytes:
        return self._write(fields, self._delta_schema, "delta")

    def changed(self, before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
        # Top-level fields whole: a nested record in a delta must be complete to be written.
        return {
            name: value
            for name, value in after.items()
            if name not in before or not same_value(before[name], value)
        }

    def _read(self, data: bytes, schema: Any, what: str) -> dict[str, Any]:
        buf = io.BytesIO(data)
        try:
            body = fastavro.schemaless_reader(buf, schema, None)
        except Exception as exc:  # truncated data, bad union index, invalid UTF-8, ...
            problem = f"not an Avro {what} of the topic's schema ({type(exc).__name__}: {exc})"
            raise MessageParseError("avro", problem, buf.tell()) from None
        if buf.tell() != len(data):
            raise MessageParseError(
                "avro",
                f"{len(data) - buf.tell()} bytes left over after the {what}: "
                "the message does not match the topic's schema",
                buf.tell(),
            )
        assert isinstance(body, dict)
        return body

    def _write(self, record: Mapping[str, Any], schema: Any, what: str) -> bytes:
        unknown = [name for name in record if name not in self.fields]
        if unknown:
            raise MessageSerialiseError(
                f"avro {what} has fields the schema does not: {', '.join(map(str, unknown))}"
            )
        buf = io.BytesIO()
        try:
            fastavro.schemaless_writer(buf, schema, dict(record))
        except Exception as exc:  # missing field, wrong type, ...
            raise MessageSerialiseError(f"cannot write the avro {what}: {exc}") from None
        return buf.getvalue()


def delta_schema(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The delta schema of a record schema: every top-level field optional, ``null`` first."""
    fields = []
    for field in raw.get("fields", ()):
        kind = field["type"]
        branches = list(kind) if isinstance(kind, list) else [kind]
        optional = ["null", *(b for b in branches if b != "null")]
        fields.append({"name": field["name"], "type": optional, "default": None})
    derived = {key: value for key, value in raw.items() if key not in ("fields", "aliases")}
    derived["name"] = f"{raw['name']}Delta"
    derived["fields"] = fields
    return derived


def _raw_schema(options: TypeOptions) -> Any:
    """The schema as JSON: given inline (a client), or read from the topic's schema file."""
    where = f"topic {options.topic!r}" if options.topic else "avro"
    if options.schema is not None:
        text = options.schema
        source = "the schema"
    elif options.schema_file:
        try:
            text = Path(options.schema_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise MessageTypeConfigError(
                f"{where}: cannot read the Avro schema file {options.schema_file!r}: "
                f"{exc.strerror or exc}"
            ) from None
        source = f"schema file {options.schema_file!r}"
    else:
        raise MessageTypeConfigError(
            f"{where}: an avro topic needs its record schema: give the schema file as Schema"
        )
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise MessageTypeConfigError(
            f"{where}: {source} is not JSON: {exc.msg} at character {exc.pos}"
        ) from None
