"""Queues from the client: leasing subscriptions and acknowledgements."""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import replace

from sowstream.client.connection import Connection, Send
from sowstream.client.queue import QueueSubscription
from sowstream.client.subscription import (
    MessageHandler,
)
from sowstream.client.topics import TopicInfo, codec_of
from sowstream.errors import (
    InvalidCommandError,
)
from sowstream.filters import compile_filter
from sowstream.queues.credits import CREDIT_COMMAND, CreditGrant
from sowstream.queues.machine import Bookmark as QueueBookmark
from sowstream.sow.query import (
    validate_query,
)
from sowstream.subscriptions.model import (
    SUBSCRIBE,
    SubscriptionSpec,
)
from sowstream.subscriptions.options import SubscriptionOptions, parse_options


class Queueing:
    """The queue part: lease with a subscription, ``ack``, cancel and expire."""

    def __init__(self, connection: Connection) -> None:
        self._conn = connection

    def subscribe(
        self,
        infos: list[TopicInfo],
        filter: str | None,
        options: str | SubscriptionOptions | None,
        sub_id: str | None,
        on_message: MessageHandler | None,
        auto_ack: bool,
        ack_batch_size: int,
        ack_interval: float,
        topic_regex: str | None = None,
    ) -> QueueSubscription:
        """Lease messages of the queues ``infos`` (see ``Client.subscribe``): one queue, or the
        queues a regular expression ``topic_regex`` named, under one subscription id."""
        conn = self._conn
        user = options if isinstance(options, SubscriptionOptions) else parse_options(options)
        validate_query(filter=filter)
        if sub_id is not None and conn.subscription(sub_id) is not None and not user.replace:
            raise InvalidCommandError(
                f"subscription id {sub_id!r} is in use: pass options='replace' to change it"
            )
        sub_id = sub_id or uuid.uuid4().hex[:16]
        partitions = [
            (info.name, topic, p)
            for info in infos
            for topic in info.queue_of
            for p in range(conn.topic_info(topic, info.message_type).partitions)
        ]
        types = {info.name: info.message_type for info in infos}
        owner = sub_id  # a str for the closure below

        def send_credits(grants: list[CreditGrant]) -> None:
            conn.send_now(
                (
                    conn.names.control(g.topic, types[g.queue]),
                    g.partition,
                    conn.command(
                        CREDIT_COMMAND,
                        uuid.uuid4().hex,
                        g.queue,
                        sub_id=owner,
                        message_type=types[g.queue],
                        options=g.options(),
                    ),
                )
                for g in grants
            )

        # Over several queues each registration names the expression, so every queue's worker
        # caps the backlog with the smallest MaxPerSubscriptionBacklog of them all.
        specs = [
            SubscriptionSpec(
                sub_id=sub_id,
                reply_to=conn.reply_topic,
                topic=info.name,
                command=SUBSCRIBE,
                filter=filter,
                options=replace(user, replace=False),
                identity=conn.identity,
                topic_regex=topic_regex,
                message_type=info.message_type,
            )
            for info in infos
        ]
        sub = QueueSubscription(
            sub_id,
            specs,
            self._send_acks,
            auto_ack=auto_ack,
            ack_batch_size=ack_batch_size,
            ack_interval=ack_interval,
            on_message=on_message,
            unsubscribe=conn.drop_subscription,
            codec=codec_of(infos),
            partitions=partitions,
            send_credits=send_credits,
        )
        conn.add_subscription(sub)
        conn.register(specs, packed=conn.packed_leases)
        # Connected, with the control topics' metadata, before the first acknowledgement: the
        # first one would otherwise wait for both while the backlog stays full.
        conn.prepare_acks(
            conn.topic_info(t, info.message_type).control_topic
            for info in infos
            for t in info.queue_of
        )
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
        """Acknowledge queue messages (:meth:`Client.ack`): one command per log partition."""
        conn = self._conn
        info = conn.topic_info(queue)
        if not info.queue:
            raise InvalidCommandError(f"topic {queue!r} is not a queue: only queues take acks")
        if action not in ("", "cancel", "expire"):
            raise InvalidCommandError(f"unknown ack action {action!r}: use cancel or expire")
        targets: dict[tuple[str, int], list[str]] = defaultdict(list)
        if filter is not None:
            compile_filter(filter)
            for topic in info.queue_of:
                for partition in range(conn.topic_info(topic, info.message_type).partitions):
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
                    # Maybe a topic created on first use that the queue's regular expression
                    # took after this client read the queue's definition.
                    conn.refresh_topics()
                    info = conn.topic_info(queue)
                if where.topic not in info.queue_of:
                    raise InvalidCommandError(
                        f"bookmark {text!r} is not a message of queue {queue!r} (its topic "
                        f"{where.topic!r} does not feed it)"
                    )
                targets[(where.topic, where.partition)].append(text.strip())
        command_id = uuid.uuid4().hex
        options = {"action": action}
        if not wait:
            options["ack_type"] = "none"  # nobody waits for the answer: ask for none
        sends: list[Send] = []
        for (topic, partition), group in targets.items():
            control, command = conn.to_underlying(
                conn.command(
                    "queue_ack",
                    command_id,
                    info.name,
                    message_type=info.message_type,
                    filter=filter,
                    options={**options, "bookmarks": ",".join(group)},
                ),
                topic,
                info.message_type,
            )
            sends.append((control, partition, command))
        if not wait:
            conn.send_now(sends)  # and without lingering
            return 0
        conn.send(sends)
        return conn.await_acks(command_id, len(targets))

    def _send_acks(self, queue: str, bookmarks: list[str], action: str, wait: bool) -> None:
        self.ack(queue, bookmarks, action=action, wait=wait)
