"""``sowstream queue``: subscribe, ack/cancel/expire, status and the error paths, end to end.

One worker, one plain topic ``work`` and the queue ``WQ`` over it; every command runs as a real
``sowstream`` process against the engine (``engine.cli``).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from sowstream.client import Client
from sowstream.errors import SowstreamError
from tests.support.engine import EngineProcesses, running_engine
from tests.support.messages import take

pytestmark = pytest.mark.integration

PLAIN = [{"Name": "work", "Partitions": 2}]
QUEUES: list[dict[str, Any]] = [
    {"Name": "WQ", "UnderlyingTopic": "work", "LeasePeriod": "30s", "MaxPerSubscriptionBacklog": 10}
]


@pytest.fixture(scope="module")
def engine(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcesses]:
    with running_engine(
        kafka_bootstrap,
        tmp_path_factory.mktemp("queue-cli"),
        [],
        workers=("w1",),
        plain_topics=PLAIN,
        queues=QUEUES,
    ) as procs:
        _wait_for_queue(procs, "WQ")
        yield procs


def _wait_for_queue(engine: EngineProcesses, queue: str, timeout: float = 90.0) -> None:
    """Block until every partition under the queue answers a status query."""
    deadline = time.monotonic() + timeout
    with Client(engine.bootstrap, prefix=engine.prefix, timeout=5.0) as client:
        while True:
            try:
                client.queue_status(queue)
                return
            except SowstreamError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


def run_ok(engine: EngineProcesses, *args: str) -> subprocess.CompletedProcess[str]:
    done = engine.cli(*args)
    assert done.returncode == 0, f"sowstream {' '.join(args)}: {done.stderr}"
    return done


def status(engine: EngineProcesses, queue: str = "WQ") -> dict[str, Any]:
    lines = run_ok(engine, "queue", "status", queue, "--json").stdout.splitlines()
    assert len(lines) == 1, lines
    row: dict[str, Any] = orjson.loads(lines[0])
    return row


def test_subscribe_prints_leased_messages_and_acknowledges_them(
    engine: EngineProcesses, publisher: Client
) -> None:
    before = status(engine)
    for n in range(1, 4):
        publisher.publish("work", {"job": n})
    publisher.flush()
    args = ("--json", "--count", "3", "--max-backlog", "10", "--idle", "30")
    done = run_ok(engine, "queue", "subscribe", "WQ", *args)
    lines = [orjson.loads(line) for line in done.stdout.splitlines()]
    # One publisher's messages share a partition, so they come in publish order.
    assert [line["data"] for line in lines] == [{"job": 1}, {"job": 2}, {"job": 3}]
    for line in lines:
        assert line["queue"] == "WQ" and line["bookmark"].startswith("work|")
        assert line["deliveries"] == 1
        assert line["lease_expires"] > time.time() * 1000  # LeasePeriod 30s
    assert "3 message(s) from WQ, 3 acknowledged" in done.stderr
    after = status(engine)
    assert after["depth"] == 0 and after["leased"] == 0
    assert after["acked"] - before["acked"] == 3
    assert after["delivered"] - before["delivered"] == 3


def test_cancel_expire_and_ack_by_bookmark_and_by_filter(
    engine: EngineProcesses, client: Client, publisher: Client
) -> None:
    before = status(engine)
    sub = client.subscribe("WQ", options="max_backlog=10")
    for n in range(1, 4):
        publisher.publish("work", {"job": n, "kind": "bookmarked"})
    held = take(sub, 3)
    first, rest = held[0], held[1:]

    cancelled = run_ok(engine, "queue", "cancel", "WQ", first.bookmark)
    assert "returned 1 message(s) of 1 bookmark(s) on WQ" in cancelled.stdout
    again = take(sub, 1)[0]  # the only subscriber gets it back
    assert again.bookmark == first.bookmark and again.deliveries == 2

    expired = run_ok(engine, "queue", "expire", "WQ", first.bookmark)
    assert "expired 1 message(s)" in expired.stdout
    acked = run_ok(engine, "queue", "ack", "WQ", ",".join(m.bookmark for m in rest))
    assert "acknowledged 2 message(s) of 2 bookmark(s) on WQ" in acked.stdout
    sub.close()

    publisher.publish("work", {"job": 4, "kind": "by-filter"}, ack=True)
    by_filter = run_ok(engine, "queue", "ack", "WQ", "--filter", "/kind = 'by-filter'")
    assert "acknowledged 1 message(s) matching" in by_filter.stdout

    after = status(engine)
    assert after["depth"] == 0 and after["leased"] == 0
    assert after["acked"] - before["acked"] == 3
    assert after["expired"].get("forced_expire", 0) - before["expired"].get("forced_expire", 0) == 1


def test_status_lists_every_queue(engine: EngineProcesses) -> None:
    listed = run_ok(engine, "queue", "status", "--json").stdout
    rows = [orjson.loads(line) for line in listed.splitlines()]
    assert [row["queue"] for row in rows] == ["WQ"]
    assert {"depth", "leased", "delivered", "acked", "expired"} <= set(rows[0])
    assert {"seconds_behind", "age_of_oldest_lease", "priority_count"} <= set(rows[0])
    table = run_ok(engine, "queue", "status").stdout
    assert "WQ" in table and "depth" in table and "delivered" in table
    assert "behind" in table and "oldest lease" in table and "priorities" in table


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("queue", "subscribe", "NOPE", "--count", "1"), "unknown queue 'NOPE' (queues: WQ)"),
        (("queue", "status", "work"), "'work' is a topic, not a queue"),
        (("queue", "ack", "WQ", "not-a-bookmark"), "is not of the form topic|partition|offset"),
        (("queue", "cancel", "WQ", "other|0|1"), "is not a message of queue 'WQ'"),
        (("queue", "ack", "WQ"), "give at least one bookmark"),
        (("queue", "ack", "WQ", "--filter", "/kind = "), "error:"),
    ],
)
def test_errors_are_one_line_and_exit_2(
    engine: EngineProcesses, args: tuple[str, ...], message: str
) -> None:
    done = engine.cli(*args)
    assert done.returncode == 2, done
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    # one line of ours (librdkafka may add its own "%6|..." log lines on close)
    ours = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("%")]
    assert len(ours) == 1, done.stderr
