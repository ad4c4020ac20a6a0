"""Composite message types: a message made of parts, each of a message type of its own.

A topic uses ``composite-local`` or ``composite-global`` as its MessageType and lists its parts'
types in order (``Parts: [json, binary]``; in AMPS XML a named type in ``MessageTypes`` with
those Modules). On the wire each part is a 4-byte big-endian length followed by that many bytes
of the part's own type; framed parts after the declared ones are the unparsed payload, kept as
they are.

* ``composite-local`` keeps the parts apart: the first step of a path is the part's index
  (``/0/id`` reads ``id`` of the first part). A part without fields (``binary``) reads as its
  bytes. Deltas are supported: a delta_publish whose part is empty (zero length) leaves that part
  unchanged, other parts merge by their own type's rule (a binary part is replaced); a delta
  message carries the changed parts and leaves the others empty.
* ``composite-global`` reads every part's fields as one document (``/id`` reads ``id`` from
  whichever part has it; the first part that has a field wins). It takes no deltas: a
  delta subscription gets whole messages and a delta_publish replaces the record. Its records
  are written from the part-indexed form ``{"0": {...}, "1": b"..."}``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from sowstream.messagetypes.base import (
    MessageParseError,
    MessageSerialiseError,
    MessageType,
    MessageTypeConfigError,
    TypeOptions,
)
from sowstream.messagetypes.changes import changed_fields, merge_delta

_LENGTH = 4
PAYLOAD = "payload"  # the field holding framed parts beyond the declared ones

# Finds a part's message type by name; the registry sets it when it loads (it imports this
# module, so this module cannot import it).
PartTypes = Callable[[str, TypeOptions], MessageType]
_part_types: list[PartTypes] = []


def use_part_types(find: PartTypes) -> None:
    """Where composite types find their parts' types (called once, by the registry)."""
    _part_types[:] = [find]


def frame(parts: list[bytes]) -> bytes:
    """A composite message of ``parts`` (each length-prefixed)."""
    out = bytearray()
    for part in parts:
        out += len(part).to_bytes(_LENGTH, "big")
        out += part
    return bytes(out)


def unframe(data: bytes, type_name: str) -> list[bytes]:
    """The parts of a composite message; MessageParseError naming the byte where it breaks."""
    parts: list[bytes] = []
    pos = 0
    while pos < len(data):
        if pos + _LENGTH > len(data):
            raise MessageParseError(
                type_name, f"part {len(parts)}: its 4-byte length is cut off", pos
            )
        size = int.from_bytes(data[pos : pos + _LENGTH], "big")
        start = pos + _LENGTH
        if start + size > len(data):
            raise MessageParseError(
                type_name,
                f"part {len(parts)} declares {size} bytes but only {len(data) - start} follow",
                pos,
            )
        parts.append(data[start : start + size])
        pos = start + size
    return parts


