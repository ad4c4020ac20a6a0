"""The shared reader and writer of ``fix`` and ``nvfix``: ``name=value`` fields separated by SOH.

Fields are flat: ``/35`` reads the field named ``35``. A name repeated in one message (a FIX
repeating group) reads as the list of its values, so a filter matches when any of them does,
and writes back as the name repeated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from sowstream.filters.values import canonical_text
from sowstream.messagetypes.base import MessageParseError, MessageSerialiseError, MessageType

SOH = b"\x01"


class TagValueType(MessageType):
    """``name=value`` fields, each followed by SOH (the last SOH may be left out)."""

    numeric_names: ClassVar[bool] = False  # FIX tags are numbers; nvfix names are any text

    def parse(self, data: bytes) -> dict[str, Any]:
        body: dict[str, Any] = {}
        position = 0
        for field in data.split(SOH):
            start = position
            position += len(field) + 1
            if not field:
                continue  # the SOH that ends the message, or an empty field between two
            equals = field.find(b"=")
            if equals < 0:
                raise MessageParseError(
                    self.name, f"field {_shown(field)} has no '=' between name and value", start
                )
            if equals == 0:
                raise MessageParseError(self.name, "a field has an empty name", start)
            try:
                name = field[:equals].decode()
                value = field[equals + 1 :].decode()
            except UnicodeDecodeError as exc:
                raise MessageParseError(self.name, "not UTF-8 text", start + exc.start) from None
            if self.numeric_names and not (name.isascii() and name.isdigit()):
                raise MessageParseError(
                    self.name, f"tag {name!r} is not a number (FIX tags are like 35=D)", start
                )
            if name in body:
                held = body[name]
                body[name] = [*held, value] if isinstance(held, list) else [held, value]
            else:
                body[name] = value
        if not body:
            raise MessageParseError(self.name, "no fields", 0 if not data else None)
        return body

    def serialise(self, record: Mapping[str, Any]) -> bytes:
        out = bytearray()
        for name, value in record.items():
            if not name or "=" in name or "\x01" in name:
                raise MessageSerialiseError(
                    f"{self.name} field name {name!r} cannot hold '=' or SOH, nor be empty"
                )
            if self.numeric_names and not (name.isascii() and name.isdigit()):
                raise MessageSerialiseError(f"{self.name} tag {name!r} is not a number")
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, Mapping | list):
                    raise MessageSerialiseError(
                        f"{self.name} field /{name} holds {type(item).__name__}: "
                        f"{self.name} fields are flat name=value pairs"
                    )
                text = canonical_text(item)
                if "\x01" in text:
                    raise MessageSerialiseError(f"{self.name} field /{name} holds a SOH character")
                out += f"{name}={text}".encode() + SOH
        return bytes(out)


def _shown(field: bytes) -> str:
    """A field as it can be shown in an error (cut short, undecodable bytes escaped)."""
    text = field[:40].decode("utf-8", "backslashreplace")
    return repr(text + ("..." if len(field) > 40 else ""))
