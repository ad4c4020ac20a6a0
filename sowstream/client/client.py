"""The Python client: publish, delta_publish, sow_delete, sow, subscriptions and queues over
confluent-kafka.

A client owns one reply topic (created on connect, deleted on close) where the engine's answers
arrive; it learns the topics' definitions from the engine's compacted meta topic, so it can
compute SowKeys itself and route every update of a record to the partition that owns it.

:class:`Client` is a facade over one :class:`~sowstream.client.connection.Connection` (the
state they share: Kafka clients, reply topic and reader, topic definitions, live subscriptions)
and the parts that receive it: :class:`~sowstream.client.querying.Querying`,
:class:`~sowstream.client.queueing.Queueing`, :class:`~sowstream.client.publishing.Publishing`
and :class:`~sowstream.client.subscribing.Subscribing`; :mod:`~sowstream.client.cluster`
gathers ``cluster_status`` from the connection and the query part.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Self

from sowstream.auth import Auth
from sowstream.client.cluster import cluster_status
from sowstream.client.connection import HEARTBEAT_SECONDS, Connection
from sowstream.client.messages import Command, Message
from sowstream.client.publishing import Publishing
from sowstream.client.querying import Querying
from sowstream.client.queue import QueueSubscription
from sowstream.client.queueing import Queueing
from sowstream.client.subscribing import Subscribing
from sowstream.client.subscription import MessageHandler, Subscription
from sowstream.client.topics import TopicInfo
from sowstream.errors import InvalidCommandError
from sowstream.sow.query import CLIENT_DEFAULT_BATCH_SIZE
from sowstream.subscriptions.options import SubscriptionOptions, with_aggregation
from sowstream.wire import headers as h
from sowstream.wire.topics import DEFAULT_PREFIX, JSON, TopicNames

__all__ = ["HEARTBEAT_SECONDS", "Client", "TopicInfo"]


class Client:
    """A connection to a sowstream engine through Kafka.

    ``config`` is passed to every confluent-kafka client as-is (TLS, SASL, ...). Use it as a
    context manager so the reply topic is removed on exit. ``message_type`` is the message type
    of the topics the commands target, as an AMPS connection has one; every command can name
    another with its own ``message_type=``. ``raw_scans`` asks workers to send SOW records as
    raw batches (docs/protocol.md, *Raw batches*), read in bulk; False asks for the older form,
    one Avro record per SOW record. ``packed_leases`` asks workers to send a queue's deliveries
    as lease batches (docs/protocol.md, *Packed deliveries*), all the leases of a delivery pass
    in one record; False asks for one record per message. The messages are the same either way,
    for both. With ``resume`` (the default), a subscription the engine ended because the client
    was away (``client_timeout``, ``reply_topic_gone``) is placed again by itself from where it
    was, with no gap and no duplicate (docs/subscriptions.md); without, its iterator raises
    ``SubscriptionDroppedError``.
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
        auth: Auth | None = None,
        raw_scans: bool = True,
        resume: bool = True,
        packed_leases: bool = True,
    ) -> None:
        """``auth`` (:class:`~sowstream.auth.HmacAuth` or :class:`~sowstream.auth.BearerAuth`)
        puts a credential on every record the client writes; an engine that checks credentials
        applies entitlements to the identity it proves, not to ``identity``."""
        self._connection = connection = Connection(
            bootstrap,
            name=name,
            prefix=prefix,
            config=config,
            timeout=timeout,
            identity=identity,
            message_type=message_type,
            auth=auth,
            raw_scans=raw_scans,
            packed_leases=packed_leases,
        )
        self._querying = Querying(connection)
        self._queueing = Queueing(connection)
        self._publishing = Publishing(connection, self._queueing)
        self._subscribing = Subscribing(connection, self._querying, self._queueing, resume=resume)

    # -- the connection ----------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        """The Kafka bootstrap servers."""
        return self._connection.bootstrap

    @property
    def name(self) -> str:
        """This client's name (its reply topic's)."""
        return self._connection.name

    @property
    def names(self) -> TopicNames:
        """The Kafka topic names under the engine's prefix."""
        return self._connection.names

    @property
    def reply_topic(self) -> str:
        """The topic the engine answers this client on."""
        return self._connection.reply_topic

    @property
    def timeout(self) -> float:
        """How long a command waits for its answer (seconds)."""
        return self._connection.timeout

    @property
    def identity(self) -> str:
        """The identity the engine checks entitlements for ("": none)."""
        return self._connection.identity

    @property
    def message_type(self) -> str:
        """The message type commands target unless they name another."""
        return self._connection.message_type

    def connect(self) -> Self:
        """Create the reply topic and read the SOW topic definitions; idempotent."""
        self._connection.connect()
        return self

    def close(self) -> None:
        """Flush pending publishes, close the Kafka clients and delete the reply topic."""
        self._connection.close()

    def __enter__(self) -> Self:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def refresh_topics(self) -> dict[str, TopicInfo]:
        """Re-read the meta topic (the engine republishes it whenever a worker starts)."""
        return self._connection.refresh_topics()

    @property
    def topics(self) -> dict[str, TopicInfo]:
        """The SOW topics the engine serves, by identity (the name; ``<type>:<name>`` for
        message types other than json)."""
        return self._connection.topics

    def topic_info(
        self, topic: str, message_type: str | None = None, *, declare: bool = False
    ) -> TopicInfo:
        """The definition of ``topic`` of ``message_type`` (default: the client's), refreshing
        once if it is not known yet. With ``declare``, a json topic in no configuration is
        created first, as a publish to it would (``engine.auto_create_topics``)."""
        return self._connection.topic_info(topic, message_type, declare=declare)

    def flush(self) -> None:
        """Wait until every publish is acknowledged by Kafka; raise if any failed."""
        self._connection.flush()

    # -- publishing --------------------------------------------------------------------------------

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
        return self._publishing.publish(
            topic, data, sow_key=sow_key, expiration=expiration, ack=ack, message_type=message_type
        )

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
        return self._publishing.delta_publish(
            topic, data, sow_key=sow_key, expiration=expiration, ack=ack, message_type=message_type
        )

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
        return self._publishing.sow_delete(
            topic,
            filter=filter,
            sow_keys=sow_keys,
            data=data,
            bookmarks=bookmarks,
            options=options,
            message_type=message_type,
        )

    # -- queries -----------------------------------------------------------------------------------

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
        return self._querying.sow(
            topic,
            filter,
            sow_keys=sow_keys,
            order_by=order_by,
            top_n=top_n,
            skip_n=skip_n,
            batch_size=batch_size,
            query_id=query_id,
            bookmark=bookmark,
            grouping=grouping,
            projection=projection,
            message_type=message_type,
        )

    def sow_records(self, topic: str, filter: str | None = None, **options: Any) -> list[Any]:
        """Convenience: a :meth:`sow` query's records in order: parsed for json, the raw bodies
        for other message types (``Message.fields()`` parses those)."""
        return self._querying.sow_records(topic, filter, **options)

    def status(self, topic: str | None = None) -> list[dict[str, Any]]:
        """Every partition of every topic (or of ``topic``, a name or regular expression): the
        worker serving it, its watermark and its warnings (such as a recreated log)."""
        return self._querying.status(topic)

    def queue_status(self, queue: str) -> dict[str, Any]:
        """A queue's depth, leased messages and counters (delivered, acked, expiries by reason),
        summed over its partitions; ``seconds_behind`` (age of the oldest message not yet
        acknowledged) and ``age_of_oldest_lease`` in seconds, and ``priority_count`` (distinct
        priority values in the queue)."""
        return self._querying.queue_status(queue)

    # -- subscriptions -----------------------------------------------------------------------------

    def subscribe(
        self,
        topic: str,
        filter: str | None = None,
        *,
        sow_keys: list[str] | tuple[str, ...] | None = None,
        options: str | SubscriptionOptions | None = None,
        grouping: str | None = None,
        projection: str | None = None,
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
        return self._subscribing.subscribe(
            topic,
            filter,
            sow_keys=sow_keys,
            options=with_aggregation(options, grouping, projection),
            sub_id=sub_id,
            on_message=on_message,
            bookmark=bookmark,
            auto_ack=auto_ack,
            ack_batch_size=ack_batch_size,
            ack_interval=ack_interval,
            message_type=message_type,
        )

    def delta_subscribe(
        self,
        topic: str,
        filter: str | None = None,
        *,
        sow_keys: list[str] | tuple[str, ...] | None = None,
        options: str | SubscriptionOptions | None = None,
        grouping: str | None = None,
        projection: str | None = None,
        sub_id: str | None = None,
        on_message: MessageHandler | None = None,
        bookmark: str | None = None,
        message_type: str | None = None,
    ) -> Subscription | QueueSubscription:
        """Like :meth:`subscribe`, but updates to known records carry only what changed.

        On a queue it leases whole messages, as :meth:`subscribe` does (AMPS accepts it too),
        and so does a topic whose message type has no deltas (``binary``).
        """
        return self._subscribing.delta_subscribe(
            topic,
            filter,
            sow_keys=sow_keys,
            options=with_aggregation(options, grouping, projection),
            sub_id=sub_id,
            on_message=on_message,
            bookmark=bookmark,
            message_type=message_type,
        )

    def sow_and_subscribe(
        self,
        topic: str,
        filter: str | None = None,
        *,
        sow_keys: list[str] | tuple[str, ...] | None = None,
        options: str | SubscriptionOptions | None = None,
        grouping: str | None = None,
        projection: str | None = None,
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

        With ``grouping='[/f]'`` and ``projection='[/f, SUM(/q) AS /q, ...]'`` (or the same as
        options) it is an aggregated subscription: the groups as an aggregated :meth:`sow`
        gives them, then a ``publish`` whenever a group's record changes (a delta with
        :meth:`sow_and_delta_subscribe`) and, with ``oof``, an ``oof`` when a group empties.
        """
        return self._subscribing.sow_and_subscribe(
            topic,
            filter,
            sow_keys=sow_keys,
            options=with_aggregation(options, grouping, projection),
            order_by=order_by,
            top_n=top_n,
            skip_n=skip_n,
            batch_size=batch_size,
            sub_id=sub_id,
            query_id=query_id,
            on_message=on_message,
            bookmark=bookmark,
            message_type=message_type,
        )

    def sow_and_delta_subscribe(
        self,
        topic: str,
        filter: str | None = None,
        *,
        sow_keys: list[str] | tuple[str, ...] | None = None,
        options: str | SubscriptionOptions | None = None,
        grouping: str | None = None,
        projection: str | None = None,
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
        return self._subscribing.sow_and_delta_subscribe(
            topic,
            filter,
            sow_keys=sow_keys,
            options=with_aggregation(options, grouping, projection),
            order_by=order_by,
            top_n=top_n,
            skip_n=skip_n,
            batch_size=batch_size,
            sub_id=sub_id,
            query_id=query_id,
            on_message=on_message,
            bookmark=bookmark,
            message_type=message_type,
        )

    def unsubscribe(self, subscription: Subscription | QueueSubscription | str) -> None:
        """End a subscription (by object or SubId)."""
        return self._subscribing.unsubscribe(subscription)

    # -- queues ------------------------------------------------------------------------------------

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
        the call returns how many messages it removed or returned once the engine answered
        (a repeat of this client's own earlier acknowledgement counts: acks are idempotent);
        without, it returns 0 at once and the engine sends no answer.
        """
        return self._queueing.ack(queue, bookmarks, action=action, filter=filter, wait=wait)

    def cluster_status(
        self, answer_seconds: float = 5.0, *, topic: str | None = None
    ) -> dict[str, Any]:
        """The whole cluster: workers, partitions (owner, watermark, log end, lag, records),
        topics, subscriptions, queues and dead letters (see :mod:`sowstream.client.cluster`).
        Workers that do not answer within ``answer_seconds`` show what they announced last;
        ``topic`` (a name or regular expression) limits partitions, topics and queues."""
        return cluster_status(self._connection, self._querying, answer_seconds, topic)

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
            key = self._publishing.publish_command(
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
