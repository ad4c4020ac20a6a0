"""``sow`` queries from the client: one command per partition, the answers merged in order."""

from __future__ import annotations

import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from sowstream.client.connection import PATTERN_ONLY, Connection, Send
from sowstream.client.messages import Message
from sowstream.client.rawscan import RawMessages
from sowstream.client.topics import TopicInfo, codec_of
from sowstream.errors import (
    CommandFailedError,
    InvalidCommandError,
    UnknownTopicError,
)
from sowstream.messagetypes import (
    MessageType,
)
from sowstream.sow.aggregate import Aggregation, merge_partials, parse_aggregation
from sowstream.sow.bookmarks import message_bookmark, parse_bookmark
from sowstream.sow.query import (
    CLIENT_DEFAULT_BATCH_SIZE,
    QueryOptions,
    result_order,
    validate_query,
)
from sowstream.wire import protocol
from sowstream.wire.topics import JSON

# A queue status row's ages (seconds): the queue's is the oldest of its partitions'.
QUEUE_AGES = ("seconds_behind", "age_of_oldest_lease")


@dataclass(slots=True)
class _Answer:
    """One worker's answer for one partition, kept by kind until its ``part_end``."""

    batches: list[list[Message] | RawMessages] = field(default_factory=list)  # sow, in order
    oofs: list[Message] = field(default_factory=list)  # records a replace moved out of scope
    partials: list[bytes] = field(default_factory=list)  # partial aggregates (JSON)