class _Composite(MessageType):
    """What both composite modules share: the part types and the framing."""

    def __init__(self, options: TypeOptions | None = None) -> None:
        super().__init__(options)
        (find,) = _part_types
        where = f"topic {self.options.topic!r}" if self.options.topic else self.name
        names = self.options.parts
        if not names and self.options.schema:  # as the engine published them on the meta topic
            names = tuple(self.options.schema.split(","))
        if not names:
            raise MessageTypeConfigError(
                f"{where}: a {self.name} topic needs its parts' message types, in order "
                "(Parts: [json, binary])"
            )
        kinds: list[MessageType] = []
        for index, part in enumerate(names):
            if part.strip().lower().startswith("composite"):
                raise MessageTypeConfigError(
                    f"{where}: part {index} is {part}: a composite part cannot be composite"
                )
            kinds.append(find(part, TypeOptions(topic=self.options.topic)))
        self.parts: tuple[MessageType, ...] = tuple(kinds)
        self.schema_text = ",".join(names)  # how a client learns the parts

    def _split(self, data: bytes) -> tuple[list[bytes], list[bytes]]:
        """The declared parts (missing ones empty) and the unparsed payload's parts."""
        parts = unframe(data, self.name)
        count = len(self.parts)
        return parts[:count] + [b""] * (count - len(parts)), parts[count:]

    def _read(self, index: int, raw: bytes) -> Any:
        kind = self.parts[index]
        if not kind.has_fields:
            return raw
        if not raw:
            return {}  # an empty part has no fields (a notice's body has only empty parts)
        try:
            return kind.parse(raw)
        except MessageParseError as exc:
            raise MessageParseError(self.name, f"part {index} ({kind.name}): {exc}") from None

    def _write(self, index: int, value: Any, write: Callable[[Mapping[str, Any]], bytes]) -> bytes:
        kind = self.parts[index]
        if not kind.has_fields:
            if not isinstance(value, bytes | bytearray):
                raise MessageSerialiseError(f"part {index} ({kind.name}) takes bytes, not fields")
            return bytes(value)
        if not isinstance(value, Mapping):
            raise MessageSerialiseError(f"part {index} ({kind.name}) takes fields (an object)")
        return write(value)

    def _payload(self, record: Mapping[str, Any]) -> list[bytes]:
        extra = record.get(PAYLOAD) or []
        return [bytes(p) for p in extra]

    def _compose(self, record: Mapping[str, Any], *, delta: bool) -> bytes:
        unknown = [k for k in record if k != PAYLOAD and not _is_part(k, len(self.parts))]
        if unknown:
            raise MessageSerialiseError(
                f"{self.name} records are keyed by part number 0..{len(self.parts) - 1}, "
                f"got {', '.join(map(repr, unknown))}"
            )
        raw: list[bytes] = []
        for index, kind in enumerate(self.parts):
            value = record.get(str(index))
            if value is None:
                raw.append(b"")  # absent: an empty part (in a delta, unchanged)
                continue
            write = kind.serialise_delta if delta else kind.serialise
            raw.append(self._write(index, value, write))
        return frame(raw + self._payload(record))


def _is_part(key: object, count: int) -> bool:
    return isinstance(key, str) and key.isdigit() and int(key) < count


class CompositeLocalType(_Composite):
    """Parts kept apart under their index; deltas part by part."""

    name: ClassVar[str] = "composite-local"

    def parse(self, data: bytes) -> dict[str, Any]:
        parts, payload = self._split(data)
        body = {str(i): self._read(i, raw) for i, raw in enumerate(parts)}
        if payload:
            body[PAYLOAD] = payload
        return body

    def parse_delta(self, data: bytes) -> dict[str, Any]:
        # An empty part is unchanged: it is simply not among the fields the delta updates.
        parts, payload = self._split(data)
        body: dict[str, Any] = {}
        for index, raw in enumerate(parts):
            if raw:
                kind = self.parts[index]
                body[str(index)] = kind.parse_delta(raw) if kind.has_fields else raw
        if payload:
            body[PAYLOAD] = payload
        return body

    def serialise(self, record: Mapping[str, Any]) -> bytes:
        return self._compose(record, delta=False)

    def serialise_delta(self, fields: Mapping[str, Any]) -> bytes:
        return self._compose(fields, delta=True)

    def changed(self, before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
        delta: dict[str, Any] = {}
        for index, kind in enumerate(self.parts):
            key = str(index)
            old, new = before.get(key), after.get(key)
            if isinstance(old, Mapping) and isinstance(new, Mapping):
                inner = kind.changed(old, new)
                if inner:
                    delta[key] = inner
            elif new != old and new is not None:
                delta[key] = new
        if after.get(PAYLOAD) != before.get(PAYLOAD) and after.get(PAYLOAD):
            delta[PAYLOAD] = after[PAYLOAD]
        return delta

    def merge_fields(self, stored: dict[str, Any], update: dict[str, Any]) -> bytes:
        return self.serialise(merge_delta(stored, update))


class CompositeGlobalType(_Composite):
    """Every part's fields as one document; no deltas."""

    name: ClassVar[str] = "composite-global"
    supports_delta = False

    def parse(self, data: bytes) -> dict[str, Any]:
        parts, _ = self._split(data)
        body: dict[str, Any] = {}
        for index, raw in enumerate(parts):
            fields = self._read(index, raw)
            if isinstance(fields, dict):
                for name, value in fields.items():
                    body.setdefault(name, value)
        return body

    def serialise(self, record: Mapping[str, Any]) -> bytes:
        return self._compose(record, delta=False)

    def changed(self, before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
        return changed_fields(before, after)

    def merge(self, stored: bytes, update: bytes) -> bytes:
        return update
