"""What a subscription is, what changed in the SOW, and what a subscriber is sent.

These are plain values shared by the engine (which matches changes against subscriptions) and the
client (which registers them); ``schemas/Subscription.avsc`` is their wire form.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from sowstream.errors import InvalidCommandError
from sowstream.sow.patterns import NameScope
from sowstream.sow.record import SowRecord
from sowstream.subscriptions.options import SubscriptionOptions, parse_options
from sowstream.wire.topics import JSON, topic_ident

if TYPE_CHECKING:
    from sowstream.messagetypes import MessageType

SUBSCRIBE = "subscribe"
SOW_AND_SUBSCRIBE = "sow_and_subscribe"
DELTA_SUBSCRIBE = "delta_subscribe"
SOW_AND_DELTA_SUBSCRIBE = "sow_and_delta_subscribe"
UNSUBSCRIBE = "unsubscribe"
SUBSCRIBE_COMMANDS = frozenset(
    {SUBSCRIBE, SOW_AND_SUBSCRIBE, DELTA_SUBSCRIBE, SOW_AND_DELTA_SUBSCRIBE}
)
WITH_SOW = frozenset({SOW_AND_SUBSCRIBE, SOW_AND_DELTA_SUBSCRIBE})
DELTA = frozenset({DELTA_SUBSCRIBE, SOW_AND_DELTA_SUBSCRIBE})

# Out-of-focus reasons, as AMPS names them.
OOF_DELETED = "deleted"
OOF_EXPIRED = "expired"
OOF_MATCH = "match"
OOF_ENTITLEMENT = "entitlement"

# Reply-topic message kinds for live traffic.
PUBLISH = "publish"
OOF = "oof"
FAILURE = "failure"  # the engine ended the subscription; sow.reason says why
# The engine took a queue subscription: sow.ack_type = processed, sow.options its backlog.
ACK = "ack"
PROCESSED = "processed"
# Reasons a command or registration is refused for: its filter, or another option.
BAD_FILTER = "bad_filter"
BAD_OPTION = "bad_option"
# A registration whose value is no Subscription record (its key still says whom to tell).
BAD_REGISTRATION = "bad_registration"
# A partition's log was recreated: its offsets start over after sow.offset (sow.logcheck).
LOG_RESET = "log_reset"


@dataclass(frozen=True)
class SubscriptionSpec:
    """One registered subscription: who gets what from which topic.

    ``key`` identifies it in the registry: one client's subscription id on one topic (a
    subscription on a topic pattern is registered once per matching topic). ``topic`` is the
    topic's name and ``message_type`` its message type: together they name the topic.
    """

    sub_id: str
    reply_to: str
    topic: str
    command: str
    filter: str | None = None
    options: SubscriptionOptions = field(default_factory=SubscriptionOptions)
    identity: str = ""
    order_by: str | None = None
    message_type: str = JSON
    # SowKeys: only these records (the SOW part and live messages); None means every record.
    sow_keys: frozenset[str] | None = None
    # On a Pattern topic: the regular expression the topic names of its records must match
    # whole (one name escaped, sow.patterns.name_regex); None means every name.
    topic_regex: str | None = None

    def __post_init__(self) -> None:
        if self.command not in SUBSCRIBE_COMMANDS:
            raise InvalidCommandError(
                f"unknown subscription command {self.command!r}: expected one of "
                f"{', '.join(sorted(SUBSCRIBE_COMMANDS))}"
            )

    @property
    def ident(self) -> str:
        """The topic's identity (``wire.topics.topic_ident``): its name, typed unless json."""
        return topic_ident(self.topic, self.message_type)

    @property
    def key(self) -> str:
        """Registry key: unique per client, subscription id and topic (its identity last)."""
        return f"{self.reply_to}|{self.sub_id}|{self.ident}"

    @property
    def delta(self) -> bool:
        """Whether updates to records already delivered are sent as deltas."""
        return self.command in DELTA

    @property
    def paginated(self) -> bool:
        """A top_n window: the engine sends the whole filtered stream, the client pages it."""
        return self.options.top_n is not None

    def to_wire(self) -> dict[str, Any]:
        """The ``Subscription`` Avro record."""
        return {
            "sub_id": self.sub_id,
            "reply_to": self.reply_to,
            "topic": self.topic,
            "command": self.command,
            "filter": self.filter,
            "options": self.options.to_text(),
            "identity": self.identity,
            "order_by": self.order_by,
            "sow_keys": sorted(self.sow_keys) if self.sow_keys is not None else None,
            "message_type": self.message_type,
            "topic_regex": self.topic_regex,
        }

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> SubscriptionSpec:
        """Inverse of :meth:`to_wire`; bad options raise InvalidCommandError."""
        return cls(
            sub_id=d["sub_id"],
            reply_to=d["reply_to"],
            topic=d["topic"],
            command=d["command"],
            filter=d.get("filter"),
            options=parse_options(d.get("options") or ""),
            identity=d.get("identity") or "",
            order_by=d.get("order_by"),
            sow_keys=frozenset(d["sow_keys"]) if d.get("sow_keys") is not None else None,
            message_type=d.get("message_type") or JSON,
            topic_regex=d.get("topic_regex"),
        )

    def covers(self, sow_key: str) -> bool:
        """Whether the subscription's SowKeys (if it has any) include ``sow_key``."""
        return self.sow_keys is None or sow_key in self.sow_keys

    def scope(self) -> NameScope:
        """The records of a Pattern topic it takes (names and SowKeys); re.error if its
        topic_regex does not compile."""
        return NameScope(self.topic_regex, self.sow_keys)


