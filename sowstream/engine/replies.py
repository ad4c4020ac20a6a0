"""One way to answer a command: records in batches, then an end or a failure.

Queries, placement, queue browsing and the status command all answer one partition's share of a
command the same way, through a :class:`ReplyWriter`: record batches cut at ``BatchSize`` records
or :data:`MAX_REPLY_BYTES` (whichever comes first), then one ``part_end`` carrying the count, or
one failed ``part_end`` carrying the reason.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence

from sowstream.engine.ports import Sender
from sowstream.wire import rawscan
from sowstream.wire.protocol import FAILURE, PART_END, SOW, SOW_RAW, Command, Reply, ReplyRecord
from sowstream.wire.versions import VERSION_HEADER

# Kafka's default max message size is 1 MB; stay well under it when packing a reply batch.
MAX_REPLY_BYTES = 900_000
RECORD_OVERHEAD = 32  # bytes a record adds to a batch besides its body and key, roughly


def new_answer_id() -> str:
    """A fresh id for one worker's answer for one partition (the client keeps the first)."""
    return uuid.uuid4().hex[:12]


class ReplyWriter:
    """Answers one command for one partition on the client's reply topic."""

    __slots__ = ("_base", "_reply_to", "_sender")

    def __init__(self, sender: Sender, reply_to: str, base: Reply) -> None:
        self._sender = sender
        self._reply_to = reply_to
        self._base = base

    @classmethod
    def for_command(
        cls, sender: Sender, cmd: Command, topic: str, partition: int = -1
    ) -> ReplyWriter:
        """A writer whose replies carry ``cmd``'s ids and a fresh answer id."""
        base = Reply(
            command=PART_END,
            command_id=cmd.command_id,
            query_id=cmd.query_id,
            topic=topic,
            partition=partition,
            answer_id=new_answer_id(),
        )
        return cls(sender, cmd.reply_to, base)

    @property
    def base(self) -> Reply:
        return self._base

    def with_(self, **changes: object) -> ReplyWriter:
        """A writer for the same command whose replies differ in ``changes`` (e.g. a reason)."""
        return ReplyWriter(self._sender, self._reply_to, self._base.with_(**changes))

    async def send(self, reply: Reply) -> None:
        """Send one reply as it is (dropped by the sender if the client is gone)."""
        await self._sender.send_reply(self._reply_to, reply.encode(), VERSION_HEADER)

    async def records(
        self, items: Iterable[ReplyRecord], batch_size: int, command: str = SOW
    ) -> int:
        """Send ``items`` in batches of at most ``batch_size`` records and about
        :data:`MAX_REPLY_BYTES`; returns how many were sent."""
        batch: list[ReplyRecord] = []
        size = 0
        count = 0
        for item in items:
            if batch and (len(batch) >= batch_size or size + len(item.data) > MAX_REPLY_BYTES):
                await self.send(self._base.with_(command=command, records=batch))
                batch, size = [], 0
            batch.append(item)
            size += len(item.data) + len(item.sow_key) + RECORD_OVERHEAD
            count += 1
        if batch:
            await self.send(self._base.with_(command=command, records=batch))
        return count

    async def raw_records(self, values: Sequence[bytes], batch_size: int, flags: int = 0) -> int:
        """Send stored records (format 1) as ``sow_raw`` batches of at most ``batch_size``
        records and about :data:`MAX_REPLY_BYTES`; returns how many were sent.

        Sized per batch with C-level sums, so the values are never visited one by one here.
        """
        sent = 0
        total = len(values)
        while sent < total:
            chunk = values[sent : sent + batch_size]
            size = sum(map(len, chunk)) + rawscan.END_SIZE * len(chunk)
            if size > MAX_REPLY_BYTES and len(chunk) > 1:
                chunk = _fit(chunk)
            block = rawscan.pack(chunk, sent, flags)
            await self.send(
                self._base.with_(command=SOW_RAW, records=[ReplyRecord("", block, 0, -1)])
            )
            sent += len(chunk)
        return sent

    async def end(self, count: int = 0, log_offset: int = -1) -> None:
        """The partition's answer is complete: ``part_end`` with the number of records."""
        await self.send(self._base.with_(command=PART_END, count=count, log_offset=log_offset))

    async def failure(self, reason: str, message: str) -> None:
        """The partition cannot answer: a failed ``part_end`` naming the reason."""
        await self.send(
            self._base.with_(command=PART_END, status=FAILURE, reason=reason, message=message)
        )


def _fit(chunk: Sequence[bytes]) -> Sequence[bytes]:
    """The longest head of ``chunk`` (at least one record) within :data:`MAX_REPLY_BYTES`."""
    size = rawscan.BATCH_OVERHEAD
    for taken, value in enumerate(chunk):
        size += len(value) + rawscan.END_SIZE
        if size > MAX_REPLY_BYTES:
            return chunk[: max(taken, 1)]
    return chunk
