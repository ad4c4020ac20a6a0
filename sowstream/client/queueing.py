"""Queues from the client: leasing subscriptions and acknowledgements."""

from __future__ import annotations

import uuid
from collections import defaultdict
from dataclasses import replace

from confluent_kafka import Producer

from sowstream.client.querying import Querying
from sowstream.client.queue import QueueSubscription
from sowstream.client.subscription import (
    MessageHandler,
)
from sowstream.client.topics import TopicInfo
from sowstream.errors import (
    InvalidCommandError,
)
from sowstream.filters import compile_filter
from sowstream.queues.machine import Bookmark as QueueBookmark
from sowstream.sow.query import (
    validate_query,
)
from sowstream.subscriptions.model import (
    SUBSCRIBE,
    SubscriptionSpec,
)
from sowstream.subscriptions.options import SubscriptionOptions, parse_options
from sowstream.wire.avro import encode
from sowstream.wire.kafka import (
    producer_config,
)


class Queueing(Querying):
    """The queue stage: lease with a subscription, ``ack``, cancel and expire."""

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
            lambda bookmarks, action, wait: self._send_acks(info.name, bookmarks, action, wait),
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
        the call returns how many messages it removed or returned once the engine answered
        (a repeat of this client's own earlier acknowledgement counts: acks are idempotent);
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

    def _send_acks(self, queue: str, bookmarks: list[str], action: str, wait: bool) -> None:
        self.ack(queue, bookmarks, action=action, wait=wait)

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