class Querying:
    """The query part: ``sow``, ``sow_records``, ``status``, queue browsing, and the reading
    of a command's answers as one group (which subscription placement shares)."""

    def __init__(self, connection: Connection) -> None:
        self._conn = connection

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
        """The ``sow`` query (:meth:`Client.sow`): one command per partition, the answers merged."""
        opts = validate_query(
            filter=filter, order_by=order_by, top_n=top_n, skip_n=skip_n, batch_size=batch_size
        )
        if bookmark:
            parse_bookmark(bookmark)  # a typo fails here, naming the bookmark
        aggregation = None
        options = self._conn.answer_options(bookmark=bookmark)
        if grouping is not None or projection is not None:
            aggregation = parse_aggregation(grouping, projection)
            options.update(grouping=grouping or "", projection=projection or "")
        try:
            resolved = self._conn.resolve_topics(topic, message_type)
        except UnknownTopicError:
            if PATTERN_ONLY.search(topic) or self._conn.type_of(message_type) != JSON:
                raise
            resolved = []  # a topic in no configuration: a plain topic, so no SOW
        if len(resolved) == 1 and resolved[0].queue:
            # Browsing a queue: the messages available now, nothing leased or removed.
            if bookmark or aggregation is not None or sow_keys is not None:
                raise InvalidCommandError(
                    f"queue {topic!r} can be browsed with a filter, OrderBy and top_n only"
                )
            return self._queue_query(resolved[0], "sow", filter, opts)
        infos = [info for info in resolved if info.sow]
        if not infos:
            raise InvalidCommandError(
                f"topic {topic!r} has no SOW: it can be subscribed to, not queried"
            )
        query_id = query_id or uuid.uuid4().hex[:16]
        command_id = uuid.uuid4().hex
        conn = self._conn
        conn.flush()  # read-your-writes: know the offsets of our own publishes first
        conn.send(
            (
                info.control_topic,
                partition,
                conn.command(
                    "sow",
                    command_id,
                    info.name,
                    message_type=info.message_type,
                    query_id=query_id,
                    filter=filter,
                    sow_keys=tuple(sow_keys) if sow_keys is not None else None,
                    order_by=order_by,
                    top_n=top_n,
                    skip_n=skip_n,
                    batch_size=batch_size,
                    after_offset=conn.written(info.log_topic, partition),
                    options=options,
                    topic_regex=info.topic_regex,
                ),
            )
            for info in infos
            for partition in range(info.partitions)
        )
        expected = sum(info.partitions for info in infos)
        return self.collect(
            command_id, query_id, expected, opts, aggregation=aggregation, codec=codec_of(infos)
        )

    def collect(
        self,
        command_id: str,
        query_id: str,
        expected: int,
        opts: QueryOptions,
        on_part_end: Callable[[str, int, int], None] | None = None,
        *,
        aggregation: Aggregation | None = None,
        codec: MessageType | None = None,
        on_partials: Callable[[str, int, dict[str, Any]], None] | None = None,
    ) -> Iterator[Message]:
        """The answers to ``command_id`` as one group; ``codec`` is the records' message type
        when it is not json (their messages parse with it, aggregates are written in it).
        ``on_partials`` takes each partition's partial aggregates when its answer is complete
        (an aggregated subscription keeps them per partition)."""
        deadline = time.monotonic() + self._conn.timeout
        yield Message("group_begin", query_id=query_id)
        buffered: list[Message] = []
        # Records wait per (topic, partition, answer) until that answer's part_end: after a
        # rebalance two workers may answer one partition, and the first complete answer wins.
        partial: dict[tuple[str, int, str], _Answer] = defaultdict(_Answer)
        complete: set[tuple[str, int]] = set()
        oofs: list[Message] = []
        partials: list[Any] = []
        sent = 0
        while len(complete) < expected:
            reply = self._conn.next_reply(command_id, deadline)
            part = (reply.topic, reply.partition)
            if part in complete:
                continue
            if reply.status != protocol.SUCCESS:
                raise CommandFailedError(
                    f"topic {reply.topic!r}: {reply.message or reply.reason}",
                    reason=reply.reason,
                    command_id=command_id,
                )
            answer = (*part, reply.answer_id)
            if reply.command == "oof":  # a replace moved these records out of scope
                partial[answer].oofs.extend(
                    record_message("oof", reply, rec, query_id, codec, reason=reply.reason)
                    for rec in reply.records
                )
                continue
            if reply.command == protocol.PARTIAL:
                partial[answer].partials.extend(rec.data for rec in reply.records)
                continue
            if reply.command == protocol.SOW_RAW:
                partial[answer].batches.append(RawMessages(reply, query_id, codec))
                continue
            if reply.command == protocol.SOW:
                size = len(reply.records)
                partial[answer].batches.append(
                    [
                        record_message("sow", reply, rec, query_id, codec, batch_size=size)
                        for rec in reply.records
                    ]
                )
                continue
            complete.add(part)
            if on_part_end is not None:
                on_part_end(reply.topic, reply.partition, reply.log_offset)
            done = partial.pop(answer, None) or _Answer()
            for other in [a for a in partial if a[:2] == part]:
                del partial[other]
            oofs.extend(done.oofs)
            if on_partials is not None:
                groups: dict[str, Any] = {}
                for data in done.partials:
                    groups.update(orjson.loads(data))
                on_partials(reply.topic, reply.partition, groups)
            partials.extend(map(orjson.loads, done.partials))
            if opts.ordered or aggregation is not None:
                buffered.extend(m for batch in done.batches for m in batch)
            else:
                for batch in done.batches:
                    sent += len(batch)
                    yield from batch
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
        """A :meth:`sow` query's records (:meth:`Client.sow_records`)."""
        found = [m for m in self.sow(topic, filter, **options) if m.command == "sow"]
        return [m.json() if m.codec is None else m.data for m in found]

    def queue_status(self, queue: str) -> dict[str, Any]:
        """A queue's counters summed over its partitions, its ages the oldest of any partition
        and its priority levels counted over all of them (:meth:`Client.queue_status`)."""
        info = self._conn.topic_info(queue)
        if not info.queue:
            raise InvalidCommandError(f"topic {queue!r} is not a queue")
        total: Counter[str] = Counter()
        ages = dict.fromkeys(QUEUE_AGES, 0.0)
        levels: set[int] | None = set()
        most_levels = 0
        for msg in self._queue_query(info, "queue_status", None, validate_query()):
            if msg.command == "sow":
                row = msg.json()
                row.pop("topic", None)
                for name in QUEUE_AGES:
                    ages[name] = max(ages[name], float(row.pop(name, 0.0)))
                count = int(row.pop("priority_count", 0))
                listed = row.pop("priorities", None)
                most_levels = max(most_levels, count)
                if levels is not None and count:
                    # Over the listing cap only counts come: the total is at least the largest.
                    levels = levels | set(listed) if listed is not None else None
                total.update(row)
        priority_count = len(levels) if levels is not None else most_levels
        return {"depth": 0, "leased": 0, **total, **ages, "priority_count": priority_count}

    def status(self, topic: str | None = None) -> list[dict[str, Any]]:
        """Every partition's ``status`` answer (:meth:`Client.status`)."""
        conn = self._conn
        infos = conn.resolve_topics(topic) if topic else list(conn.refresh_topics().values())
        # A queue's own record stands for its topics, which have records of their own.
        infos = [i for i in infos if not i.queue or i.name in i.queue_of]
        command_id = uuid.uuid4().hex
        query_id = uuid.uuid4().hex[:16]
        expected = self.send_status(infos, command_id, query_id)
        rows = [
            m.json()
            for m in self.collect(command_id, query_id, expected, validate_query())
            if m.command == "sow"
        ]
        return sorted(rows, key=lambda row: (row["topic"], row["partition"]))

    def send_status(self, infos: list[TopicInfo], command_id: str, query_id: str) -> int:
        """Send the ``status`` command to every partition of ``infos``; how many will answer."""
        conn = self._conn
        conn.send(
            (
                info.control_topic,
                partition,
                conn.command("status", command_id, info.name, query_id=query_id),
            )
            for info in infos
            for partition in range(info.partitions)
        )
        return sum(info.partitions for info in infos)

    def _queue_query(
        self, info: TopicInfo, command: str, filter: str | None, opts: QueryOptions
    ) -> Iterator[Message]:
        """Send ``command`` about queue ``info`` to every partition of its topics (of the
        queue's message type); read the answers."""
        conn = self._conn
        kind = info.message_type
        command_id = uuid.uuid4().hex
        query_id = uuid.uuid4().hex[:16]
        body = conn.command(
            command,
            command_id,
            info.name,
            query_id=query_id,
            filter=filter,
            batch_size=500,
            message_type=kind,
        )
        sends: list[Send] = []
        for topic in info.queue_of:
            control, routed = conn.to_underlying(body, topic, kind)
            partitions = conn.topic_info(topic, kind).partitions
            sends.extend((control, partition, routed) for partition in range(partitions))
        conn.send(sends)
        # Status rows are json; browsed messages are of the queue's type.
        codec = codec_of([info]) if command == "sow" else None
        for msg in self.collect(command_id, query_id, len(sends), opts, codec=codec):
            # A queue message is acknowledged by its bookmark, which the engine puts in sow_key;
            # answers name the underlying topic (one per topic and partition), users the queue.
            if msg.command == "sow":
                yield replace(msg, bookmark=msg.sow_key, topic=info.name)
            else:
                yield msg


def record_message(
    kind: str,
    reply: protocol.Reply,
    rec: protocol.ReplyRecord,
    query_id: str,
    codec: MessageType | None,
    **fields: Any,
) -> Message:
    """The application's message for one record of a ``sow`` or ``oof`` reply."""
    return Message(
        kind,
        topic=rec.topic or reply.topic,
        sow_key=rec.sow_key,
        query_id=query_id,
        data=rec.data,
        timestamp=rec.timestamp,
        bookmark=message_bookmark(rec.timestamp, reply.partition, rec.log_offset),
        codec=codec,
        **fields,
    )
