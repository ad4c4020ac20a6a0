"""Reading ``sow_raw`` replies: one raw batch (``sowstream.wire.rawscan``) into ``sow`` messages.

The batch is split in bulk when the reply arrives. With the compiled splitter (native/) every
record's header is read in one call as the messages are made; without it each message holds only
its record's position until the application reads one of its fields (``Message`` reads them from
here then).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from sowstream.client.messages import BOOKMARK_AT, Message, from_records, from_source
from sowstream.errors import CorruptReplyError
from sowstream.messagetypes import MessageType
from sowstream.sow.patterns import split_key
from sowstream.wire.protocol import SOW, Reply
from sowstream.wire.rawscan import COMPILED_SPLIT, RawBatch, Split

log = logging.getLogger("sowstream.client")


class RawSource:
    """The records of one raw batch, for the messages made from it."""

    __slots__ = ("batch", "partition", "topic")

    def __init__(self, batch: RawBatch, topic: str, partition: int) -> None:
        self.batch = batch
        self.topic = topic  # the reply's topic: the records' own unless the keys carry names
        self.partition = partition

    def fill(self, fields: dict[str, Any], index: int) -> None:
        """Record ``index``'s topic, SowKey, body and timestamp into ``fields``, and where its
        bookmark comes from."""
        try:
            key, body, offset, timestamp, _ = self.batch.record(index)
        except CorruptReplyError as exc:
            raise CorruptReplyError(
                f"topic {self.topic!r} partition {self.partition}: {exc}"
            ) from None
        topic = self.topic
        if self.batch.pattern:
            name, key = split_key(key)
            topic = name or topic
        fields["topic"] = topic
        fields["sow_key"] = key
        fields["data"] = body
        fields["timestamp"] = timestamp
        fields[BOOKMARK_AT] = (timestamp, self.partition, offset)


class RawMessages:
    """The ``sow`` messages of one ``sow_raw`` reply, made when iterated.

    The batch is checked when the reply arrives, but its messages are made only as they are
    handed on: a scan's answer waits for its ``part_end`` as a few batches, not as a heap of
    objects the garbage collector would walk again and again.
    """

    __slots__ = ("_fields", "_source", "_split")

    def __init__(
        self,
        reply: Reply,
        query_id: str,
        codec: MessageType | None,
        split: Split | None = COMPILED_SPLIT,
    ) -> None:
        """Check ``reply``'s batch (CorruptReplyError naming the reply and the problem)."""
        where = (
            f"reply to command {reply.command_id}, topic {reply.topic!r} "
            f"partition {reply.partition}"
        )
        if len(reply.records) != 1:
            raise CorruptReplyError(
                f"{where}: a sow_raw reply holds one raw batch, not {len(reply.records)} records"
            )
        try:
            batch = RawBatch(reply.records[0].data)
        except CorruptReplyError as exc:
            raise CorruptReplyError(f"{where}: {exc}") from None
        fields: dict[str, Any] = {"command": SOW, "query_id": query_id, "batch_size": batch.count}
        if codec is not None:
            fields["codec"] = codec
        if not batch.pattern:
            fields["topic"] = reply.topic  # the same for every record: no need to wait for a read
        self._fields = fields
        self._source = RawSource(batch, reply.topic, reply.partition)
        # With the compiled splitter a batch is split in one call and its messages made whole;
        # without it each message reads its own record when first used.
        self._split = split if not batch.pattern else None

    def __len__(self) -> int:
        return self._source.batch.count

    def __iter__(self) -> Iterator[Message]:
        """The batch's messages, made as they are asked for (each reading its record when
        first used, unless the compiled splitter read them all)."""
        source = self._source
        if self._split is not None:
            try:
                records = source.batch.records(self._split)
            except BaseException as exc:  # a Rust panic is a BaseException
                if isinstance(exc, KeyboardInterrupt | SystemExit):
                    raise
                # The records are still there to read in Python, one by one.
                log.error(
                    "the compiled splitter failed on a raw batch (%s); reading it in Python", exc
                )
            else:
                return from_records(source, records, source.partition, self._fields)
        return from_source(source, source.batch.count, self._fields)


def raw_messages(
    reply: Reply, query_id: str, codec: MessageType | None, split: Split | None = COMPILED_SPLIT
) -> list[Message]:
    """The ``sow`` messages of a ``sow_raw`` reply (CorruptReplyError for a malformed one)."""
    return list(RawMessages(reply, query_id, codec, split))
