"""The Python client: publish, delta_publish, sow_delete and sow over confluent-kafka.

A client owns one reply topic (created on connect, deleted on close) where the engine's answers
arrive; it learns the SOW topics' definitions from the engine's compacted meta topic, so it can
compute SowKeys itself and route every update of a record to the partition that owns it.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
import uuid
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, cast

import orjson
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka import Message as KafkaMessage

from sowstream.client.messages import Command, Message
from sowstream.client.queue import QueueSubscription
from sowstream.client.replies import ReplyBox
from sowstream.client.subscription import (
    MAX_BUFFERED,
    MessageHandler,
    Subscription,
    SubscriptionDroppedError,
    _Live,
)
from sowstream.config.models import ambiguous_pattern, match_topic_names
from sowstream.errors import (
    CommandFailedError,
    CommandTimeoutError,
    InvalidCommandError,
    InvalidMessageError,
    SowstreamError,
    UnknownTopicError,
)
from sowstream.filters import compile_filter
from sowstream.messagetypes import (
    MessageParseError,
    MessageSerialiseError,
    MessageType,
    TypeOptions,
    registry,
)
from sowstream.queues.machine import Bookmark as QueueBookmark
from sowstream.sow.aggregate import Aggregation, merge_partials, parse_aggregation
from sowstream.sow.bookmarks import EPOCH, MOST_RECENT, message_bookmark, parse_bookmark
from sowstream.sow.keygen import KeyGeneratorError, generate_sow_key, load_key_generator
from sowstream.sow.keys import generated_sow_key, validate_user_sow_key
from sowstream.sow.patterns import literal_name, name_regex
from sowstream.sow.query import (
    CLIENT_DEFAULT_BATCH_SIZE,
    QueryOptions,
    result_order,
    validate_query,
)
from sowstream.subscriptions.model import (
    DELTA_SUBSCRIBE,
    FAILURE,
    LOG_RESET,
    SOW_AND_DELTA_SUBSCRIBE,
    SOW_AND_SUBSCRIBE,
    SUBSCRIBE,
    WITH_SOW,
    SubscriptionSpec,
)
from sowstream.subscriptions.options import SubscriptionOptions, parse_options
from sowstream.subscriptions.window import PageWindow, ResultSet
from sowstream.wire import headers as h
from sowstream.wire.avro import decode, encode
from sowstream.wire.kafka import (
    TopicSpec,
    delete_topics,
    ensure_topics,
    producer_config,
    resolve_bootstrap,
)
from sowstream.wire.topics import DEFAULT_PREFIX, JSON, TopicNames, topic_ident

_REGEX_CHARS = re.compile(r"[\\^$.|?*+()\[\]{}]")
# Characters that only a pattern has ('.' is common in topic names): a name with none of these
# that no topic matches is a topic of its own, created on first use.
_PATTERN_ONLY = re.compile(r"[\\^$|?*+()\[\]{}]")
# How often the reply reader tells the engine the client is alive (slow_consumer.client_timeout).
HEARTBEAT_SECONDS = 2.0


@dataclass(frozen=True)
class TopicInfo:
    """A SOW topic as the engine described it on the meta topic."""

    name: str
    keys: tuple[str, ...]
    key_domain: str
    partitions: int
    log_topic: str
    control_topic: str
    sow: bool = True
    queue_of: tuple[str, ...] = ()  # a queue: the topics its messages come from
    key_generator: str | None = None
    key_generator_options: tuple[tuple[str, str], ...] = ()
    auto: bool = False  # in no configuration: created by the engine on first use
    message_type: str = JSON
    schema: str = ""  # an avro topic's record schema
    view_of: tuple[str, ...] = ()  # a view: the topics it is computed from (only the engine writes)
    pattern: str = ""  # a regular expression topic: the Pattern its topic names match
    # How a command addresses a Pattern topic: the regex its records' topic names must match
    # (one name escaped); None: every name. Not part of the definition on the meta topic.
    topic_regex: str | None = None

    @property
    def queue(self) -> bool:
        """Whether this name is a queue (subscribe leases, sow browses)."""
        return bool(self.queue_of)

    @property
    def ident(self) -> str:
        """The topic's identity: its name for json, ``<type>:<name>`` otherwise."""
        return topic_ident(self.name, self.message_type)

    @property
    def codec(self) -> MessageType:
        """The topic's message type (an avro one with the schema the engine published)."""
        options = TypeOptions(topic=self.name, schema=self.schema or None)
        return registry.for_options(self.message_type, options)

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> TopicInfo:
        """Build from a decoded TopicInfo Avro record."""
        return cls(
            name=d["name"],
            keys=tuple(d["keys"]),
            key_domain=d["key_domain"],
            partitions=d["partitions"],
            log_topic=d["log_topic"],
            control_topic=d["control_topic"],
            sow=d.get("sow", True),
            queue_of=tuple(d.get("queue_of") or ()),
            key_generator=d.get("key_generator"),
            key_generator_options=tuple(sorted((d.get("key_generator_options") or {}).items())),
            auto=d.get("auto", False),
            message_type=d.get("message_type") or JSON,
            schema=d.get("schema") or "",
            view_of=tuple(d.get("view_of") or ()),
            pattern=d.get("pattern") or "",
        )

    def refuse_writes(self) -> None:
        """Raise InvalidCommandError if this topic is a view: only the engine writes views."""
        if self.view_of:
            raise InvalidCommandError(
                f"topic {self.name!r} is a view of {', '.join(self.view_of)}: views are "
                "computed by the engine and cannot be published to or deleted from; publish to "
                "the underlying topics instead"
            )

    def addressed_as(self, name: str) -> TopicInfo:
        """This topic as a command on ``name`` reads it: a Pattern topic addressed by a name its
        Pattern matches reads that name's records only; by its own Name otherwise, every name."""
        if self.pattern and re.fullmatch(self.pattern, name):
            return replace(self, topic_regex=name_regex(name))
        return self

    @property
    def published_name(self) -> str | None:
        """The one topic name a Pattern topic is addressed by (None: several or none)."""
        return literal_name(self.topic_regex) if self.topic_regex is not None else None