# What the compiled fold read of an op's record at the paths subscriptions are indexed by
# (FilterIndex.paths): the scalars before and after it, a tuple per state (None: no state, or
# not read), so that only the changes a subscription may take have their bodies parsed.
Watched = tuple[tuple[Any, ...] | None, tuple[Any, ...] | None]


@dataclass(slots=True)
class Change:
    """What one log operation (or an expiry) did to one record of a partition.

    ``reason`` says why a record disappeared (``deleted`` or ``expired``). ``resent`` marks the
    stored state re-announced for an operation replayed after a crash, whose own effect is
    already in the store: subscribers get it whole and drop it if they saw it already.
    ``(offset, seq)`` orders a partition's messages: ``seq`` tells apart the records one delete
    by filter removed, and places expiries, which are not log operations.
    """

    sow_key: str
    before: SowRecord | None
    after: SowRecord | None
    partition: int
    offset: int
    timestamp: int
    reason: str = ""
    resent: bool = False
    seq: int = 0
    _before_body: dict[str, Any] | None = None
    _after_body: dict[str, Any] | None = None
    watched_at: tuple[str, ...] | None = None  # the paths ``watched`` was read at
    watched: Watched | None = None

    def before_body(self, mtype: MessageType) -> dict[str, Any] | None:
        """The previous state parsed by the topic's message type (cached)."""
        if self._before_body is None and self.before is not None:
            self._before_body = self.before.parsed(mtype)
        return self._before_body

    def after_body(self, mtype: MessageType) -> dict[str, Any] | None:
        """The new state parsed by the topic's message type (cached)."""
        if self._after_body is None and self.after is not None:
            self._after_body = self.after.parsed(mtype)
        return self._after_body


@dataclass(slots=True)
class Delivery:
    """One message for one subscription, ready for the subscriber's reply topic."""

    spec: SubscriptionSpec
    command: str
    sow_key: str
    data: bytes
    partition: int
    offset: int
    timestamp: int
    reason: str = ""
    is_delta: bool = False
    seq: int = 0
    topic: str = ""  # on a Pattern topic: the topic name the record was published under


def dumps(body: dict[str, Any]) -> bytes:
    """JSON bytes of a message body."""
    return orjson.dumps(body)
