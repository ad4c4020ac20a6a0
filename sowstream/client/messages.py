"""What the client sends (:class:`Command`) and receives (:class:`Message`), in AMPS vocabulary."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from sowstream.messagetypes import MessageType, registry


@dataclass(frozen=True, slots=True)
class Message:
    """One message delivered to the application.

    ``command`` is ``group_begin``, ``sow``, ``group_end``, ``ack``, ``publish`` or ``oof``.
    ``data`` is the raw body, in the topic's message type; :meth:`fields` parses it with that
    type (any type), :meth:`json` as JSON. On a delta subscription ``delta`` marks a
    body holding only the key and the changed fields; ``reason`` says why an ``oof`` was sent.
    ``bookmark`` marks the message's place in the transaction log: subscribing with it resumes
    right after this message.
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
