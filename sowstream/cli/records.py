"""Records as a terminal table: one column per field, as the web console's grids show them.

The columns are the union of the fields of the records shown, in the order they first appear;
nested objects become ``/a/b`` paths (the names filters and ``--order-by`` use), lists and other
values compact JSON text. A record too wide for the terminal keeps the columns that fit and a
caption names the others (``--json`` prints every field).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson
from rich.table import Table
from rich.text import Text

KEY_TITLE = "SowKey"
KEY_WIDTH = 16  # a SowKey's length
COLUMN_MIN = 10  # narrower than this a value column is mostly fold marks
BORDER = 3  # a column's padding and rule in rich's default box
NAMES_SHOWN = 8  # hidden fields the caption names before it just counts


def flatten(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``record``'s leaf values by path: ``{"a": {"b": 1}}`` is ``{"/a/b": 1}``; an empty
    object stays a value, so a record's every field has a column."""
    flat: dict[str, Any] = {}
    for name, value in record.items():
        path = f"{prefix}/{name}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, path))
        else:
            flat[path] = value
    return flat


def cell(value: Any) -> str:
    """A value as its cell shows it: text as it is (SOH, the fix separator, as ``|``, other
    control characters escaped so that a binary body cannot move the cursor), everything else as
    compact JSON."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "backslashreplace")
    if isinstance(value, str):
        return "".join(_visible(c) for c in value)
    return orjson.dumps(value, default=str).decode()


def _visible(char: str) -> str:
    if char.isprintable() or char in "\n\t":
        return char
    if char == "\x01":
        return "|"
    return char.encode("unicode_escape").decode()  # \x00, \u200b


def columns(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The union of the rows' paths, in order of first appearance."""
    seen: dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(row))
    return list(seen)


def fitting(
    paths: Sequence[str], cells: Sequence[Mapping[str, str]], width: int, keyed: bool = True
) -> int:
    """How many of ``paths`` (in order) fit ``width`` (next to the SowKey column when
    ``keyed``), at least one: each column takes its widest text, but no more than COLUMN_MIN
    when it must share."""
    used = 1 + (KEY_WIDTH + BORDER if keyed else 0)
    for count, path in enumerate(paths):
        widest = max([len(path), *(len(row.get(path, "")) for row in cells)])
        used += min(widest, COLUMN_MIN) + BORDER
        if used > width:
            return max(count, 1)
    return len(paths)


def record_table(title: str, records: Sequence[tuple[str, Any]], width: int) -> Table:
    """``(sow_key, body)`` pairs as a table of ``width`` characters at most; a body that is not
    an object (a binary message's text) is one ``data`` column. Records without SowKeys (an
    aggregated query's) get no SowKey column."""
    keyed = any(sow_key for sow_key, _ in records)
    flat = [flatten(body) if isinstance(body, Mapping) else {"data": body} for _, body in records]
    cells = [{path: cell(value) for path, value in row.items()} for row in flat]
    paths = columns(flat)
    shown = paths[: fitting(paths, cells, width, keyed)]
    hidden = paths[len(shown) :]
    caption: Text | None = None
    if hidden:
        names = ", ".join(hidden[:NAMES_SHOWN]) + (", …" if len(hidden) > NAMES_SHOWN else "")
        caption = Text(f"{len(hidden)} more field(s) not shown: {names} (--json shows every field)")
    # Text, not str: a value or a topic regex such as [a-z] is not rich markup.
    table = Table(title=Text(f"{title}: {len(records)} record(s)"), caption=caption)
    if keyed:
        table.add_column(KEY_TITLE, style="dim", no_wrap=True)
    for path in shown:
        table.add_column(Text(path), overflow="fold")
    for (sow_key, _), row in zip(records, cells, strict=True):
        values = [Text(row.get(path, "")) for path in shown]
        table.add_row(*([Text(sow_key)] if keyed else []), *values)
    return table
