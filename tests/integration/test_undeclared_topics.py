"""Topics in no configuration: created on first use as plain topics, or refused by policy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sowstream.client import Client
from sowstream.errors import CommandFailedError, InvalidCommandError
from tests.support.engine import EngineProcesses, running_engine

pytestmark = pytest.mark.integration

TOPICS: list[dict[str, Any]] = [{"Name": "orders", "Key": "/id", "Partitions": 2}]
PLAIN: list[dict[str, Any]] = [{"Name": "ticks", "Partitions": 2}]


@pytest.fixture(scope="module")
def engine(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    workdir = tmp_path_factory.mktemp("undeclared")
    with running_engine(kafka_bootstrap, workdir, TOPICS, plain_topics=PLAIN) as procs:
        yield procs


def received(sub: Any, count: int, timeout: float = 20.0) -> list[dict[str, Any]]:
    """The bodies of the next ``count`` live messages."""
    bodies = []
    for _ in range(count):
        msg = sub.next(timeout=timeout)
        assert msg is not None, f"only {len(bodies)} of {count} messages arrived: {bodies}"
        bodies.append(msg.json())
    return bodies


def test_subscribe_first_then_publish_to_an_undeclared_topic(
    client: Client, publisher: Client
) -> None:
    sub = client.subscribe("news", "/level > 1")
    assert client.topics["news"].auto and not client.topics["news"].sow
    for i in range(20):  # keyless: each publisher keeps to one partition; the key spreads them
        publisher.publish("news", {"n": i, "level": i % 3}, sow_key=f"k{i}")
    bodies = received(sub, len([i for i in range(20) if i % 3 > 1]))
    assert sorted(b["n"] for b in bodies) == [i for i in range(20) if i % 3 > 1]
    assert sub.next(timeout=1.0) is None
    sub.close()


def test_publish_first_then_subscribe_gets_later_publishes(
    engine: EngineProcesses, client: Client, publisher: Client
) -> None:
    publisher.publish("alerts", {"n": 0})  # creates the topic; nobody listens yet
    with engine.client() as third:
        third.publish("alerts", {"n": 1})
    sub = client.subscribe("alerts")
    for n in (2, 3, 4):
        publisher.publish("alerts", {"n": n})
    assert [b["n"] for b in received(sub, 3)] == [2, 3, 4]  # one publisher: kept in order
    sub.close()


def test_sow_on_an_undeclared_topic_is_the_plain_topic_error(
    client: Client, publisher: Client
) -> None:
    with pytest.raises(InvalidCommandError) as declared:
        list(client.sow("ticks"))
    publisher.publish("quotes", {"px": 1})
    for name in ("quotes", "never_used"):
        with pytest.raises(InvalidCommandError) as undeclared:
            list(client.sow(name))
        assert str(undeclared.value) == str(declared.value).replace("'ticks'", f"'{name}'")
    assert "has no SOW: it can be subscribed to, not queried" in str(declared.value)
    assert "never_used" not in client.refresh_topics()  # a query creates nothing
    assert client.sow_delete("never_used", filter="1=1") == 0


def test_sow_and_subscribe_on_an_undeclared_topic_has_an_empty_sow_part(
    client: Client, publisher: Client
) -> None:
    sub = client.sow_and_subscribe("feed")
    group = [m.command for m in (sub.next(timeout=10) for _ in range(2)) if m is not None]
    assert group == ["group_begin", "group_end"]
    publisher.publish("feed", {"n": 1})
    assert received(sub, 1) == [{"n": 1}]
    sub.close()


def test_the_policy_can_refuse_undeclared_topics(kafka_bootstrap: str, tmp_path: Path) -> None:
    with (
        running_engine(
            kafka_bootstrap,
            tmp_path,
            TOPICS,
            workers=("w1",),
            engine_extra={"auto_create_topics": False},
        ) as procs,
        procs.client() as client,
    ):
        for attempt in (
            lambda: client.publish("news", {"n": 1}),
            lambda: client.subscribe("news"),
        ):
            with pytest.raises(CommandFailedError) as refused:
                attempt()
            text = str(refused.value)
            assert "topic 'news' is not declared" in text
            assert "engine.auto_create_topics is false" in text
        assert "news" not in client.refresh_topics()
        client.publish("orders", {"id": 1})  # declared topics are not affected
        assert [m.json() for m in client.sow("orders") if m.command == "sow"] == [{"id": 1}]
