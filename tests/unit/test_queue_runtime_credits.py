"""A worker's queue in credit mode: it reports to each subscription, leases only within the
credit granted for the current epoch, and leases within backlogs once it holds every partition
(sowstream.engine.queues with sowstream.queues.credits)."""

from __future__ import annotations

import asyncio
import time

import pytest

from sowstream.config.queues import QueueConfig
from sowstream.engine.partition import AppliedPublish
from sowstream.engine.queues import QueueRuntime
from sowstream.engine.units.queue import per_worker, warn_per_worker
from sowstream.errors import InvalidCommandError
from sowstream.queues.credits import CREDIT_NOTICE, CreditGrant, CreditNotice
from sowstream.queues.store import epoch_key
from sowstream.subscriptions.model import SubscriptionSpec
from sowstream.subscriptions.options import parse_options
from sowstream.wire import headers as h
from sowstream.wire.protocol import Command
from sowstream.wire.topics import TopicNames
from tests.support.sender import RecordingSender


async def _stored(_topic: str, _partition: int, _changes: object) -> bool:
    return True


def grant_command(grant: CreditGrant, sub_id: str = "s1") -> Command:
    return Command(
        command="queue_credit",
        command_id="c",
        query_id="",
        reply_to="r1",
        topic="WQ",
        sub_id=sub_id,
        options=grant.options(),
    )


def test_a_worker_holding_some_partitions_leases_only_within_credit() -> None:
    async def go() -> None:
        sender = RecordingSender()
        config = QueueConfig(name="WQ", underlying_topic="work", max_per_subscription_backlog=2)
        queue = QueueRuntime(config, TopicNames("p"), sender, _stored)
        queue.partitions = frozenset({("work", 0), ("work", 1)})
        queue.load("work", 0, [], -1)
        assert queue.machine.credited  # partition 1 is elsewhere
        spec = SubscriptionSpec(
            sub_id="s1",
            reply_to="r1",
            topic="WQ",
            command="subscribe",
            options=parse_options("max_backlog=2"),
        )
        assert queue.subscribe(spec) == 2
        queue.append("work", 0, [AppliedPublish(5, 100, b"{}", {}, None)])
        assert await queue.deliver_once() == 0  # no credit yet
        assert await queue.send_notices() == 1
        assert await queue.send_notices() == 0  # unchanged: not sent again
        (reply,) = sender.replied
        assert reply.headers is not None and reply.headers[h.COMMAND] == CREDIT_NOTICE
        (entry,) = CreditNotice.from_bytes(reply.value).entries
        assert (entry.partition, entry.whole, entry.credit, entry.best) == (
            0,
            False,
            0,
            ((1, 100, 5),),
        )

        stale = CreditGrant("WQ", "work", 0, entry.epoch - 1, 1, 1)
        queue.credit(grant_command(stale), "work", 0)
        assert await queue.deliver_once() == 0  # for an earlier owner: ignored
        queue.credit(grant_command(CreditGrant("WQ", "work", 0, entry.epoch, 2, 1)), "work", 0)
        assert await queue.deliver_once() == 1
        await queue.send_notices()
        report = CreditNotice.from_bytes(sender.replied[-1].value).entries[0]
        assert (report.credit, report.leased, report.applied, report.best) == (0, 1, 2, ())

        with pytest.raises(InvalidCommandError, match="integer credits"):
            queue.credit(
                grant_command(CreditGrant("WQ", "work", 0, 1, 3, 1)).with_(
                    options={"epoch": "1", "seq": "3"}
                ),
                "work",
                0,
            )

        queue.load("work", 1, [], -1)  # every partition here now: backlogs, no credits
        assert not queue.machine.credited
        await queue.send_notices()
        assert all(e.whole for e in CreditNotice.from_bytes(sender.replied[-1].value).entries)
        queue.append("work", 1, [AppliedPublish(7, 200, b"{}", {}, None)])
        assert await queue.deliver_once() == 1  # within the backlog of 2

    asyncio.run(go())


def test_what_holds_per_worker_is_warned_at_start_naming_the_queue(
    caplog: pytest.LogCaptureFixture,
) -> None:
    capped = QueueConfig(
        name="CAPPED", underlying_topic="work", max_backlog=4, target_queue_depth=5000
    )
    with caplog.at_level("WARNING", logger="sowstream.engine.queues"):
        warn_per_worker(capped)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all(line.startswith("queue CAPPED: ") for line in lines)
    assert "MaxBacklog 4" in lines[0] and "TargetQueueDepth 5000" in lines[1]
    # Backlogs, priority and barriers hold over the workers: nothing to warn about.
    assert per_worker(QueueConfig(name="Q", underlying_topic="work", priority="/p")) == []


def test_a_new_owner_takes_an_epoch_after_the_stored_one_whatever_its_clock() -> None:
    config = QueueConfig(name="WQ", underlying_topic="work")
    queue = QueueRuntime(config, TopicNames("p"), RecordingSender(), _stored)
    ahead = time.time_ns() // 1000 + 10**9  # the last owner's clock ran 1000 s ahead
    changes = queue.load("work", 0, [], -1, after=ahead)
    assert changes[epoch_key("WQ")] == str(ahead + 1).encode()
    assert queue.credits.epoch("work", 0) == ahead + 1
