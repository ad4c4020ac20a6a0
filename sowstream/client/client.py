"""The Python client: publish, delta_publish, sow_delete, sow, subscriptions and queues over
confluent-kafka.

A client owns one reply topic (created on connect, deleted on close) where the engine's answers
arrive; it learns the topics' definitions from the engine's compacted meta topic, so it can
compute SowKeys itself and route every update of a record to the partition that owns it.
:class:`Client` is assembled from one stage per concern, each in its module:
:mod:`~sowstream.client.connection` (connection, topics, replies),
:mod:`~sowstream.client.querying`, :mod:`~sowstream.client.queueing`,
:mod:`~sowstream.client.publishing` and :mod:`~sowstream.client.subscribing`.
"""

from __future__ import annotations

from collections.abc import Iterator

from sowstream.client.connection import HEARTBEAT_SECONDS
from sowstream.client.messages import Command, Message
from sowstream.client.publishing import Publishing
from sowstream.client.subscribing import Subscribing
from sowstream.client.topics import TopicInfo
from sowstream.errors import InvalidCommandError
from sowstream.sow.query import CLIENT_DEFAULT_BATCH_SIZE
from sowstream.wire import headers as h

__all__ = ["HEARTBEAT_SECONDS", "Client", "TopicInfo"]


class Client(Subscribing, Publishing):
    """A connection to a sowstream engine through Kafka.

    ``config`` is passed to every confluent-kafka client as-is (TLS, SASL, ...). Use it as a
    context manager so the reply topic is removed on exit. ``message_type`` is the message type
    of the topics the commands target, as an AMPS connection has one; every command can name
    another with its own ``message_type=``.
    """

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
