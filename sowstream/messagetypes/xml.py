"""``xml``: one XML document per message, read with xmltodict (expat, entities disabled).

The root element is the first step of every path, as in AMPS's XPath: in
``<order id="7"><qty>5</qty></order>`` the path ``/order/qty`` reads ``5`` and ``/order/@id``
reads the attribute ``7``. An element that also has attributes or children keeps its text under
``#text``. A repeated element reads as a list, so a filter matches when any of them does. Values
are text; numeric text compares and sums as numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar
from xml.parsers.expat import ExpatError

import xmltodict

from sowstream.filters.values import canonical_text
from sowstream.messagetypes.base import MessageParseError, MessageSerialiseError, MessageType


class XmlType(MessageType):
    """XML documents; a delta_publish is a document with the same root and only the elements
    it updates, merged element by element."""

    name: ClassVar[str] = "xml"

    def parse(self, data: bytes) -> dict[str, Any]:
        if not data.strip():
            raise MessageParseError("xml", "empty message body")
        try:
            body = xmltodict.parse(data, disable_entities=True)
        except ExpatError as exc:
            # expat counts lines from 1 and columns from 0
            problem = f"{exc.args[0].split(':')[0]} (line {exc.lineno}, column {exc.offset + 1})"
            position = _byte_offset(data, exc.lineno, exc.offset)
            raise MessageParseError("xml", problem, position) from None
        except ValueError as exc:  # entities refused, for example
            raise MessageParseError("xml", str(exc)) from None
        if not isinstance(body, dict) or len(body) != 1:
            raise MessageParseError("xml", "expected one root element")
        return body

    def serialise(self, record: Mapping[str, Any]) -> bytes:
        if len(record) != 1:
            raise MessageSerialiseError(
                f"an xml message has one root element, got {len(record)}: "
                f"{', '.join(map(str, record)) or 'none'}"
            )
        try:
            text: str = xmltodict.unparse(_as_text(record), full_document=False)
        except ValueError as exc:
            raise MessageSerialiseError(f"cannot write xml: {exc}") from None
        return text.encode()


def _as_text(node: Any) -> Any:
    """``node`` with every scalar spelled as filters spell it (``true``, ``1.5``), None kept."""
    if isinstance(node, Mapping):
        return {key: _as_text(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_as_text(item) for item in node]
    return None if node is None else canonical_text(node)


def _byte_offset(data: bytes, line: int, column: int) -> int:
    """The byte offset of expat's (line, column) position."""
    start = 0
    for _ in range(line - 1):
        found = data.find(b"\n", start)
        if found < 0:
            break
        start = found + 1
    return start + column
