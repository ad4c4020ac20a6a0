"""What the client sends (:class:`Command`) and receives (:class:`Message`), in AMPS vocabulary."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from sowstream.messagetypes import MessageType, registry
from sowstream.sow.bookmarks import message_bookmark


@dataclass(frozen=True)
class Message:
    """One message delivered to the application.

    ``command`` is ``group_begin``, ``sow``, ``group_end``, ``ack``, ``publish`` or ``oof``.
    ``data`` is the raw body, in the topic's message type; :meth:`fields` parses it with that
    type (any type), :meth:`json` as JSON. On a delta subscription ``delta`` marks a
    body holding only the key and the changed fields; ``reason`` says why an ``oof`` was sent.
    ``bookmark`` marks the message's place in the transaction log: subscribing with it resumes
    right after this message.

    A ``sow`` message read from a raw batch (``sowstream.client.rawscan``) is built with its
    record's position only; its topic, SowKey, body, timestamp and bookmark are read from the
    batch when one of them is first used (:class:`MessageSource`), and kept from then on.
    """

    command: str
    topic: str = ""
    sow_key: str = ""
    query_id: str = ""
    data: bytes = b""
    timestamp: int = 0
    batch_size: int = 0
    count: int = 0
    status: str = "success"
    reason: str = ""
    sub_id: str = ""
    delta: bool = False
    bookmark: str = ""
    deliveries: int = 0  # queue messages: leases so far, this one included
    lease_expires: int | None = None  # queue messages: when the lease ends (epoch ms), None: never
    # The topic's message type when it is not json (None: json), for fields().
    codec: MessageType | None = field(default=None, repr=False, compare=False)

    @property
    def message_type(self) -> str:
        """The name of the body's message type (``json``, ``fix``, ``nvfix``, ...)."""
        return self.codec.name if self.codec is not None else registry.JSON

    def json(self) -> Any:
        """The body parsed as JSON (None for an empty body)."""
        return orjson.loads(self.data) if self.data else None

    def fields(self) -> dict[str, Any]:
        """The body's fields, parsed by the topic's message type (``{}`` for an empty body);
        a delta message's are the changed fields (and the key fields)."""
        if not self.data:
            return {}
        codec = self.codec or registry.get(registry.JSON)
        return codec.parse_delta(self.data) if self.delta else codec.parse(self.data)


class MessageSource(Protocol):
    """Where a message built from a raw batch reads its record's fields from."""

    def fill(self, fields: dict[str, Any], index: int) -> None:
        """Put record ``index``'s :data:`FROM_SOURCE` fields into ``fields``, and what its
        bookmark is made of under :data:`BOOKMARK_AT`."""


# The fields a message built from a raw batch reads on first use, and the names under which its
# __dict__ keeps its source and position until then. The bookmark is written out only when read
# (formatting it cost a fifth of a scan's time in the client, and few sow readers want it).
FROM_SOURCE = ("topic", "sow_key", "data", "timestamp")
SOURCE = "_source"
INDEX = "_index"
BOOKMARK_AT = "_bookmark_at"  # (log timestamp, partition, log offset)


def _fill(fields: dict[str, Any]) -> None:
    """Read a raw-batch message's record into its ``fields`` (its __dict__), if not yet."""
    source: MessageSource | None = fields.get(SOURCE)
    index: int | None = fields.get(INDEX)
    if source is not None and index is not None:
        source.fill(fields, index)
        # Let go of the batch once read; popped after the fill (and tolerant of a second
        # reader in another thread doing the same), so a reader never sees half a message.
        fields.pop(SOURCE, None)
        fields.pop(INDEX, None)


class _FromSource:
    """A :class:`Message` field that a message built from a raw batch reads on first use.

    A non-data descriptor: a message built the ordinary way has the field in its __dict__,
    which Python reads first, so only raw-batch messages ever come here (once per message).
    Fields are written into the __dict__ directly: a frozen dataclass refuses setattr.
    """

    __slots__ = ("default", "name")

    def __init__(self, name: str, default: Any) -> None:
        self.name = name
        self.default = default

    def __get__(self, msg: Message | None, owner: type | None = None) -> Any:
        if msg is None:
            return self.default
        fields = msg.__dict__
        _fill(fields)
        return fields.get(self.name, self.default)


class _Bookmark(_FromSource):
    """``Message.bookmark`` of a raw-batch message: written out from its position when read."""

    __slots__ = ()

    def __get__(self, msg: Message | None, owner: type | None = None) -> Any:
        if msg is None:
            return self.default
        fields = msg.__dict__
        _fill(fields)
        at = fields.get(BOOKMARK_AT)
        if at is None:
            return fields.get(self.name, self.default)
        bookmark = fields[self.name] = message_bookmark(*at)
        fields.pop(BOOKMARK_AT, None)  # after the bookmark is there, as above
        return bookmark


for _name in FROM_SOURCE:
    setattr(Message, _name, _FromSource(_name, getattr(Message, _name)))
Message.bookmark = _Bookmark("bookmark", Message.bookmark)  # type: ignore[assignment]


def from_source(source: MessageSource, count: int, fields: dict[str, Any]) -> Iterator[Message]:
    """``count`` messages, each with ``fields`` and one record of ``source`` (read when used),
    made one at a time as they are asked for.

    Each is made without ``__init__``: a frozen dataclass's sets its fields one by one, about
    a microsecond a message, which a scan of a million records would spend on fields unused.
    One at a time: a message the application drops right away dies young, which costs the
    garbage collector little, where a list of a batch's messages would be walked again as it
    survived into the older generations.
    """
    fields = {**fields, SOURCE: source}
    new = object.__new__
    for index in range(count):
        msg = new(Message)
        own = msg.__dict__
        own.update(fields)
        own[INDEX] = index
        yield msg


def from_records(
    source: MessageSource,
    records: Sequence[tuple[str, bytes, int, int, int | None] | None],
    partition: int,
    fields: dict[str, Any],
) -> Iterator[Message]:
    """Messages of records already split (``(key, body, offset, timestamp, expiration)``),
    their fields set at once; a None record is left to ``source`` to read, and to refuse,
    when used. Made one at a time, as :func:`from_source`'s."""
    new = object.__new__
    for index, record in enumerate(records):
        msg = new(Message)
        own = msg.__dict__
        own.update(fields)
        if record is None:
            own[SOURCE] = source
            own[INDEX] = index
        else:
            key, body, offset, timestamp, _ = record
            own["sow_key"] = key
            own["data"] = body
            own["timestamp"] = timestamp
            own[BOOKMARK_AT] = (timestamp, partition, offset)
        yield msg


@dataclass(frozen=True)
class Command:
    """A generic command for :meth:`Client.execute`, with AMPS's names for its parts.

    ``command`` is one of ``publish``, ``delta_publish``, ``sow_delete`` or ``sow``.
    ``message_type`` names the topic's message type (None: the client's).
    """

    command: str
    topic: str
    message_type: str | None = None
    data: bytes | str | dict[str, Any] | None = None
    filter: str | None = None
    sow_key: str | None = None
    sow_keys: tuple[str, ...] | None = None
    query_id: str | None = None
    order_by: str | None = None
    top_n: int | None = None
    skip_n: int | None = None
    batch_size: int | None = None
    expiration: int | str | None = None
    ack: bool = False
    options: dict[str, str] = field(default_factory=dict)
