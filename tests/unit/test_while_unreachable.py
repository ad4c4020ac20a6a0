"""A step of the worker's start (declaring a changelog topic) waits out a broker that went away,
and still fails at once on errors that waiting cannot cure (found by the chaos run: a worker
started just before a broker restart stopped with NodeNotReadyError)."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.errors import NodeNotReadyError, TopicAuthorizationFailedError

from sowstream.engine.runtime import while_unreachable


class Flaky:
    """Fails with ``error`` the first ``failures`` times, then succeeds."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0

    async def __call__(self) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error


def test_it_retries_while_the_broker_is_unreachable_and_logs_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    step = Flaky(3, NodeNotReadyError("node 1 is not ready"))
    asyncio.run(while_unreachable(step, "creating topic t", first_pause=0.01))
    assert step.calls == 4
    assert sum("creating topic t: Kafka is not reachable" in r.message for r in caplog.records) == 3


def test_it_gives_up_after_its_wait() -> None:
    step = Flaky(1000, NodeNotReadyError("node 1 is not ready"))
    with pytest.raises(NodeNotReadyError):
        asyncio.run(while_unreachable(step, "creating topic t", wait=0.2, first_pause=0.05))
    assert 2 <= step.calls < 10


def test_an_error_waiting_cannot_cure_passes_through_at_once() -> None:
    step = Flaky(1000, TopicAuthorizationFailedError("not allowed"))
    with pytest.raises(TopicAuthorizationFailedError):
        asyncio.run(while_unreachable(step, "creating topic t", first_pause=0.01))
    assert step.calls == 1
