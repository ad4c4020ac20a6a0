"""From client messages to grid row events: what the page's live grid adds, changes or removes."""

from __future__ import annotations

from typing import Any

import orjson

from sowstream.client import Message
from sowstream.messagetypes.changes import merge_delta

KEY = "_key"  # the row id column of every grid: the record's SowKey


def cells(record: dict[str, Any]) -> dict[str, Any]:
    """A record as grid cells: nested values shown as their JSON text."""
    return {
        field: orjson.dumps(value).decode() if isinstance(value, dict | list) else value
        for field, value in record.items()
    }


def body(msg: Message) -> dict[str, Any]:
    """A message's fields; types without fields (binary) as one ``data`` cell."""
    if msg.codec is not None and not msg.codec.has_fields:
        return {"data": msg.data.decode("utf-8", "backslashreplace")}
    fields = msg.fields() if msg.codec is not None else msg.json()
    return fields if isinstance(fields, dict) else {"data": fields}


class LiveGrid:
    """A subscriber's records by SowKey; :meth:`apply` turns each message into one row event.

    Events are dicts for the page: ``add`` (a new row), ``update`` (the whole row and the
    fields that changed, which the page flashes) or ``remove`` (with the oof reason).
    """

    def __init__(self) -> None:
        self.records: dict[str, dict[str, Any]] = {}

    def apply(self, msg: Message) -> dict[str, Any] | None:
        """The row event for ``msg``, or None for messages that change no row."""
        if msg.command not in ("sow", "publish", "oof"):
            return None
        key = msg.sow_key
        if msg.command == "oof":
            last = self.records.pop(key, None)
            row = cells(last if last is not None else body(msg))
            return {"op": "remove", "key": key, "reason": msg.reason, "row": {KEY: key, **row}}
        fields = body(msg)
        old = self.records.get(key)
        if old is None:
            self.records[key] = fields
            return {"op": "add", "key": key, "row": {KEY: key, **cells(fields)}}
        new = merge_delta(old, fields) if msg.delta else fields
        self.records[key] = new
        changed = sorted(f for f in set(old) | set(new) if old.get(f) != new.get(f))
        return {"op": "update", "key": key, "changed": changed, "row": {KEY: key, **cells(new)}}
