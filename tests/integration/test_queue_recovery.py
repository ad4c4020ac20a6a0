"""A queue's RecoveryPoint: where a queue added to a running system starts in its topics' logs.

The worker first runs without queues while publishes land; then it is restarted with four
queues over the same topics, one per kind of RecoveryPoint (the chapter's table: epoch, now, a
timestamp), one over a SOW topic whose state was built before the queue existed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sowstream.client import Client
from tests.support.engine import (
    QUICK_SESSION_TIMEOUT,
    EngineProcesses,
    running_engine,
    write_config,
)
from tests.support.messages import take

pytestmark = pytest.mark.integration

SOW = [{"Name": "orders", "Key": ["/id"], "Partitions": 2}]
PLAIN = [{"Name": "jobs", "Partitions": 2}]


def drain(client: Client, queue: str, expected: int) -> list[Any]:
    """Lease and acknowledge ``expected`` messages one by one (MaxPerSubscriptionBacklog is 1),
    then check nothing else comes."""
    sub = client.subscribe(queue)
    got = []
    for _ in range(expected):
        (msg,) = take(sub, 1)
        assert client.ack(queue, msg.bookmark) == 1
        got.append(msg)
    assert sub.next(timeout=2.0) is None, f"{queue}: more than {expected} messages"
    sub.close()
    return sorted((m.json() for m in got), key=lambda body: (body.get("n", 0), str(body)))


@pytest.fixture
def engine(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcesses]:
    with running_engine(
        kafka_bootstrap,
        tmp_path_factory.mktemp("queue-recovery"),
        SOW,
        workers=("w1",),
        session_timeout=QUICK_SESSION_TIMEOUT,  # the worker is killed and started again
        plain_topics=PLAIN,
    ) as procs:
        yield procs


def test_each_recovery_point_decides_what_a_new_queue_takes_from_the_log(
    engine: EngineProcesses,
) -> None:
    with engine.client() as c:
        for n in (1, 2):
            c.publish("jobs", {"n": n})
        c.publish("orders", {"id": 1, "qty": 5})
        c.delta_publish("orders", {"id": 1, "qty": 6})  # the queue gets it as published
        c.sow_delete("orders", filter="/id = 99")  # a delete is not a queue message
        c.flush()
        now = time.time()
        cut = math.floor(now) + 1  # a whole second: RecoveryPoint timestamps have no fraction
        time.sleep(cut - now + 0.2)
        c.publish("jobs", {"n": 3})
        c.flush()
        assert [m.json() for m in c.sow("orders") if m.command == "sow"] == [{"id": 1, "qty": 6}]

    engine.stop("w1")
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(cut))
    queues = [
        {"Name": "EQ", "UnderlyingTopic": "jobs"},  # epoch, the default
        {"Name": "NQ", "UnderlyingTopic": "jobs", "RecoveryPoint": "now"},
        {"Name": "TQ", "UnderlyingTopic": "jobs", "RecoveryPoint": stamp},
        {"Name": "OQ", "UnderlyingTopic": "orders"},
    ]
    write_config(engine.config, SOW, prefix=engine.prefix, plain_topics=PLAIN, queues=queues)
    engine.start("w1")
    engine.wait_ready(["orders", "EQ", "NQ", "TQ", "OQ"])

    with engine.client() as c:
        c.publish("jobs", {"n": 4})
        c.publish("orders", {"id": 2, "qty": 1})
        c.flush()
        assert [m["n"] for m in drain(c, "EQ", 4)] == [1, 2, 3, 4]
        assert [m["n"] for m in drain(c, "NQ", 1)] == [4]
        assert [m["n"] for m in drain(c, "TQ", 2)] == [3, 4]
        assert drain(c, "OQ", 3) == [{"id": 1, "qty": 5}, {"id": 1, "qty": 6}, {"id": 2, "qty": 1}]

    # Started again (killed: nothing saved on the way out), the queues go on from their stored
    # state: what was acknowledged is not taken from the log a second time.
    engine.stop("w1", kill=True)
    engine.start("w1")
    engine.wait_ready(["EQ", "NQ", "TQ", "OQ"])
    with engine.client() as c:
        c.publish("jobs", {"n": 5})
        c.flush()
        for queue in ("EQ", "NQ", "TQ"):
            assert [m["n"] for m in drain(c, queue, 1)] == [5]
        assert drain(c, "OQ", 0) == []