class Client:
    """A connection to a sowstream engine through Kafka.

    ``config`` is passed to every confluent-kafka client as-is (TLS, SASL, ...). Use it as a
    context manager so the reply topic is removed on exit. ``message_type`` is the message type
    of the topics the commands target, as an AMPS connection has one; every command can name
    another with its own ``message_type=``.
    """

    def __init__(
        self,
        bootstrap: str | None = None,
        *,
        name: str | None = None,
        prefix: str = DEFAULT_PREFIX,
        config: Mapping[str, str] | None = None,
        timeout: float = 30.0,
        identity: str = "",
        message_type: str = JSON,
    ) -> None:
        self.message_type = _type_name(message_type)
        self.bootstrap = resolve_bootstrap(bootstrap)
        self.name = name or f"client-{uuid.uuid4().hex[:12]}"
        self.names = TopicNames(prefix)
        self.timeout = timeout
        self._extra = dict(config or {})
        self.reply_topic = self.names.reply(self.name)
        # hashed once: every publish to a plain topic routes by it (_plain_partition)
        self._name_hash = zlib.crc32(self.name.encode())
        self._producer: Producer | None = None
        # Acknowledgements sent as a queue subscription goes: each one holds back the next
        # lease, so they skip the publish producer's linger (see _ack_sender).
        self._acks: Producer | None = None
        self._acks_lock = threading.Lock()  # acks come from reader, timer and app threads
        self._replies: Consumer | None = None
        self._topics: dict[str, TopicInfo] = {}
        # Unread replies go after twice the command timeout (at least a minute): nobody waits.
        self._pending = ReplyBox(keep_s=max(60.0, 2 * timeout))
        self._written: dict[tuple[str, int], int] = {}
        self._delivery_errors: list[str] = []
        self.identity = identity
        self._cond = threading.Condition()
        self._waiting = 0
        self._reader: threading.Thread | None = None
        self._stop = threading.Event()
        self._subscriptions: dict[str, Subscription | QueueSubscription] = {}
        self._bookmarks: dict[str, str] = {}  # sub_id -> last delivered, for MOST_RECENT

    # -- lifecycle ------------------------------------------------------------------------------

    def connect(self) -> Client:
        """Create the reply topic and read the SOW topic definitions; idempotent."""
        if self._producer is not None:
            return self
        ensure_topics(
            self.bootstrap,
            [TopicSpec(self.reply_topic, 1, {"retention.ms": "3600000"})],
            extra=self._extra,
        )
        self._producer = Producer(producer_config(self.bootstrap, self._extra))
        # The group id is the reply topic: the engine reads this group's committed offset to see
        # how far behind the client is (slow-consumer policy).
        self._replies = self._consumer(group=self.reply_topic)
        self._replies.assign([TopicPartition(self.reply_topic, 0, 0)])
        self._stop.clear()
        self._reader = threading.Thread(
            target=self._read_replies, name=f"sowstream-replies-{self.name}", daemon=True
        )
        self._reader.start()
        self.refresh_topics()
        return self

    def close(self) -> None:
        """Flush pending publishes, close the Kafka clients and delete the reply topic."""
        if self._producer is None:
            return
        for sub in list(self._subscriptions.values()):
            sub.close()
        self._producer.flush(self.timeout)
        if self._acks is not None:
            self._acks.flush(self.timeout)
            self._acks = None
        self._stop.set()
        if self._reader is not None:
            self._reader.join(self.timeout)
            self._reader = None
        if self._replies is not None:
            self._replies.close()
        delete_topics(self.bootstrap, [self.reply_topic], extra=self._extra)
        self._producer = None
        self._replies = None

    def __enter__(self) -> Client:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _consumer(self, group: str | None = None) -> Consumer:
        return Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": group or f"{self.name}-{uuid.uuid4().hex[:6]}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "fetch.wait.max.ms": 10,
                "log_level": 4,
                **self._extra,
            }
        )

    def refresh_topics(self) -> dict[str, TopicInfo]:
        """Re-read the meta topic (the engine republishes it whenever a worker starts)."""
        consumer = self._consumer()
        try:
            tp = TopicPartition(self.names.meta, 0)
            try:
                _, high = consumer.get_watermark_offsets(tp, timeout=self.timeout)
            except KafkaException as exc:
                code = exc.args[0].code() if exc.args else None
                if code not in (KafkaError._UNKNOWN_PARTITION, KafkaError.UNKNOWN_TOPIC_OR_PART):
                    raise SowstreamError(
                        f"cannot read the topic definitions from {self.names.meta!r}: {exc}"
                    ) from exc
                high = 0  # no worker has started under this prefix yet
            topics: dict[str, TopicInfo] = {}
            if high > 0:
                consumer.assign([TopicPartition(self.names.meta, 0, 0)])
                deadline = time.monotonic() + self.timeout
                position = 0
                while position < high and time.monotonic() < deadline:
                    for msg in consumer.consume(1000, 0.5):
                        if msg.error():
                            continue
                        position = (msg.offset() or 0) + 1
                        value = msg.value()
                        if value is None:
                            topics.pop((msg.key() or b"").decode(), None)
                        else:
                            info = TopicInfo.from_wire(decode("TopicInfo", value))
                            topics[info.ident] = info
            self._topics = topics
            return topics
        finally:
            consumer.close()

    @property
    def topics(self) -> dict[str, TopicInfo]:
        """The SOW topics the engine serves, by identity (the name; ``<type>:<name>`` for
        message types other than json)."""
        return dict(self._topics)

    def _require(self) -> tuple[Producer, Consumer]:
        if self._producer is None or self._replies is None:
            self.connect()
        assert self._producer is not None and self._replies is not None
        return self._producer, self._replies

    def _type(self, message_type: str | None) -> str:
        """The message type a command targets: its own, else the client's."""
        return self.message_type if message_type is None else _type_name(message_type)

    def topic_info(
        self, topic: str, message_type: str | None = None, *, declare: bool = False
    ) -> TopicInfo:
        """The definition of ``topic`` of ``message_type`` (default: the client's), refreshing
        once if it is not known yet. With ``declare``, a json topic in no configuration is
        created first, as a publish to it would (``engine.auto_create_topics``)."""
        if declare:
            return self._topic_or_declare(topic, message_type)
        ident = topic_ident(topic, self._type(message_type))
        info = self._known(topic, message_type)
        if info is None:
            if ident != topic:
                raise UnknownTopicError(f"{topic} ({self._type(message_type)})")
            raise UnknownTopicError(topic)
        return info

    def _known(self, topic: str, message_type: str | None = None) -> TopicInfo | None:
        """The definition of ``topic`` if the engine has one (refreshing once), else None.

        A name in no definition that a Pattern topic's Pattern matches is that topic, addressed
        by the name (:meth:`TopicInfo.addressed_as`); a topic declared with the name wins.
        """
        kind = self._type(message_type)
        ident = topic_ident(topic, kind)
        for refresh in (False, True):
            topics = self.refresh_topics() if refresh else self._topics
            if ident in topics:
                return topics[ident].addressed_as(topic)
            owner = self._pattern_owner(topic, kind)
            if owner is not None:
                return owner
        return None

    def _pattern_owner(self, name: str, kind: str) -> TopicInfo | None:
        """The Pattern topic of message type ``kind`` whose Pattern matches ``name`` (addressed
        by it), None if there is none or ``name`` is a regular expression itself."""
        if _PATTERN_ONLY.search(name):
            return None
        found = [
            info
            for info in self._topics.values()
            if info.pattern and info.message_type == kind and re.fullmatch(info.pattern, name)
        ]
        if len(found) > 1:
            raise InvalidCommandError(ambiguous_pattern(name, sorted(i.name for i in found)))
        return found[0].addressed_as(name) if found else None

    def _topic_or_declare(self, topic: str, message_type: str | None = None) -> TopicInfo:
        """The definition of ``topic``; a json topic in no configuration is created first, as a
        plain topic, if the engine allows it (``engine.auto_create_topics``)."""
        info = self._known(topic, message_type)
        if info is not None:
            return info
        if self._type(message_type) != JSON:
            return self.topic_info(topic, message_type)  # raises UnknownTopicError
        return self._declare(topic)

    def _declare(self, topic: str) -> TopicInfo:
        """Ask the engine to create ``topic`` (CommandFailedError says why when it refuses)."""
        command_id = uuid.uuid4().hex
        producer, _ = self._require()
        body = self._command_body(h.DECLARE_TOPIC, command_id, topic)
        producer.produce(self.names.auto_control, value=encode("Command", body), partition=0)
        producer.flush(self.timeout)
        self._await_acks(command_id, 1)
        info = self.refresh_topics().get(topic)
        if info is None:
            raise SowstreamError(
                f"topic {topic!r} was created but its definition is not on {self.names.meta!r}"
            )
        return info

    # -- publishing -----------------------------------------------------------------------------

    def _on_delivery(self, err: KafkaError | None, msg: KafkaMessage) -> None:
        if err is not None:
            self._delivery_errors.append(f"{msg.topic()}: {err.str()}")
            return
        # Reports of one partition come in log order: the latest is the highest offset, unless
        # the log was recreated, where it must replace the old log's higher offsets.
        self._written[(msg.topic() or "", msg.partition() or 0)] = msg.offset() or 0

    def flush(self) -> None:
        """Wait until every publish is acknowledged by Kafka; raise if any failed."""
        producer, _ = self._require()
        remaining = producer.flush(self.timeout)
        if remaining:
            raise CommandTimeoutError(f"{remaining} messages were not delivered to Kafka in time")
        if self._delivery_errors:
            errors, self._delivery_errors = self._delivery_errors, []
            raise SowstreamError(f"publish failed: {'; '.join(errors[:5])}")

    @staticmethod
    def _body(
        info: TopicInfo, data: bytes | str | dict[str, Any] | None, *, delta: bool = False
    ) -> tuple[bytes, dict[str, Any]]:
        """The body to publish and its fields: a dict is written in the topic's message type,
        text or bytes are checked against it (a delta_publish in its delta form)."""
        topic, codec = info.name, info.codec
        reason = f"malformed_{codec.name}"
        if data is None:
            raise InvalidMessageError(
                f"topic {topic!r}: no message data", topic=topic, reason=reason
            )
        try:
            if isinstance(data, dict):
                if codec.name == JSON:
                    return orjson.dumps(data), data
                raw = codec.serialise_delta(data) if delta else codec.serialise(data)
                return raw, data
            raw = data.encode() if isinstance(data, str) else bytes(data)
            if not raw:
                raise MessageParseError(codec.name, "empty message body")
            return raw, codec.parse_delta(raw) if delta else codec.parse(raw)
        except (MessageParseError, MessageSerialiseError) as exc:
            label = "topic" if codec.name == JSON else f"{codec.name} topic"
            raise InvalidMessageError(
                f"{label} {topic!r}: {exc}", topic=topic, reason=reason
            ) from exc

    @staticmethod
    def _published_name(info: TopicInfo) -> str | None:
        """The topic name a publish or delete on a Pattern topic goes under (None elsewhere):
        the name the command addressed, which its Pattern must match."""
        if not info.pattern:
            return None
        name = info.published_name
        if name is None or not re.fullmatch(info.pattern, name):
            raise InvalidCommandError(
                f"topic {info.name!r} is a regular expression topic (Pattern {info.pattern!r}): "
                "publish or delete under a topic name its Pattern matches"
            )
        return name

    def _sow_key(
        self,
        info: TopicInfo,
        parsed: dict[str, Any],
        sow_key: str | None,
        name: str | None = None,
    ) -> str | None:
        """The SowKey the engine gives a record of ``info`` (published under ``name`` on a
        Pattern topic, whose names are their own key domains unless KeyDomain is set)."""
        if info.key_generator is not None:
            # The engine recomputes it; the same generator here routes the publish right.
            try:
                function = load_key_generator(info.key_generator, dict(info.key_generator_options))
            except KeyGeneratorError as exc:
                raise InvalidCommandError(
                    f"topic {info.name!r}: its KeyGenerator must be importable by publishers "
                    f"too: {exc}"
                ) from exc
            return generate_sow_key(info.name, info.key_generator, function, parsed)
        if not info.keys:
            if not info.sow and sow_key is None:
                return None  # a plain topic needs no key: Kafka spreads the messages
            return validate_user_sow_key(info.name, sow_key)
        if name is not None:
            return generated_sow_key(name, info.key_domain or name, info.keys, parsed)
        return generated_sow_key(info.name, info.key_domain, info.keys, parsed)

    def _plain_partition(self, info: TopicInfo) -> int:
        """The one partition this client publishes an unkeyed plain topic's messages to.

        A keyless record would land on a random partition and overtake its predecessors; one
        partition per publisher keeps a publisher's messages in order, as AMPS subscribers expect.
        """
        return self._name_hash % info.partitions

    def _produce(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: str | None = None,
        partition: int | None = None,
        headers: dict[str, str | None],
    ) -> None:
        producer, _ = self._require()
        kwargs: dict[str, Any] = {
            "key": key.encode() if key is not None else None,
            "value": value,
            "headers": h.to_kafka_headers(headers),
            "on_delivery": self._on_delivery,
        }
        if partition is not None:
            kwargs["partition"] = partition
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:
                producer.poll(0.05)  # local queue full: let deliveries drain
        producer.poll(0)

    def publish(
        self,
        topic: str,
        data: bytes | str | dict[str, Any],
        *,
        sow_key: str | None = None,
        expiration: int | str | None = None,
        ack: bool = False,
        message_type: str | None = None,
    ) -> str | None:
        """Insert or fully replace a record; returns its SowKey (None on an unkeyed plain topic).

        ``expiration`` (seconds, ``0`` = never) overrides the topic's default. With ``ack`` the
        call waits until the engine applied the publish and raises if it was rejected. ``data``
        is the body in the topic's message type (bytes or text), or a dict of its fields.
        """
        return self._publish(h.PUBLISH, topic, data, sow_key, expiration, ack, message_type)

    def delta_publish(
        self,
        topic: str,
        data: bytes | str | dict[str, Any],
        *,
        sow_key: str | None = None,
        expiration: int | str | None = None,
        ack: bool = False,
        message_type: str | None = None,
    ) -> str | None:
        """Merge ``data`` into the stored record (insert if absent); returns its SowKey."""
        return self._publish(h.DELTA_PUBLISH, topic, data, sow_key, expiration, ack, message_type)

    def _publish(
        self,
        command: str,
        topic: str,
        data: bytes | str | dict[str, Any] | None,
        sow_key: str | None,
        expiration: int | str | None,
        ack: bool,
        message_type: str | None = None,
    ) -> str | None:
        info = self._topic_or_declare(topic, message_type)
        info.refuse_writes()
        name = self._published_name(info)
        raw, parsed = self._body(info, data, delta=command == h.DELTA_PUBLISH)
        key = self._sow_key(info, parsed, sow_key, name)
        command_id = uuid.uuid4().hex if ack else None
        self._produce(
            info.log_topic,
            raw,
            key=key,
            partition=self._plain_partition(info) if key is None else None,
            headers={
                h.COMMAND: command if command != h.PUBLISH else None,
                h.EXPIRATION: str(expiration) if expiration is not None else None,
                h.REPLY_TO: self.reply_topic if ack else None,
                h.COMMAND_ID: command_id,
                h.TOPIC: name,
            },
        )
        if command_id is not None:
            self.flush()
            self._await_acks(command_id, 1)
        return key

    def sow_delete(
        self,
        topic: str,
        *,
        filter: str | None = None,
        sow_keys: list[str] | tuple[str, ...] | None = None,
        data: bytes | str | dict[str, Any] | None = None,
        bookmarks: str | list[str] | tuple[str, ...] | None = None,
        options: str | None = None,
        message_type: str | None = None,
    ) -> int:
        """Delete records by content filter (``1=1`` = all), by SowKeys, or by message data.

        Returns how many records were deleted, once every partition has answered. On a queue,
        ``bookmarks`` acknowledges messages as AMPS does (``options`` ``cancel`` or ``expire``
        return or expire them instead): the same as :meth:`ack`.
        """
        if bookmarks is not None:
            return self.ack(topic, bookmarks, action=options or "")
        given = [x is not None for x in (filter, sow_keys, data)]
        if sum(given) != 1:
            raise InvalidCommandError("sow_delete takes exactly one of filter=, sow_keys= or data=")
        info = self._known(topic, message_type)
        if info is None:
            return 0  # a topic in no configuration keeps no SOW: nothing to delete
        info.refuse_writes()

        name = self._published_name(info)
        command_id = uuid.uuid4().hex
        base: dict[str, str | None] = {
            h.COMMAND: h.SOW_DELETE,
            h.REPLY_TO: self.reply_topic,
            h.COMMAND_ID: command_id,
            h.TOPIC: name,  # a Pattern topic: only this name's records
        }
        if filter is not None:
            compile_filter(filter)  # a bad filter fails here, with its position
            for partition in range(info.partitions):
                self._produce(
                    info.log_topic, None, partition=partition, headers={**base, h.FILTER: filter}
                )
            expected = info.partitions
        elif sow_keys is not None:
            for sow_key in sow_keys:
                self._produce(info.log_topic, None, key=sow_key, headers=base)
            expected = len(sow_keys)
        else:
            raw, parsed = self._body(info, data)
            key = self._sow_key(info, parsed, None, name)
            self._produce(info.log_topic, raw, key=key, headers=base)
            expected = 1
        self.flush()
        return self._await_acks(command_id, expected) if expected else 0

    # -- replies --------------------------------------------------------------------------------

    def _read_replies(self) -> None:
        """The reply reader thread: routes engine replies to commands, live messages to
        subscriptions, and commits its position so the engine can see a slow consumer."""
        replies = self._replies
        assert replies is not None
        last_commit = 0.0
        position = -1
        while not self._stop.is_set():
            now = time.monotonic()
            if (position >= 0 and now - last_commit > 0.5) or now - last_commit > HEARTBEAT_SECONDS:
                last_commit = now
                # The position informs the slow-consumer policy; the time in the metadata tells
                # the engine this client is alive (a killed one stops, and its leases go back).
                tp = TopicPartition(
                    self.reply_topic, 0, max(position + 1, 0), str(int(time.time() * 1000))
                )
                with contextlib.suppress(KafkaException):
                    replies.commit(offsets=[tp], asynchronous=True)
            if self._waiting == 0 and any(
                s.backlog() >= MAX_BUFFERED for s in self._subscriptions.values()
            ):
                time.sleep(0.05)  # the application is behind: leave the backlog in Kafka
                continue
            # poll() returns with the first message; consume(…, 0) then takes what else is there
            # (consume with a timeout would wait for the full count and add latency)
            try:
                first = replies.poll(0.1)
                msgs = [first, *replies.consume(500, 0)] if first is not None else []
            except (KafkaException, RuntimeError):
                if self._stop.is_set():
                    return
                raise
            for msg in msgs:
                if msg.error():
                    continue
                position = max(position, msg.offset() or 0)
                self._route(msg)

    def _route(self, msg: KafkaMessage) -> None:
        value = msg.value()
        headers = h.header_map(cast(h.RawHeaders, msg.headers()))
        command = headers.get(h.COMMAND)
        if command is not None:
            sub = self._subscriptions.get(headers.get(h.SUB_ID, ""))
            if sub is None:
                return  # unsubscribed meanwhile
            if command == FAILURE:
                sub.fail(
                    SubscriptionDroppedError(
                        f"subscription {sub.sub_id}: {headers.get(h.REASON, '')}: "
                        f"{(value or b'').decode('utf-8', 'replace')}"
                    )
                )
                self._subscriptions.pop(sub.sub_id, None)
                return
            if command == LOG_RESET:
                if isinstance(sub, Subscription):
                    sub.reset_partition(
                        headers.get(h.TOPIC, ""),
                        int(headers.get(h.PARTITION, "0")),
                        int(headers.get(h.OFFSET, "-1")),
                    )
                return
            sub.on_live(_Live.from_headers(value, headers))
            return
        if value is None:
            return
        reply = decode("Reply", value)
        with self._cond:
            self._pending.park(reply, time.monotonic())
            self._cond.notify_all()

    def _next_reply(self, command_id: str, deadline: float) -> dict[str, Any]:
        """The next reply for ``command_id`` (the reader thread parks replies per command)."""
        self._require()
        with self._cond:
            self._waiting += 1
            try:
                while (reply := self._pending.take(command_id, time.monotonic())) is None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise CommandTimeoutError(
                            f"no complete answer to command {command_id} within "
                            f"{self.timeout:.0f}s: is a worker running for every partition?"
                        )
                    self._cond.wait(min(remaining, 0.5))
                return reply
            finally:
                self._waiting -= 1

    def _await_acks(self, command_id: str, expected: int) -> int:
        deadline = time.monotonic() + self.timeout
        total = 0
        answered: set[tuple[str, int, int]] = set()
        while len(answered) < expected:
            reply = self._next_reply(command_id, deadline)
            # a log record (or a command) replayed after a rebalance is acked twice: count it once
            origin = (reply["topic"], reply["partition"], reply["log_offset"])
            if origin[2] >= 0 and origin in answered:
                continue
            answered.add(origin if origin[2] >= 0 else ("", -1, len(answered)))
            if reply["status"] != "success":
                raise CommandFailedError(
                    reply["message"] or reply["reason"],
                    reason=reply["reason"],
                    command_id=command_id,
                )
            total += reply["count"]
        return total

    # -- queries --------------------------------------------------------------------------------

    def _resolve_topics(
        self, topic: str, message_type: str | None = None, *, declare: bool = False
    ) -> list[TopicInfo]:
        """The topics of ``message_type`` that ``topic`` names, or whose names it matches; with
        ``declare`` a json name no topic matches is created (a plain topic) if the engine
        allows it."""
        kind = self._type(message_type)
        known = self._known(topic, message_type)
        if known is not None:
            return [known]
        if _REGEX_CHARS.search(topic):
            of_type = {i.name: i for i in self._topics.values() if i.message_type == kind}
            matched = match_topic_names(topic, sorted(of_type))
            # A regular expression (not a name) may match names of every Pattern topic: each
            # reads those of its records.
            scoped = [
                replace(i, topic_regex=topic)
                for i in of_type.values()
                if i.pattern and _PATTERN_ONLY.search(topic)
            ]
            plain = [of_type[name] for name in matched if not of_type[name].pattern]
            if plain or scoped:
                return [*plain, *sorted(scoped, key=lambda i: i.name)]
        if declare and kind == JSON and not _PATTERN_ONLY.search(topic):
            return [self._declare(topic)]
        raise UnknownTopicError(topic if kind == JSON else f"{topic} ({kind})")

    def sow(
        self,
        topic: str,
        filter: str | None = None,
        *,
        sow_keys: list[str] | tuple[str, ...] | None = None,
        order_by: str | None = None,
        top_n: int | None = None,
        skip_n: int | None = None,
        batch_size: int = CLIENT_DEFAULT_BATCH_SIZE,
        query_id: str | None = None,
        bookmark: str | None = None,
        grouping: str | None = None,
        projection: str | None = None,
        message_type: str | None = None,
    ) -> Iterator[Message]:
        """Query the SOW: ``group_begin``, one ``sow`` message per matching record, ``group_end``.

        ``topic`` is a SOW topic name or a regular expression over them. Results are complete
        across all partitions; each partition's part is a consistent snapshot that includes this
        client's own earlier publishes. With ``bookmark`` (a timestamp such as
        ``20261123T080000``) the answer is the SOW as it was then (topics with History).
        With ``grouping='[/f]'`` and ``projection='[/f, COUNT(/id) AS /n, ...]'`` the answer is
        one record per group, aggregated over every partition (OrderBy and top_n apply to it).
        Records come in the topic's message type (``message_type``, default the client's).
        """
        opts = validate_query(
            filter=filter, order_by=order_by, top_n=top_n, skip_n=skip_n, batch_size=batch_size
        )
        if bookmark:
            parse_bookmark(bookmark)  # a typo fails here, naming the bookmark
        aggregation = None
        options: dict[str, str] = {"bookmark": bookmark} if bookmark else {}
        if grouping is not None or projection is not None:
            aggregation = parse_aggregation(grouping, projection)
            options.update(grouping=grouping or "", projection=projection or "")
        try:
            resolved = self._resolve_topics(topic, message_type)
        except UnknownTopicError:
            if _PATTERN_ONLY.search(topic) or self._type(message_type) != JSON:
                raise
            resolved = []  # a topic in no configuration: a plain topic, so no SOW
        if len(resolved) == 1 and resolved[0].queue:
            # Browsing a queue: the messages available now, nothing leased or removed.
            if bookmark or aggregation is not None or sow_keys is not None:
                raise InvalidCommandError(
                    f"queue {topic!r} can be browsed with a filter, OrderBy and top_n only"
                )
            return self._queue_query(resolved[0].name, "sow", filter, opts)
        infos = [info for info in resolved if info.sow]
        if not infos:
            raise InvalidCommandError(
                f"topic {topic!r} has no SOW: it can be subscribed to, not queried"
            )
        query_id = query_id or uuid.uuid4().hex[:16]
        command_id = uuid.uuid4().hex
        self.flush()  # read-your-writes: know the offsets of our own publishes first
        producer, _ = self._require()
        for info in infos:
            for partition in range(info.partitions):
                command = self._command_body(
                    "sow",
                    command_id,
                    info.name,
                    message_type=info.message_type,
                    query_id=query_id,
                    filter=filter,
                    sow_keys=list(sow_keys) if sow_keys is not None else None,
                    order_by=order_by,
                    top_n=top_n,
                    skip_n=skip_n,
                    batch_size=batch_size,
                    after_offset=self._written.get((info.log_topic, partition), -1),
                    options=options,
                    topic_regex=info.topic_regex,
                )
                producer.produce(
                    info.control_topic, value=encode("Command", command), partition=partition
                )
        producer.flush(self.timeout)
        expected = sum(info.partitions for info in infos)
        return self._collect(
            command_id, query_id, expected, opts, aggregation=aggregation, codec=_codec_of(infos)
        )

    def _collect(
        self,
        command_id: str,
        query_id: str,
        expected: int,
        opts: QueryOptions,
        on_part_end: Callable[[str, int, int], None] | None = None,
        *,
        aggregation: Aggregation | None = None,
        codec: MessageType | None = None,
    ) -> Iterator[Message]:
        """The answers to ``command_id`` as one group; ``codec`` is the records' message type
        when it is not json (their messages parse with it, aggregates are written in it)."""
        deadline = time.monotonic() + self.timeout
        yield Message("group_begin", query_id=query_id)
        buffered: list[Message] = []
        # Records wait per (topic, partition, answer) until that answer's part_end: after a
        # rebalance two workers may answer one partition, and the first complete answer wins.
        partial: dict[tuple[str, int, str], list[Message]] = defaultdict(list)
        complete: set[tuple[str, int]] = set()
        oofs: list[Message] = []
        partials: list[Any] = []
        sent = 0
        while len(complete) < expected:
            reply = self._next_reply(command_id, deadline)
            part = (reply["topic"], reply["partition"])
            if part in complete:
                continue
            if reply["status"] != "success":
                raise CommandFailedError(
                    f"topic {reply['topic']!r}: {reply['message'] or reply['reason']}",
                    reason=reply["reason"],
                    command_id=command_id,
                )
            answer = (*part, reply["answer_id"])
            if reply["command"] == "oof":  # a replace moved these records out of scope
                partial[answer].extend(
                    Message(
                        "oof",
                        topic=rec.get("topic") or reply["topic"],
                        sow_key=rec["sow_key"],
                        query_id=query_id,
                        data=rec["data"],
                        timestamp=rec["timestamp"],
                        reason=reply["reason"],
                        bookmark=message_bookmark(
                            rec["timestamp"], reply["partition"], rec["log_offset"]
                        ),
                        codec=codec,
                    )
                    for rec in reply["records"]
                )
                continue
            if reply["command"] == "partial":
                partial[answer].extend(
                    Message("partial", topic=reply["topic"], data=rec["data"])
                    for rec in reply["records"]
                )
                continue
            if reply["command"] == "sow":
                partial[answer].extend(
                    Message(
                        "sow",
                        topic=rec.get("topic") or reply["topic"],
                        sow_key=rec["sow_key"],
                        query_id=query_id,
                        data=rec["data"],
                        timestamp=rec["timestamp"],
                        batch_size=len(reply["records"]),
                        bookmark=message_bookmark(
                            rec["timestamp"], reply["partition"], rec["log_offset"]
                        ),
                        codec=codec,
                    )
                    for rec in reply["records"]
                )
                continue
            complete.add(part)
            if on_part_end is not None:
                on_part_end(reply["topic"], reply["partition"], reply["log_offset"])
            records = partial.pop(answer, [])
            for other in [a for a in partial if a[:2] == part]:
                del partial[other]
            oofs.extend(m for m in records if m.command == "oof")
            partials.extend(orjson.loads(m.data) for m in records if m.command == "partial")
            records = [m for m in records if m.command not in ("oof", "partial")]
            if opts.ordered or aggregation is not None:
                buffered.extend(records)
            else:
                sent += len(records)
                yield from records
        if aggregation is not None:
            write = codec.serialise if codec is not None else orjson.dumps
            buffered = [
                Message("sow", query_id=query_id, data=write(row), codec=codec)
                for row in aggregation.finish(merge_partials(aggregation, partials))
            ]
        if opts.ordered or aggregation is not None:
            if opts.order_by:
                key = result_order(opts.order_by)
                buffered.sort(key=lambda m: key((m.sow_key, m.fields())))
            for msg in buffered[opts.skip_n : opts.keep]:
                sent += 1
                yield msg
        yield Message("group_end", query_id=query_id, count=sent)
        yield from oofs

    def sow_records(self, topic: str, filter: str | None = None, **options: Any) -> list[Any]:
        """Convenience: a :meth:`sow` query's records in order: parsed for json, the raw bodies
        for other message types (``Message.fields()`` parses those)."""
        found = [m for m in self.sow(topic, filter, **options) if m.command == "sow"]
        return [m.json() if m.codec is None else m.data for m in found]

    # -- subscriptions --------------------------------------------------------------------------

    def subscribe(
        self,
        topic: str,
        filter: str | None = None,
        *,
        sow_keys: list[str] | tuple[str, ...] | None = None,
        options: str | SubscriptionOptions | None = None,
        sub_id: str | None = None,
        on_message: MessageHandler | None = None,
        bookmark: str | None = None,
        auto_ack: bool = False,
        ack_batch_size: int = 1,
        ack_interval: float = 1.0,
        message_type: str | None = None,
    ) -> Subscription | QueueSubscription:
        """Live messages for records of ``topic`` that match ``filter``, from now on.

        With ``bookmark`` (a timestamp, a message's ``bookmark``, ``EPOCH`` or ``MOST_RECENT``)
        the log's matching messages since then are replayed first, then live ones follow.
        With ``sow_keys`` only messages for those SowKeys are delivered.

        On a queue this leases messages instead (a :class:`QueueSubscription`; ``max_backlog=n``
        in ``options``): acknowledge each with ``sub.ack(message)``, or pass ``auto_ack=True``;
        acks go out per ``ack_batch_size`` messages or ``ack_interval`` seconds, whichever first.
        A bookmark on a queue replays its topics' logs without leasing anything.
        """
        if bookmark is None and self._is_queue(topic, message_type):
            if sow_keys is not None:
                raise InvalidCommandError(
                    f"queue {topic!r} leases messages, not records: SowKeys do not apply"
                )
            info = self.topic_info(topic, message_type)
            return self._queue_subscribe(
                info, filter, options, sub_id, on_message, auto_ack, ack_batch_size, ack_interval
            )
        return self._subscribe(
            SUBSCRIBE,
            topic,
            filter,
            options,
            sub_id,
            on_message,
            bookmark=bookmark,
            sow_keys=sow_keys,
            message_type=message_type,
        )

    def delta_subscribe(
        self,
        topic: str,
        filter: str | None = None,
        *,
        sow_keys: list[str] | tuple[str, ...] | None = None,
        options: str | SubscriptionOptions | None = None,
        sub_id: str | None = None,
        on_message: MessageHandler | None = None,
        bookmark: str | None = None,
        message_type: str | None = None,
    ) -> Subscription | QueueSubscription:
        """Like :meth:`subscribe`, but updates to known records carry only what changed.

        On a queue it leases whole messages, as :meth:`subscribe` does (AMPS accepts it too),
        and so does a topic whose message type has no deltas (``binary``).
        """
        if bookmark is None and self._is_queue(topic, message_type):
            return self.subscribe(
                topic,
                filter,
                options=options,
                sub_id=sub_id,
                on_message=on_message,
                message_type=message_type,
            )
        return self._subscribe(
            DELTA_SUBSCRIBE,
            topic,
            filter,
            options,
            sub_id,
            on_message,
            bookmark=bookmark,
            sow_keys=sow_keys,
            message_type=message_type,
        )

    def sow_and_subscribe(
        self,
        topic: str,
        filter: str | None = None,
        *,
        sow_keys: list[str] | tuple[str, ...] | None = None,
        options: str | SubscriptionOptions | None = None,
        order_by: str | None = None,
        top_n: int | None = None,
        skip_n: int | None = None,
        batch_size: int = CLIENT_DEFAULT_BATCH_SIZE,
        sub_id: str | None = None,
        query_id: str | None = None,
        on_message: MessageHandler | None = None,
        bookmark: str | None = None,
        message_type: str | None = None,
    ) -> Subscription:
        """The matching records now (``group_begin`` … ``group_end``), then live messages.

        As if query and subscription were placed at one instant: each record is in the SOW part
        or in a later message, never missing, never twice. With ``top_n`` (and ``skip_n``,
        ``order_by``) the window stays live. With ``options='replace'`` and an existing
        ``sub_id`` the subscription's filter changes in place. With ``bookmark`` on a topic with
        History: the SOW as it was then, the log replayed from there, then live messages.
        With ``sow_keys`` only those records take part, in the SOW part and live.
        """
        return self._subscribe(
            SOW_AND_SUBSCRIBE,
            topic,
            filter,
            options,
            sub_id,
            on_message,
            order_by=order_by,
            top_n=top_n,
            skip_n=skip_n,
            batch_size=batch_size,
            query_id=query_id,
            bookmark=bookmark,
            sow_keys=sow_keys,
            message_type=message_type,
        )

    def sow_and_delta_subscribe(
        self,
        topic: str,
        filter: str | None = None,
        *,
        sow_keys: list[str] | tuple[str, ...] | None = None,
        options: str | SubscriptionOptions | None = None,
        order_by: str | None = None,
        top_n: int | None = None,
        skip_n: int | None = None,
        batch_size: int = CLIENT_DEFAULT_BATCH_SIZE,
        sub_id: str | None = None,
        query_id: str | None = None,
        on_message: MessageHandler | None = None,
        bookmark: str | None = None,
        message_type: str | None = None,
    ) -> Subscription:
        """:meth:`sow_and_subscribe` whose live updates carry only what changed."""
        return self._subscribe(
            SOW_AND_DELTA_SUBSCRIBE,
            topic,
            filter,
            options,
            sub_id,
            on_message,
            order_by=order_by,
            top_n=top_n,
            skip_n=skip_n,
            batch_size=batch_size,
            query_id=query_id,
            bookmark=bookmark,
            sow_keys=sow_keys,
            message_type=message_type,
        )

    def unsubscribe(self, subscription: Subscription | QueueSubscription | str) -> None:
        """End a subscription (by object or SubId)."""
        sub = (
            self._subscriptions.get(subscription) if isinstance(subscription, str) else subscription
        )
        if sub is not None:
            sub.close()

    def _resolve_bookmark(self, bookmark: str, sub_id: str | None) -> str:
        """MOST_RECENT: after the last message this client delivered for ``sub_id``, else EPOCH.

        Anything else is checked here so a typo fails before the subscription is registered.
        """
        if bookmark.strip().upper() == MOST_RECENT:
            return self._bookmarks.get(sub_id or "", EPOCH)
        parse_bookmark(bookmark)
        return bookmark

    def _drop_subscription(self, sub: Subscription | QueueSubscription) -> None:
        if sub.last_bookmark:
            self._bookmarks[sub.sub_id] = sub.last_bookmark
        self._subscriptions.pop(sub.sub_id, None)
        if self._producer is None:
            return
        for spec in sub.specs:
            self._producer.produce(self.names.subscriptions, key=spec.key.encode(), value=None)
        self._producer.flush(self.timeout)

    def _subscribe(
        self,
        command: str,
        topic: str,
        filter: str | None,
        options: str | SubscriptionOptions | None,
        sub_id: str | None,
        on_message: MessageHandler | None,
        *,
        order_by: str | None = None,
        top_n: int | None = None,
        skip_n: int | None = None,
        batch_size: int = CLIENT_DEFAULT_BATCH_SIZE,
        query_id: str | None = None,
        bookmark: str | None = None,
        sow_keys: list[str] | tuple[str, ...] | None = None,
        message_type: str | None = None,
    ) -> Subscription:
        user = options if isinstance(options, SubscriptionOptions) else parse_options(options)
        top_n = top_n if top_n is not None else user.top_n
        skip_n = skip_n if skip_n is not None else user.skip_n
        validate_query(
            filter=filter, order_by=order_by, top_n=top_n, skip_n=skip_n, batch_size=batch_size
        )
        if top_n is not None and command not in WITH_SOW:
            raise InvalidCommandError("top_n/skip_n need sow_and_subscribe: a window needs a SOW")
        user = replace(user, top_n=top_n, skip_n=skip_n)
        found = self._subscriptions.get(sub_id) if sub_id else None
        existing = found if isinstance(found, Subscription) else None
        if found is not None and existing is None:
            raise InvalidCommandError(f"subscription id {sub_id!r} is a queue subscription")
        if user.replace:
            return self._replace(existing, command, topic, filter, user, order_by, batch_size)
        if existing is not None:
            raise InvalidCommandError(
                f"subscription id {sub_id!r} is in use: pass options='replace' to change it"
            )
        if bookmark is not None:
            bookmark = self._resolve_bookmark(bookmark, sub_id)
        sub_id = sub_id or uuid.uuid4().hex[:16]
        infos = self._resolve_topics(topic, message_type, declare=True)
        if any(info.queue for info in infos):
            if (command != SUBSCRIBE and command != DELTA_SUBSCRIBE) or bookmark is None:
                raise InvalidCommandError(
                    f"{command} is not available on queue {topic!r}: subscribe leases its "
                    "messages, sow browses them"
                )
            # A bookmark replays the queue's topics, without leases (AMPS does the same).
            infos = [self.topic_info(u) for info in infos for u in (info.queue_of or [info.name])]
        # A window needs every change of the filtered set, whole, with the reason a record left.
        wire = replace(user, oof=True, select=None, no_empties=False) if top_n is not None else user
        specs = [
            SubscriptionSpec(
                sub_id=sub_id,
                reply_to=self.reply_topic,
                topic=info.name,
                command=command,
                filter=filter,
                options=wire,
                identity=self.identity,
                order_by=order_by,
                sow_keys=frozenset(sow_keys) if sow_keys is not None else None,
                message_type=info.message_type,
                topic_regex=info.topic_regex,
            )
            for info in infos
        ]
        window = None
        if top_n is not None:
            # Each window keeps its own result set: two subscriptions' streams (their SOW parts
            # applied late, their conflation intervals) would move a shared one back in time.
            window = PageWindow(
                ResultSet(validate_query(order_by=order_by).order_by), top_n, skip_n or 0
            )
        sub = Subscription(
            sub_id,
            specs,
            user,
            key_fields={info.name: info.keys for info in infos},
            patterns={info.name: info.pattern for info in infos if info.pattern},
            codec=_codec_of(infos),
            window=window,
            on_message=on_message,
            unsubscribe=self._drop_subscription,
        )
        self._subscriptions[sub_id] = sub
        try:
            self._register(specs)
            group = self._place(
                sub,
                infos,
                command,
                filter,
                wire,
                order_by,
                batch_size,
                query_id,
                None,
                bookmark=bookmark,
            )
        except BaseException:
            self._drop_subscription(sub)
            raise
        if command in WITH_SOW:
            sub.deliver_group(group)
        else:
            for _ in group:  # placement: wait until every partition runs the subscription
                pass
        sub.release()
        return sub

    def _is_queue(self, topic: str, message_type: str | None = None) -> bool:
        info = self._known(topic, message_type)
        return info is not None and info.queue

    def _queue_subscribe(
        self,
        info: TopicInfo,
        filter: str | None,
        options: str | SubscriptionOptions | None,
        sub_id: str | None,
        on_message: MessageHandler | None,
        auto_ack: bool,
        ack_batch_size: int,
        ack_interval: float,
    ) -> QueueSubscription:
        user = options if isinstance(options, SubscriptionOptions) else parse_options(options)
        validate_query(filter=filter)
        if sub_id is not None and sub_id in self._subscriptions and not user.replace:
            raise InvalidCommandError(
                f"subscription id {sub_id!r} is in use: pass options='replace' to change it"
            )
        sub_id = sub_id or uuid.uuid4().hex[:16]
        spec = SubscriptionSpec(
            sub_id=sub_id,
            reply_to=self.reply_topic,
            topic=info.name,
            command=SUBSCRIBE,
            filter=filter,
            options=replace(user, replace=False),
            identity=self.identity,
        )
        sub = QueueSubscription(
            sub_id,
            [spec],
            lambda bookmarks, action: self._send_acks(info.name, bookmarks, action),
            auto_ack=auto_ack,
            ack_batch_size=ack_batch_size,
            ack_interval=ack_interval,
            on_message=on_message,
            unsubscribe=self._drop_subscription,
        )
        self._subscriptions[sub_id] = sub
        self._register([spec])
        # Connected, with the control topics' metadata, before the first acknowledgement: the
        # first one would otherwise wait for both while the backlog stays full.
        acks = self._ack_sender()
        for topic in info.queue_of:
            acks.list_topics(self.names.control(topic), timeout=self.timeout)
        return sub

    def ack(
        self,
        queue: str,
        bookmarks: str | list[str] | tuple[str, ...] | None = None,
        *,
        action: str = "",
        filter: str | None = None,
        wait: bool = True,
    ) -> int:
        """Acknowledge queue messages by bookmark (or every one matching ``filter``).

        ``action='cancel'`` returns them to the queue, ``'expire'`` expires them. With ``wait``
        the call returns how many messages it removed or returned once the engine answered;
        without, it returns 0 at once and the engine sends no answer.
        """
        info = self.topic_info(queue)
        if not info.queue:
            raise InvalidCommandError(f"topic {queue!r} is not a queue: only queues take acks")
        if action not in ("", "cancel", "expire"):
            raise InvalidCommandError(f"unknown ack action {action!r}: use cancel or expire")
        targets: dict[tuple[str, int], list[str]] = defaultdict(list)
        if filter is not None:
            compile_filter(filter)
            for topic in info.queue_of:
                for partition in range(self.topic_info(topic).partitions):
                    targets[(topic, partition)] = []
        else:
            if isinstance(bookmarks, str):
                bookmarks = [b for b in bookmarks.split(",") if b.strip()]
            if not bookmarks:
                raise InvalidCommandError("ack needs bookmarks or a filter")
            for text in bookmarks:
                try:
                    where = QueueBookmark.parse(text.strip())
                except ValueError as exc:
                    raise InvalidCommandError(str(exc)) from None
                if where.topic not in info.queue_of:
                    raise InvalidCommandError(
                        f"bookmark {text!r} is not a message of queue {queue!r} (its topic "
                        f"{where.topic!r} does not feed it)"
                    )
                targets[(where.topic, where.partition)].append(text.strip())
        command_id = uuid.uuid4().hex
        producer, _ = self._require()
        options = {"action": action}
        if not wait:
            # Nobody waits for the answer: ask for none, and send without lingering.
            producer = self._ack_sender()
            options["ack_type"] = "none"
        for (topic, partition), group in targets.items():
            body = self._command_body(
                "queue_ack",
                command_id,
                info.name,
                filter=filter,
                options={**options, "bookmarks": ",".join(group)},
            )
            producer.produce(
                self.names.control(topic), value=encode("Command", body), partition=partition
            )
        if not wait:
            producer.poll(0)
            return 0
        producer.flush(self.timeout)
        return self._await_acks(command_id, len(targets))

    def _send_acks(self, queue: str, bookmarks: list[str], action: str) -> None:
        self.ack(queue, bookmarks, action=action, wait=False)

    def _ack_sender(self) -> Producer:
        """The producer of acknowledgements nobody waits for, created on first use.

        The publish producer lingers 5 ms to batch publishes; an acknowledgement that lingers
        holds a backlog unit that long, which at backlog 1 tripled the time per message
        (docs/benchmarks.md). Commands that wait for their answer flush instead.
        """
        self._require()
        with self._acks_lock:
            if self._acks is None:
                config = {**producer_config(self.bootstrap, self._extra), "linger.ms": 0}
                self._acks = Producer(config)
            return self._acks

    def _command_body(
        self, command: str, command_id: str, topic: str, **fields: Any
    ) -> dict[str, Any]:
        """A Command record for ``topic`` from this client, ``fields`` over the defaults."""
        body: dict[str, Any] = {
            "command": command,
            "command_id": command_id,
            "query_id": "",
            "reply_to": self.reply_topic,
            "topic": topic,
            "filter": None,
            "sow_keys": None,
            "order_by": None,
            "top_n": None,
            "skip_n": None,
            "batch_size": 1,
            "after_offset": -1,
            "options": {},
            "sub_id": "",
            "identity": self.identity,
            "sub_options": "",
            "previous_filter": None,
            "message_type": JSON,
            "topic_regex": None,
        }
        body.update(fields)
        return body

    def queue_status(self, queue: str) -> dict[str, int]:
        """A queue's depth, leased messages and counters (delivered, acked, expiries by reason),
        summed over its partitions."""
        if not self.topic_info(queue).queue:
            raise InvalidCommandError(f"topic {queue!r} is not a queue")
        total: Counter[str] = Counter()
        for msg in self._queue_query(queue, "queue_status", None, validate_query()):
            if msg.command == "sow":
                row = msg.json()
                row.pop("topic", None)
                total.update(row)
        return {"depth": 0, "leased": 0, **total}

    def status(self, topic: str | None = None) -> list[dict[str, Any]]:
        """Every partition of every topic (or of ``topic``, a name or regular expression): the
        worker serving it, its watermark and its warnings (such as a recreated log)."""
        infos = self._resolve_topics(topic) if topic else list(self.refresh_topics().values())
        # A queue's own record stands for its topics, which have records of their own.
        infos = [i for i in infos if not i.queue or i.name in i.queue_of]
        command_id = uuid.uuid4().hex
        query_id = uuid.uuid4().hex[:16]
        producer, _ = self._require()
        for info in infos:
            for partition in range(info.partitions):
                body = self._command_body("status", command_id, info.name, query_id=query_id)
                producer.produce(
                    info.control_topic, value=encode("Command", body), partition=partition
                )
        producer.flush(self.timeout)
        expected = sum(info.partitions for info in infos)
        rows = [
            m.json()
            for m in self._collect(command_id, query_id, expected, validate_query())
            if m.command == "sow"
        ]
        return sorted(rows, key=lambda row: (row["topic"], row["partition"]))

    def _queue_query(
        self, queue: str, command: str, filter: str | None, opts: QueryOptions
    ) -> Iterator[Message]:
        """Send ``command`` about ``queue`` to every partition of its topics; read the answers."""
        info = self.topic_info(queue)
        command_id = uuid.uuid4().hex
        query_id = uuid.uuid4().hex[:16]
        producer, _ = self._require()
        expected = 0
        for topic in info.queue_of:
            for partition in range(self.topic_info(topic).partitions):
                body = self._command_body(
                    command, command_id, info.name, query_id=query_id, filter=filter, batch_size=500
                )
                producer.produce(
                    self.names.control(topic), value=encode("Command", body), partition=partition
                )
                expected += 1
        producer.flush(self.timeout)
        for msg in self._collect(command_id, query_id, expected, opts):
            # A queue message is acknowledged by its bookmark, which the engine puts in sow_key.
            yield replace(msg, bookmark=msg.sow_key) if msg.command == "sow" else msg

    def _register(self, specs: list[SubscriptionSpec]) -> None:
        """Write the registrations to the registry topic (so any worker can serve them)."""
        producer, _ = self._require()
        for spec in specs:
            producer.produce(
                self.names.subscriptions,
                key=spec.key.encode(),
                value=encode("Subscription", spec.to_wire()),
            )
        if producer.flush(self.timeout):
            raise CommandTimeoutError("could not register the subscription in time")

    def _place(
        self,
        sub: Subscription,
        infos: list[TopicInfo],
        command: str,
        filter: str | None,
        options: SubscriptionOptions,
        order_by: str | None,
        batch_size: int,
        query_id: str | None,
        previous_filter: str | None,
        on_part_end: Callable[[str, int, int], None] | None = None,
        bookmark: str | None = None,
    ) -> Iterator[Message]:
        """Send the subscription to every partition and read the answers (as a SOW group)."""
        query_id = query_id or uuid.uuid4().hex[:16]
        command_id = uuid.uuid4().hex
        held = sub.specs[0].sow_keys if sub.specs else None
        keys = sorted(held) if held is not None else None
        self.flush()  # read-your-writes, as for sow
        producer, _ = self._require()
        for info in infos:
            for partition in range(info.partitions):
                body = self._command_body(
                    command,
                    command_id,
                    info.name,
                    message_type=info.message_type,
                    query_id=query_id,
                    filter=filter,
                    order_by=order_by,
                    batch_size=batch_size,
                    after_offset=self._written.get((info.log_topic, partition), -1),
                    options={"bookmark": bookmark} if bookmark else {},
                    sub_id=sub.sub_id,
                    sub_options=options.to_text(),
                    previous_filter=previous_filter,
                    sow_keys=keys,
                    topic_regex=info.topic_regex,
                )
                producer.produce(
                    info.control_topic, value=encode("Command", body), partition=partition
                )
        producer.flush(self.timeout)
        expected = sum(info.partitions for info in infos)
        # OrderBy sorts the SOW part of a plain sow_and_subscribe (a window keeps its own order).
        order = order_by if options.top_n is None and previous_filter is None else None
        opts = validate_query(batch_size=batch_size, order_by=order)
        if on_part_end is None and previous_filter is None:
            on_part_end = sub.set_cut
        # Read the whole answer now: the subscription must be in place when this returns.
        collected = self._collect(
            command_id, query_id, expected, opts, on_part_end, codec=_codec_of(infos)
        )
        return iter(list(collected))

    def _replace(
        self,
        sub: Subscription | None,
        command: str,
        topic: str,
        filter: str | None,
        user: SubscriptionOptions,
        order_by: str | None,
        batch_size: int,
    ) -> Subscription:
        if sub is None:
            raise InvalidCommandError("replace needs the sub_id of an existing subscription")
        old = sub.specs[0]
        if old.paginated or old.order_by:
            given = (user.top_n, user.skip_n, order_by)
            wanted = (old.options.top_n, old.options.skip_n, old.order_by)
            for name, now, before in zip(
                ("top_n", "skip_n", "OrderBy"), given, wanted, strict=True
            ):
                if before is not None and now is None:
                    raise InvalidCommandError(
                        f"replace must give {name} again: the subscription was placed with it"
                    )
        infos = [
            replace(self.topic_info(spec.topic, spec.message_type), topic_regex=spec.topic_regex)
            for spec in sub.specs
        ]
        wire = replace(user, replace=False)
        if old.paginated:
            wire = replace(wire, oof=True, select=None, no_empties=False)
        specs = [replace(spec, filter=filter, options=wire) for spec in sub.specs]
        cuts: dict[tuple[str, int], int] = {}
        sub.hold()
        try:
            self._register(specs)
            group = self._place(
                sub,
                infos,
                old.command,
                filter,
                replace(wire, replace=True),
                order_by,
                batch_size,
                None,
                old.filter or "",
                on_part_end=lambda topic, partition, mark: cuts.__setitem__(
                    (topic, partition), mark
                ),
            )
            sub.release_through(cuts)  # what the old filter sent before each partition switched
            sub.specs = specs
            sub.options = replace(user, replace=False)
            window = sub.window
            if window is None:
                sub.deliver_group(group)
            else:
                sub.replace_window(window.results.copy(), group)
        finally:
            sub.release()
        return sub

    # -- generic --------------------------------------------------------------------------------

    def execute(self, command: Command) -> Iterator[Message]:
        """Run any :class:`Command` now; publishes and deletes answer with one ``ack`` message."""
        name = command.command
        if name == "sow":
            return self.sow(
                command.topic,
                command.filter,
                sow_keys=command.sow_keys,
                order_by=command.order_by,
                top_n=command.top_n,
                skip_n=command.skip_n,
                batch_size=command.batch_size or CLIENT_DEFAULT_BATCH_SIZE,
                query_id=command.query_id,
                bookmark=command.options.get("bookmark"),
                grouping=command.options.get("grouping"),
                projection=command.options.get("projection"),
                message_type=command.message_type,
            )
        if name in (h.PUBLISH, h.DELTA_PUBLISH):
            key = self._publish(
                name,
                command.topic,
                command.data,
                command.sow_key,
                command.expiration,
                command.ack,
                command.message_type,
            )
            return iter([Message("ack", topic=command.topic, sow_key=key or "", count=1)])
        if name == h.SOW_DELETE:
            count = self.sow_delete(
                command.topic,
                filter=command.filter,
                sow_keys=list(command.sow_keys) if command.sow_keys is not None else None,
                data=command.data,
                message_type=command.message_type,
            )
            return iter([Message("ack", topic=command.topic, count=count)])
        raise InvalidCommandError(
            f"unknown command {name!r}: expected publish, delta_publish, sow_delete or sow"
        )


def _type_name(message_type: str) -> str:
    """A message type's name as the engine spells it; InvalidCommandError if unknown."""
    name = message_type.strip().lower()
    if name not in registry.names():
        raise InvalidCommandError(
            f"message type {message_type!r} is not supported; supported: "
            f"{', '.join(registry.names())}"
        )
    return name


def _codec_of(infos: list[TopicInfo]) -> MessageType | None:
    """The message type of the topics a command reads, None for json (messages parse as JSON)."""
    if not infos or infos[0].message_type == JSON:
        return None
    return infos[0].codec
