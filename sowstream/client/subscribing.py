"""Subscriptions from the client: registration, placement on every partition, replace."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace

from sowstream.client.connection import REGEX_CHARS, Connection
from sowstream.client.messages import Message
from sowstream.client.querying import Querying
from sowstream.client.queue import QueueSubscription
from sowstream.client.queueing import Queueing
from sowstream.client.subscription import RESUME, MessageHandler, Subscription
from sowstream.client.topics import TopicInfo, codec_of
from sowstream.config.models import match_topic_names
from sowstream.errors import (
    CommandTimeoutError,
    InvalidCommandError,
    SowstreamError,
    SubscriptionDroppedError,
)
from sowstream.sow.aggregate import parse_aggregation
from sowstream.sow.bookmarks import EPOCH, MOST_RECENT, parse_bookmark
from sowstream.sow.query import (
    CLIENT_DEFAULT_BATCH_SIZE,
    validate_query,
)
from sowstream.subscriptions.model import (
    DELTA,
    DELTA_SUBSCRIBE,
    SOW_AND_DELTA_SUBSCRIBE,
    SOW_AND_SUBSCRIBE,
    SUBSCRIBE,
    WITH_SOW,
    SubscriptionSpec,
)
from sowstream.subscriptions.options import SubscriptionOptions, parse_options
from sowstream.subscriptions.window import PageWindow, ResultSet

log = logging.getLogger("sowstream.client")

# Why the engine ends a subscription when the client was away (silent past client_timeout, or
# its replies could not reach it): the client places it again when it reads the news. A slow
# consumer's subscriptions are not: it would resume behind the backlog it was dropped for, so
# the application hears of it (SubscriptionDroppedError) and decides.
RESUMABLE = frozenset({"client_timeout", "reply_topic_gone"})
# How long a subscription the engine ended is placed again while its commands go unanswered
# (a worker taking over a partition answers once its session timeout and restore are over).
RESUME_WAIT_SECONDS = 300.0


class Subscribing:
    """The subscription part: the subscribe family, placement, ``replace`` and bookmarks.

    A subscription's answers are read as a query's (``querying``); a subscribe on a queue
    leases its messages (``queueing``).
    """

    def __init__(
        self,
        connection: Connection,
        querying: Querying,
        queueing: Queueing,
        *,
        resume: bool = True,
    ) -> None:
        self._conn = connection
        self._auto_resume = resume
        self._querying = querying
        self._queueing = queueing
        self._resume_lock = threading.Lock()
        self._resuming: set[str] = set()  # sub ids being placed again
        self._again: set[str] = set()  # ended again while being placed: place once more
        connection.on_ended = self.resume

    # -- resuming what the engine ended ----------------------------------------------------------

    def resume(self, sub: Subscription | QueueSubscription, reason: str, text: str) -> bool:
        """The engine ended ``sub`` (reply-reader thread): for a :data:`RESUMABLE` reason,
        place it again in the background from its last delivered position and return True;
        else False (the application gets ``SubscriptionDroppedError``)."""
        if not self._auto_resume or reason not in RESUMABLE or sub.closed:
            return False
        log.warning("subscription %s ended by the engine (%s): placing it again", sub.sub_id, text)
        if isinstance(sub, Subscription):
            sub.hold(RESUME)  # until the replay is in, so messages stay in order and none twice
        with self._resume_lock:
            if sub.sub_id in self._resuming:
                self._again.add(sub.sub_id)
                return True
            self._resuming.add(sub.sub_id)
        threading.Thread(
            target=self._resume_loop,
            args=(sub, reason, text),
            name=f"sowstream-resume-{sub.sub_id}",
            daemon=True,
        ).start()
        return True

    def _resume_loop(self, sub: Subscription | QueueSubscription, reason: str, text: str) -> None:
        deadline = time.monotonic() + RESUME_WAIT_SECONDS
        pause = 1.0
        while True:
            try:
                if not sub.closed:
                    self._place_again(sub)
                    sub.interruptions.append(reason)
            except CommandTimeoutError as exc:
                # No answer yet: a partition's owner is changing (a worker died just now). The
                # placement is idempotent, so it is simply asked again, for a while.
                if time.monotonic() + pause < deadline and not sub.closed:
                    # What is held stays held (_place_again releases only once placed).
                    log.warning("placing subscription %s again: %s; retrying", sub.sub_id, exc)
                    time.sleep(pause)
                    pause = min(pause * 2, 10.0)
                    continue
                self._give_up(sub, reason, text, exc)
                return
            except (SowstreamError, OSError) as exc:
                self._give_up(sub, reason, text, exc)
                return
            with self._resume_lock:
                if sub.sub_id not in self._again:
                    self._resuming.discard(sub.sub_id)
                    return
                self._again.discard(sub.sub_id)
            if isinstance(sub, Subscription):
                sub.hold(RESUME)

    def _give_up(
        self, sub: Subscription | QueueSubscription, reason: str, text: str, exc: Exception
    ) -> None:
        """End ``sub`` for the application: it could not be placed again."""
        with self._resume_lock:
            self._resuming.discard(sub.sub_id)
            self._again.discard(sub.sub_id)
        self._conn.end_subscription(
            sub,
            SubscriptionDroppedError(
                f"subscription {sub.sub_id}: {reason}: {text}; placing it again failed: {exc}"
            ),
        )

    def _place_again(self, sub: Subscription | QueueSubscription) -> None:
        """Register ``sub`` again and place it on every partition from where it was: a replay
        from its resume bookmarks, with no SOW part (the application has it)."""
        conn = self._conn
        if isinstance(sub, QueueSubscription):
            # The queue leases afresh; what it held went back.
            conn.register(sub.specs, packed=conn.packed_leases)
            return
        command = DELTA_SUBSCRIBE if sub.specs[0].command in DELTA else SUBSCRIBE
        if sub.aggregated:
            command = sub.specs[0].command  # placed as it was: every partition's groups again
        specs = [replace(spec, command=command) for spec in sub.specs]
        infos = [
            replace(conn.topic_info(spec.topic, spec.message_type), topic_regex=spec.topic_regex)
            for spec in specs
        ]
        first = specs[0]
        placed = False
        bookmarks = None if sub.aggregated else sub.resume_bookmarks()
        log.debug("placing subscription %s again from %s", sub.sub_id, bookmarks)
        try:
            conn.register(specs)
            group = self.place(
                sub,
                infos,
                command,
                first.filter,
                first.options,
                first.order_by,
                CLIENT_DEFAULT_BATCH_SIZE,
                None,
                None,
                bookmarks=bookmarks,
            )
            for _ in group:  # the replays came as live messages, held until now
                pass
            if sub.aggregated:
                sub.reconcile_groups()  # what changed while it was away
            placed = True
        finally:
            # Not placed (a timeout is asked again, _resume_loop): what is held stays held.
            # Let through now, a live message of a partition whose replay has not come would
            # hide that replay, as an earlier position, from the sequence check.
            if placed or sub.closed:
                sub.release(RESUME)

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
        """A ``subscribe``; on a queue, a lease (:meth:`Client.subscribe`)."""
        queues = self._queues_named(topic, message_type) if bookmark is None else []
        if queues:
            wanted = options if isinstance(options, SubscriptionOptions) else None
            if (wanted or parse_options(options if isinstance(options, str) else None)).aggregated:
                raise InvalidCommandError(
                    f"queue {topic!r} leases messages: an aggregated subscription does not "
                    "apply (an aggregated sow browses the queue)"
                )
            if sow_keys is not None:
                raise InvalidCommandError(
                    f"queue {topic!r} leases messages, not records: SowKeys do not apply"
                )
            regex = None if len(queues) == 1 and queues[0].name == topic else topic
            return self._queueing.subscribe(
                queues,
                filter,
                options,
                sub_id,
                on_message,
                auto_ack,
                ack_batch_size,
                ack_interval,
                topic_regex=regex,
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
        """A ``delta_subscribe`` (:meth:`Client.delta_subscribe`)."""
        if bookmark is None and self._queues_named(topic, message_type):
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
        """A ``sow_and_subscribe`` (:meth:`Client.sow_and_subscribe`)."""
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
        """A ``sow_and_delta_subscribe`` (:meth:`Client.sow_and_delta_subscribe`)."""
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
        """End a subscription, by object or SubId (:meth:`Client.unsubscribe`)."""
        sub = (
            self._conn.subscription(subscription) if isinstance(subscription, str) else subscription
        )
        if sub is not None:
            sub.close()

    def _resolve_bookmark(self, bookmark: str, sub_id: str | None) -> str:
        """MOST_RECENT: after the last message this client delivered for ``sub_id``, else EPOCH.

        Anything else is checked here so a typo fails before the subscription is registered.
        """
        if bookmark.strip().upper() == MOST_RECENT:
            return self._conn.last_bookmark(sub_id or "") or EPOCH
        parse_bookmark(bookmark)
        return bookmark

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
        if user.aggregated and bookmark is not None:
            raise InvalidCommandError(
                "an aggregated subscription (grouping, projection) takes no bookmark"
            )
        conn = self._conn
        found = conn.subscription(sub_id) if sub_id else None
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
        infos = conn.resolve_topics(topic, message_type, declare=True)
        if any(info.queue for info in infos):
            if (command != SUBSCRIBE and command != DELTA_SUBSCRIBE) or bookmark is None:
                raise InvalidCommandError(
                    f"{command} is not available on queue {topic!r}: subscribe leases its "
                    "messages, sow browses them"
                )
            # A bookmark replays the queue's topics, without leases (AMPS does the same).
            infos = [
                conn.topic_info(u, info.message_type)
                for info in infos
                for u in (info.queue_of or [info.name])
            ]
        aggregation = None
        if user.aggregated:
            if len(infos) != 1 or infos[0].pattern:
                raise InvalidCommandError(
                    f"an aggregated subscription reads one topic, not a regular expression or "
                    f"Pattern topic: {topic!r}"
                )
            aggregation = parse_aggregation(user.grouping, user.projection)
        # A window needs every change of the filtered set, whole, with the reason a record left.
        wire = replace(user, oof=True, select=None, no_empties=False) if top_n is not None else user
        specs = [
            SubscriptionSpec(
                sub_id=sub_id,
                reply_to=conn.reply_topic,
                topic=info.name,
                command=command,
                filter=filter,
                options=wire,
                identity=conn.identity,
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
            key_fields={info.name: info.delta_keys for info in infos},
            patterns={info.name: info.pattern for info in infos if info.pattern},
            codec=codec_of(infos),
            window=window,
            on_message=on_message,
            unsubscribe=conn.drop_subscription,
            aggregation=aggregation,
        )
        conn.add_subscription(sub)
        try:
            conn.register(specs)
            group = self.place(
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
            conn.drop_subscription(sub)
            raise
        if aggregation is not None:
            sub.deliver_groups(group, with_sow=command in WITH_SOW)
        elif command in WITH_SOW:
            sub.deliver_group(group)
        else:
            for _ in group:  # placement: wait until every partition runs the subscription
                pass
        sub.release()
        return sub

    def _queues_named(self, topic: str, message_type: str | None = None) -> list[TopicInfo]:
        """The queues ``topic`` names: the queue of that name, or the queues a regular
        expression matches (AMPS lets one subscription cover several). Empty when it names no
        queue; InvalidCommandError when an expression matches queues and other topics alike."""
        conn = self._conn
        info = conn.known(topic, message_type)
        if info is not None:
            return [info] if info.queue else []
        if not REGEX_CHARS.search(topic):
            return []
        kind = conn.type_of(message_type)
        of_type = {i.name: i for i in conn.topics.values() if i.message_type == kind}
        matched = [of_type[name] for name in match_topic_names(topic, sorted(of_type))]
        queues = [i for i in matched if i.queue]
        others = [i.name for i in matched if not i.queue]
        if queues and others:
            raise InvalidCommandError(
                f"{topic!r} matches queues ({', '.join(i.name for i in queues)}) and topics "
                f"that are not queues ({', '.join(others)}): one subscription either leases "
                "from queues or follows topics; narrow the expression"
            )
        return queues

    def place(
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
        bookmarks: Mapping[tuple[str, int], str] | None = None,
    ) -> Iterator[Message]:
        """Send the subscription to every partition and read the answers (as a SOW group).

        ``bookmarks``: a bookmark per (topic, partition) instead of ``bookmark`` (placing a
        subscription again where it was; a partition it has none for replays from EPOCH)."""
        query_id = query_id or uuid.uuid4().hex[:16]
        command_id = uuid.uuid4().hex
        held = sub.specs[0].sow_keys if sub.specs else None
        keys = tuple(sorted(held)) if held is not None else None
        conn = self._conn
        conn.flush()  # read-your-writes, as for sow
        # Placed once the worker has read the registration (it could otherwise be ended by an
        # earlier removal of the same key that the worker reads after placing it).
        registered = str(conn.registered_at) if conn.registered_at >= 0 else None
        conn.send(
            (
                info.control_topic,
                partition,
                conn.command(
                    command,
                    command_id,
                    info.name,
                    message_type=info.message_type,
                    query_id=query_id,
                    filter=filter,
                    order_by=order_by,
                    batch_size=batch_size,
                    after_offset=conn.written(info.log_topic, partition),
                    options=conn.answer_options(
                        bookmark=(
                            bookmarks.get((info.name, partition), EPOCH)
                            if bookmarks is not None
                            else bookmark
                        ),
                        registry_offset=registered,
                    ),
                    sub_id=sub.sub_id,
                    sub_options=options.to_text(),
                    previous_filter=previous_filter,
                    sow_keys=keys,
                    topic_regex=info.topic_regex,
                ),
            )
            for info in infos
            for partition in range(info.partitions)
        )
        expected = sum(info.partitions for info in infos)
        # OrderBy sorts the SOW part of a plain sow_and_subscribe (a window keeps its own order).
        order = order_by if options.top_n is None and previous_filter is None else None
        opts = validate_query(batch_size=batch_size, order_by=order)
        if on_part_end is None and previous_filter is None:
            # An aggregated subscription's groups replace what it held of each partition, so
            # messages count from their watermark on, even if an earlier owner sent later ones.
            on_part_end = sub.reset_partition if sub.aggregated else sub.set_cut
        # Read the whole answer now: the subscription must be in place when this returns.
        collected = self._querying.collect(
            command_id,
            query_id,
            expected,
            opts,
            on_part_end,
            codec=codec_of(infos),
            on_partials=sub.load_groups if sub.aggregated else None,
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
            replace(
                self._conn.topic_info(spec.topic, spec.message_type), topic_regex=spec.topic_regex
            )
            for spec in sub.specs
        ]
        wire = replace(user, replace=False)
        if old.paginated:
            wire = replace(wire, oof=True, select=None, no_empties=False)
        specs = [replace(spec, filter=filter, options=wire) for spec in sub.specs]
        cuts: dict[tuple[str, int], int] = {}
        sub.hold()
        try:
            self._conn.register(specs)
            group = self.place(
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
