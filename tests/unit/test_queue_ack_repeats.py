"""A repeated acknowledgement counts as done when the first one came from the same client, also
when both arrive in one batch: a worker taking a partition over reads a client's first ack
(whose answer never came) and the client's repeat together, before the first one's ack marker is
stored (found by the chaos run: the repeat was answered 0 and the job looked unacknowledged)."""

from __future__ import annotations

import asyncio

from sowstream.config.queues import QueueConfig
from sowstream.engine.processor import TopicProcessor
from sowstream.engine.queues import AckAnswer, QueueRuntime
from sowstream.queues import Bookmark
from sowstream.sow.compiled import compile_topic
from sowstream.wire.protocol import Command
from sowstream.wire.topics import TopicNames
from tests.support.sender import RecordingSender
from tests.unit.test_processor_model import TOPIC, to_records


def ack(bookmark: Bookmark, client: str, n: int) -> Command:
    return Command(
        command="queue_ack",
        command_id=f"c{n}",
        query_id="",
        reply_to=client,
        topic="WQ",
        options={"bookmarks": bookmark.text(), "action": ""},
    )


def acked_in_one_batch(leasing: str, clients: tuple[str, str]) -> list[AckAnswer | None]:
    async def go() -> list[AckAnswer | None]:
        sender = RecordingSender()
        names = TopicNames("p")
        proc = TopicProcessor(compile_topic(TOPIC), names, sender)
        config = QueueConfig(name="WQ", underlying_topic=TOPIC.name, leasing=leasing)
        queue = QueueRuntime(
            config,
            names,
            sender,
            lambda _topic, partition, changes: proc.store_changes(partition, changes),
        )
        proc.queues.append(queue)
        await proc.ready(0)
        await proc.process(to_records([("publish", 1, 0, 5)]))
        await proc.drain()
        bookmark = Bookmark(TOPIC.name, 0, 0)
        assert queue.machine.message(bookmark) is not None
        answers = await queue.acknowledge_all(
            [(ack(bookmark, clients[0], 1), 0), (ack(bookmark, clients[1], 2), 0)], TOPIC.name
        )
        assert queue.machine.message(bookmark) is None
        return [a if isinstance(a, AckAnswer) else None for a in answers]

    return asyncio.run(go())


def test_a_repeat_in_the_same_batch_is_acked() -> None:
    first, repeat = acked_in_one_batch("sublet", ("alice", "alice"))
    assert first is not None and repeat is not None
    assert (first.done, repeat.done) == (1, 1)
    assert repeat.results == {"acked": 1}


def test_under_strict_leasing_another_clients_ack_in_the_same_batch_is_not_a_repeat() -> None:
    first, other = acked_in_one_batch("strict", ("alice", "bob"))
    assert first is not None and other is not None
    assert (first.done, other.done) == (1, 0)
    assert other.results == {"gone": 1}
