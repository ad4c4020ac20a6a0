"""A client's connection: the state every part of :class:`~sowstream.client.Client` shares.

The :class:`Connection` owns the Kafka clients (the publish producer, the acknowledgement
producer, the reply-topic consumer and its reader thread), the topic definitions read from the
meta topic, the replies parked for their commands, the offsets of this client's own publishes,
and the live subscriptions the reader routes messages to. The parts (querying, queueing,
publishing, subscribing) receive it and use its public methods only.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, Self, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka import Message as KafkaMessage

from sowstream.auth import Auth, HmacAuth
from sowstream.broker.bootstrap import resolve_bootstrap
from sowstream.client.queue import QueueSubscription
from sowstream.client.replies import ReplyBox
from sowstream.client.subscription import (
    MAX_BUFFERED,
    Subscription,
    SubscriptionDroppedError,
    _Live,
)
from sowstream.client.topics import TopicInfo, type_name
from sowstream.config.models import ambiguous_pattern, match_topic_names
from sowstream.errors import (
    CommandFailedError,
    CommandTimeoutError,
    InvalidCommandError,
    SowstreamError,
    UnknownTopicError,
)
from sowstream.messagetypes import registry
from sowstream.queues.credits import CREDIT_NOTICE
from sowstream.subscriptions.model import (
    ACK,
    FAILURE,
    LOG_RESET,
    SubscriptionSpec,
)
from sowstream.wire import headers as h
from sowstream.wire import leases, protocol, rawscan
from sowstream.wire.avro import encode
from sowstream.wire.kafka import (
    TopicSpec,
    delete_topics,
    ensure_topics,
    producer_config,
    quiet,
)
from sowstream.wire.topics import DEFAULT_PREFIX, JSON, TopicNames, topic_ident
from sowstream.wire.versions import PRODUCE_HEADERS, decode_headed, version_of

REGEX_CHARS = re.compile(r"[\\^$.|?*+()\[\]{}]")
# Characters that only a pattern has ('.' is common in topic names): a name with none of these
# that no topic matches is a topic of its own, created on first use.
PATTERN_ONLY = re.compile(r"[\\^$|?*+()\[\]{}]")
# How often the reply reader tells the engine the client is alive (slow_consumer.client_timeout).
HEARTBEAT_SECONDS = 2.0
CONNECT_SECONDS = 10.0  # how long connect() waits for the cluster to answer at all

# Where one command goes: (control topic, partition, command).
Send = tuple[str, int, protocol.Command]
LiveSubscription = Subscription | QueueSubscription


class Connection:
    """One client's link to the engine: Kafka clients, topic definitions, replies and the
    subscriptions live messages are routed to."""

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
        auth: Auth | None = None,
        raw_scans: bool = True,
        packed_leases: bool = True,
    ) -> None:
        self.message_type = type_name(message_type)
        # Credentials for every record written (commands, registrations, publishes).
        self.auth = auth
        if not identity and isinstance(auth, HmacAuth):
            identity = auth.identity
        # Ask for SOW answers as raw batches (wire.rawscan); False: one Avro record each.
        self.raw_scans = raw_scans
        # Ask for a queue's deliveries as lease batches (wire.leases); False: one record each.
        self.packed_leases = packed_leases
        self.bootstrap = resolve_bootstrap(bootstrap)
        self.name = name or f"client-{uuid.uuid4().hex[:12]}"
        self.names = TopicNames(prefix)
        self.timeout = timeout
        self.identity = identity
        # Passed to every confluent-kafka client as-is (TLS, SASL, ...).
        self.kafka_config: Mapping[str, str] = dict(config or {})
        self.reply_topic = self.names.reply(self.name)
        # The registry offset of the last registration this client wrote (-1: none yet).
        self.registered_at = -1
        self._producer: Producer | None = None
        # Acknowledgements sent as a queue subscription goes: each one holds back the next
        # lease, so they skip the publish producer's linger (see _ack_producer).
        self._acks: Producer | None = None
        self._acks_lock = threading.Lock()  # acks come from reader, timer and app threads
        self._replies: Consumer | None = None
        self._topics: dict[str, TopicInfo] = {}
        # Unread replies go after twice the command timeout (at least a minute): nobody waits.
        self._pending = ReplyBox(keep_s=max(60.0, 2 * timeout))
        self._written: dict[tuple[str, int], int] = {}
        self._delivery_errors: list[str] = []
        self._cond = threading.Condition()
        self._waiting = 0
        self._reader: threading.Thread | None = None
        self._stop = threading.Event()
        self._subscriptions: dict[str, LiveSubscription] = {}
        self._bookmarks: dict[str, str] = {}  # sub_id -> last delivered, for MOST_RECENT
        # Asked when the engine ends a subscription (subscription, reason, text): True when it
        # is being placed again, so it goes on rather than failing.
        self.on_ended: Callable[[LiveSubscription, str, str], bool] | None = None

    # -- lifecycle ---------------------------------------------------------------------------------

    def connect(self) -> Self:
        """Create the reply topic and read the SOW topic definitions; idempotent."""
        if self._producer is not None:
            return self
        ensure_topics(
            self.bootstrap,
            [TopicSpec(self.reply_topic, 1, {"retention.ms": "3600000"})],
            extra=self.kafka_config,
            # An unreachable cluster fails here, before any other Kafka client of ours exists.
            timeout=min(self.timeout, CONNECT_SECONDS),
        )
        self._producer = Producer(quiet(producer_config(self.bootstrap, self.kafka_config)))
        # The group id is the reply topic: the engine reads this group's committed offset to see
        # how far behind the client is (slow-consumer policy).
        self._replies = self.consumer(group=self.reply_topic)
        self._replies.assign([TopicPartition(self.reply_topic, 0, 0)])
        self._stop.clear()
        self._reader = threading.Thread(
            target=self._read_replies, name=f"sowstream-replies-{self.name}", daemon=True
        )
        self._reader.start()
        self.refresh_topics()
        return self

    def close(self) -> None:
        """End the subscriptions, flush pending publishes, close the Kafka clients and delete
        the reply topic."""
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
        delete_topics(self.bootstrap, [self.reply_topic], extra=self.kafka_config)
        self._producer = None
        self._replies = None

    def consumer(self, group: str | None = None) -> Consumer:
        """A new Kafka consumer with this client's settings (the caller closes it)."""
        return Consumer(
            quiet(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": group or f"{self.name}-{uuid.uuid4().hex[:6]}",
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    "fetch.wait.max.ms": 10,
                    "log_level": 4,
                    **self.kafka_config,
                }
            )
        )

    def _require(self) -> Producer:
        """The publish producer, connecting first if need be."""
        if self._producer is None or self._replies is None:
            self.connect()
        assert self._producer is not None and self._replies is not None
        return self._producer

    # -- topic definitions -------------------------------------------------------------------------

    def refresh_topics(self) -> dict[str, TopicInfo]:
        """Re-read the meta topic (the engine republishes it whenever a worker starts)."""
        consumer = self.consumer()
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
                            info = TopicInfo.from_wire(
                                decode_headed(
                                    "TopicInfo",
                                    value,
                                    h.header_map(cast(h.RawHeaders, msg.headers())),
                                )
                            )
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

    def type_of(self, message_type: str | None) -> str:
        """The message type a command targets: its own, else the client's."""
        return self.message_type if message_type is None else type_name(message_type)

    def topic_info(
        self, topic: str, message_type: str | None = None, *, declare: bool = False
    ) -> TopicInfo:
        """The definition of ``topic`` of ``message_type`` (default: the client's), refreshing
        once if it is not known yet. With ``declare``, a json topic in no configuration is
        created first, as a publish to it would (``engine.auto_create_topics``)."""
        if declare:
            return self._topic_or_declare(topic, message_type)
        ident = topic_ident(topic, self.type_of(message_type))
        info = self.known(topic, message_type)
        if info is None:
            if ident != topic:
                raise UnknownTopicError(f"{topic} ({self.type_of(message_type)})")
            raise UnknownTopicError(topic)
        return info

    def known(self, topic: str, message_type: str | None = None) -> TopicInfo | None:
        """The definition of ``topic`` if the engine has one (refreshing once), else None.

        A name in no definition that a Pattern topic's Pattern matches is that topic, addressed
        by the name (:meth:`TopicInfo.addressed_as`); a topic declared with the name wins.
        """
        kind = self.type_of(message_type)
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
        if PATTERN_ONLY.search(name):
            return None
        found = [
            info
            for info in self._topics.values()
            if info.pattern
            and not info.own_queue
            and info.message_type == kind
            and re.fullmatch(info.pattern, name)
        ]
        # A conflated topic over a Pattern topic is a Pattern topic too, whose names its
        # underlying Pattern may match as well (/q/eu-C and /q/.*): the conflated one wins.
        computed = {u for info in found for u in info.view_of}
        found = [info for info in found if info.name not in computed] or found
        if len(found) > 1:
            raise InvalidCommandError(ambiguous_pattern(name, sorted(i.name for i in found)))
        return found[0].addressed_as(name) if found else None

    def _topic_or_declare(self, topic: str, message_type: str | None = None) -> TopicInfo:
        """The definition of ``topic``; a topic in no configuration is created first, as a
        plain topic of the message type, if the engine allows it (``engine.auto_create_topics``)
        and the type needs no Schema or Parts from a configuration."""
        info = self.known(topic, message_type)
        if info is not None:
            return info
        kind = self.type_of(message_type)
        if kind in registry.CONFIGURED:
            return self.topic_info(topic, message_type)  # raises UnknownTopicError
        return self.declare(topic, kind)

    def declare(self, topic: str, message_type: str = JSON) -> TopicInfo:
        """Ask the engine to create ``topic`` of ``message_type`` (CommandFailedError says why
        when it refuses)."""
        command = self.command(h.DECLARE_TOPIC, uuid.uuid4().hex, topic, message_type=message_type)
        self.send([(self.names.auto_control, 0, command)])
        self.await_acks(command.command_id, 1)
        info = self.refresh_topics().get(topic_ident(topic, message_type))
        if info is None:
            raise SowstreamError(
                f"topic {topic!r} was created but its definition is not on {self.names.meta!r}"
            )
        return info

    def resolve_topics(
        self, topic: str, message_type: str | None = None, *, declare: bool = False
    ) -> list[TopicInfo]:
        """The topics of ``message_type`` that ``topic`` names, or whose names it matches; with
        ``declare`` a name no topic matches is created (a plain topic of the type) if the engine
        allows it and the type needs no configuration."""
        kind = self.type_of(message_type)
        known = self.known(topic, message_type)
        if known is not None:
            return [known]
        if REGEX_CHARS.search(topic):
            of_type = {i.name: i for i in self._topics.values() if i.message_type == kind}
            matched = match_topic_names(topic, sorted(of_type))
            # A regular expression (not a name) may match names of every Pattern topic: each
            # reads those of its records.
            scoped = [
                replace(i, topic_regex=topic)
                for i in of_type.values()
                if i.pattern and not i.own_queue and PATTERN_ONLY.search(topic)
            ]
            plain = [
                of_type[name]
                for name in matched
                if not of_type[name].pattern or of_type[name].own_queue
            ]
            if plain or scoped:
                return [*plain, *sorted(scoped, key=lambda i: i.name)]
        if declare and kind not in registry.CONFIGURED and not PATTERN_ONLY.search(topic):
            return [self.declare(topic, kind)]
        raise UnknownTopicError(topic if kind == JSON else f"{topic} ({kind})")

    # -- publishes ---------------------------------------------------------------------------------

    def _on_delivery(self, err: KafkaError | None, msg: KafkaMessage) -> None:
        if err is not None:
            self._delivery_errors.append(f"{msg.topic()}: {err.str()}")
            return
        # Reports of one partition come in log order: the latest is the highest offset, unless
        # the log was recreated, where it must replace the old log's higher offsets.
        self._written[(msg.topic() or "", msg.partition() or 0)] = msg.offset() or 0

    def written(self, log_topic: str, partition: int) -> int:
        """The offset of this client's last delivered publish to a log partition (-1: none):
        a query waits until the engine has applied it (read-your-writes)."""
        return self._written.get((log_topic, partition), -1)

    def flush(self) -> None:
        """Wait until every publish is acknowledged by Kafka; raise if any failed."""
        producer = self._require()
        remaining = producer.flush(self.timeout)
        if remaining:
            raise CommandTimeoutError(f"{remaining} messages were not delivered to Kafka in time")
        if self._delivery_errors:
            errors, self._delivery_errors = self._delivery_errors, []
            raise SowstreamError(f"publish failed: {'; '.join(errors[:5])}")

    def produce(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: str | None = None,
        partition: int | None = None,
        headers: dict[str, str | None],
    ) -> None:
        """Write one record to a log topic, its delivery tracked for :meth:`written`."""
        producer = self._require()
        raw_key = key.encode() if key is not None else None
        if self.auth is not None:
            headers = {**headers, h.CREDENTIAL: self.auth.credential(topic, raw_key, value)}
        kwargs: dict[str, Any] = {
            "key": raw_key,
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

    # -- commands and their replies ----------------------------------------------------------------

    def command(
        self, name: str, command_id: str, topic: str, *, query_id: str = "", **fields: Any
    ) -> protocol.Command:
        """A command about ``topic`` from this client (its answers come to its reply topic);
        ``fields`` are :class:`~sowstream.wire.protocol.Command` fields over their defaults."""
        return protocol.Command(
            command=name,
            command_id=command_id,
            query_id=query_id,
            reply_to=self.reply_topic,
            topic=topic,
            identity=self.identity,
            **fields,
        )

    def to_underlying(
        self, command: protocol.Command, topic: str, message_type: str
    ) -> tuple[str, protocol.Command]:
        """Where ``command``, about a queue, goes for the queue's topic ``topic``: that topic's
        control topic; one created on first use shares it, so the command names the topic."""
        info = self.topic_info(topic, message_type)
        if info.auto:
            command = replace(command, options={**command.options, protocol.UNDERLYING: topic})
        return info.control_topic, command

    def answer_options(self, **options: str | None) -> dict[str, str]:
        """The ``options`` of a command answered with SOW records: ``options`` that are set,
        and the ask for raw batches unless this client turned them off."""
        chosen = {name: value for name, value in options.items() if value}
        if self.raw_scans:
            chosen[rawscan.RAW_OPTION] = rawscan.RAW_V1
        return chosen

    def send(self, commands: Iterable[Send]) -> None:
        """Write each command to its control-topic partition and wait until Kafka has them."""
        producer = self._require()
        for topic, partition, command in commands:
            value = command.encode()
            producer.produce(
                topic, value=value, partition=partition, headers=self._signed(topic, None, value)
            )
        producer.flush(self.timeout)

    def send_now(self, commands: Iterable[Send]) -> None:
        """Write commands nobody waits for on the producer that does not linger (acks)."""
        producer = self._ack_producer()
        for topic, partition, command in commands:
            value = command.encode()
            producer.produce(
                topic, value=value, partition=partition, headers=self._signed(topic, None, value)
            )
        producer.poll(0)

    def _signed(
        self, topic: str, key: bytes | None, value: bytes | None
    ) -> list[tuple[str, str | bytes | None]]:
        """The headers of a command or registration: its schema version, and its credential if
        the client has credentials."""
        headers = list(PRODUCE_HEADERS.items())
        if self.auth is not None:
            headers.append((h.CREDENTIAL, self.auth.credential(topic, key, value).encode()))
        return headers

    def prepare_acks(self, control_topics: Iterable[str]) -> None:
        """Connect the ack producer and fetch these control topics' metadata now: the first
        acknowledgement would otherwise wait for both while a queue's backlog stays full."""
        producer = self._ack_producer()
        for topic in control_topics:
            producer.list_topics(topic, timeout=self.timeout)

    def _ack_producer(self) -> Producer:
        """The producer of acknowledgements nobody waits for, created on first use.

        The publish producer lingers 5 ms to batch publishes; an acknowledgement that lingers
        holds a backlog unit that long, which at backlog 1 tripled the time per message
        (docs/benchmarks.md). Commands that wait for their answer flush instead.
        """
        self._require()
        with self._acks_lock:
            if self._acks is None:
                config = {**producer_config(self.bootstrap, self.kafka_config), "linger.ms": 0}
                self._acks = Producer(quiet(config))
            return self._acks

    def next_reply(self, command_id: str, deadline: float) -> protocol.Reply:
        """The next reply for ``command_id`` (the reader thread parks replies per command);
        CommandTimeoutError once ``deadline`` (monotonic) has passed."""
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

    def await_acks(self, command_id: str, expected: int) -> int:
        """Wait for ``expected`` acknowledgements of ``command_id``; the sum of their counts.
        A failed one raises CommandFailedError."""
        deadline = time.monotonic() + self.timeout
        total = 0
        answered: set[tuple[str, int, int]] = set()
        while len(answered) < expected:
            reply = self.next_reply(command_id, deadline)
            # a log record (or a command) replayed after a rebalance is acked twice: count it once
            origin = (reply.topic, reply.partition, reply.log_offset)
            if origin[2] >= 0 and origin in answered:
                continue
            answered.add(origin if origin[2] >= 0 else ("", -1, len(answered)))
            if reply.status != protocol.SUCCESS:
                raise CommandFailedError(
                    reply.message or reply.reason,
                    reason=reply.reason,
                    command_id=command_id,
                )
            total += reply.count
        return total

    def pending_replies(self) -> int:
        """How many commands have replies parked, unread (a long-lived client keeps few)."""
        return len(self._pending)

    # -- the reply reader --------------------------------------------------------------------------

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
            # A copy: the application's threads add and remove subscriptions meanwhile.
            if self._waiting == 0 and any(
                s.backlog() >= MAX_BUFFERED for s in list(self._subscriptions.values())
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
                reason = headers.get(h.REASON, "")
                text = (value or b"").decode("utf-8", "replace")
                if self.on_ended is not None and self.on_ended(sub, reason, text):
                    return
                self.end_subscription(
                    sub, SubscriptionDroppedError(f"subscription {sub.sub_id}: {reason}: {text}")
                )
                self._unregister(sub)
                return
            if command == ACK:
                if isinstance(sub, QueueSubscription):
                    sub.on_processed(headers.get(h.OPTIONS, ""))
                return
            if command == CREDIT_NOTICE:
                if isinstance(sub, QueueSubscription):
                    sub.on_credit(value or b"")
                return
            if command == leases.PUBLISH_PACKED:
                if isinstance(sub, QueueSubscription):
                    sub.on_packed(headers.get(h.TOPIC, ""), value or b"")
                return
            try:
                if command == LOG_RESET:
                    if isinstance(sub, Subscription):
                        sub.reset_partition(
                            headers.get(h.TOPIC, ""),
                            int(headers.get(h.PARTITION, "0")),
                            int(headers.get(h.OFFSET, "-1")),
                        )
                    return
                live = _Live.from_headers(value, headers)
            except ValueError:  # damaged headers: not a message of ours, and the reader goes on
                return
            sub.on_live(live)
            return
        if value is None:
            return
        try:
            # An older engine's reply is read with its version's schema; a newer one's as far as
            # this client's schema goes (versions only append fields).
            reply = protocol.Reply.decode(value, version_of(headers))
        except Exception:  # not a Reply this client can read: nothing waits for it
            return
        with self._cond:
            self._pending.park(reply, time.monotonic())
            self._cond.notify_all()

    # -- subscriptions -----------------------------------------------------------------------------

    def subscription(self, sub_id: str) -> LiveSubscription | None:
        """The live subscription with ``sub_id``, if any."""
        return self._subscriptions.get(sub_id)

    def add_subscription(self, sub: LiveSubscription) -> None:
        """Route live messages for ``sub.sub_id`` to ``sub`` from now on."""
        self._subscriptions[sub.sub_id] = sub

    def last_bookmark(self, sub_id: str) -> str | None:
        """The bookmark of the last message delivered to an ended subscription (MOST_RECENT)."""
        return self._bookmarks.get(sub_id)

    def register(self, specs: list[SubscriptionSpec], *, packed: bool = False) -> int:
        """Write the registrations to the registry topic (so any worker can serve them); returns
        the registry offset of the last one, which a placement names (``registry_offset``) so
        the worker reads the registry that far first. ``packed``: queue registrations that ask
        for lease batches (header ``sow.packed``)."""
        producer = self._require()
        topic = self.names.subscriptions
        offsets: list[int] = []

        def delivered(err: Any, msg: KafkaMessage) -> None:
            if err is None and msg.offset() is not None:
                offsets.append(int(msg.offset() or 0))

        for spec in specs:
            key, value = spec.key.encode(), encode("Subscription", spec.to_wire())
            headers = self._signed(topic, key, value)
            if packed:
                headers.append((h.PACKED, leases.PACKED_V1.encode()))
            producer.produce(topic, key=key, value=value, headers=headers, on_delivery=delivered)
        if producer.flush(self.timeout):
            raise CommandTimeoutError("could not register the subscription in time")
        self.registered_at = max([self.registered_at, *offsets])
        return self.registered_at

    def _unregister(self, sub: LiveSubscription) -> None:
        """Tombstone the registrations of a subscription the engine ended or refused (from the
        reader thread: nothing waits for the tombstones)."""
        if self._producer is None:
            return
        for spec in sub.specs:
            self._producer.produce(self.names.subscriptions, key=spec.key.encode(), value=None)
        self._producer.poll(0)

    def end_subscription(self, sub: LiveSubscription, error: BaseException) -> None:
        """The engine ended ``sub`` for good: the application gets ``error``."""
        sub.fail(error)
        if self._subscriptions.get(sub.sub_id) is sub:
            del self._subscriptions[sub.sub_id]

    def drop_subscription(self, sub: LiveSubscription) -> None:
        """Stop routing to ``sub`` and tombstone its registrations (it remembers its bookmark)."""
        if sub.last_bookmark:
            self._bookmarks[sub.sub_id] = sub.last_bookmark
        self._subscriptions.pop(sub.sub_id, None)
        if self._producer is None:
            return
        for spec in sub.specs:
            self._producer.produce(self.names.subscriptions, key=spec.key.encode(), value=None)
        self._producer.flush(self.timeout)
