"""History end to end: point-in-time and aggregated queries, historical and bookmark subscriptions.

Two real workers, four partitions, a real broker. Points in time are taken between publishes
the engine has applied, on the machine's clock, which is also the broker's (LogAppendTime).
"""

from __future__ import annotations

import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from sowstream.client import Client, Message, Subscription
from sowstream.errors import CommandFailedError, InvalidCommandError
from sowstream.sow.query import validate_query
from sowstream.sow.timestamps import format_timestamp
from sowstream.subscriptions.options import parse_options
from sowstream.wire import protocol
from tests.support.engine import EngineProcesses, running_engine

pytestmark = pytest.mark.integration

HISTORY = {"Window": "1d", "Granularity": "0s"}
TOPICS: list[dict[str, Any]] = [
    {"Name": "px", "Key": ["/id"], "History": HISTORY, "Partitions": 4},
    {"Name": "focus", "Key": ["/id"], "History": HISTORY, "Partitions": 4},
    {"Name": "coarse", "Key": ["/id"], "History": {"Window": "1d", "Granularity": "1s"}},
    {"Name": "nohist", "Key": ["/id"], "Partitions": 4},
    {"Name": "nofocus", "Key": ["/id"], "Partitions": 4},
    {"Name": "sales", "Key": ["/id"], "History": HISTORY, "Partitions": 4},
]
PLAIN = [{"Name": "feed", "Partitions": 2}]
NAMES = [t["Name"] for t in TOPICS]


@pytest.fixture(scope="module")
def engine(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcesses]:
    workdir = tmp_path_factory.mktemp("history")
    with running_engine(kafka_bootstrap, workdir, TOPICS, plain_topics=PLAIN) as procs:
        yield procs


def mark(publisher: Client, topic: str) -> str:
    """A moment after everything published so far was applied, before anything later."""
    list(publisher.sow(topic, top_n=0))  # read-your-writes: the engine has it all
    time.sleep(0.05)
    moment = format_timestamp(int(time.time() * 1000))
    time.sleep(0.05)
    return moment


def by_id(msgs: Iterator[Message] | list[Message]) -> dict[int, Any]:
    return {m.json()["id"]: m.json() for m in msgs if m.command == "sow"}


def quiet(sub: Subscription, wait: float = 2.0) -> list[Message]:
    out: list[Message] = []
    while (msg := sub.next(timeout=wait)) is not None:
        out.append(msg)
    return out


def test_sow_at_a_point_in_time(client: Client, publisher: Client) -> None:
    for i in range(1, 7):
        publisher.publish("px", {"id": i, "g": i % 2, "v": 1})
    t1 = mark(publisher, "px")
    publisher.publish("px", {"id": 1, "g": 1, "v": 2})
    publisher.delta_publish("px", {"id": 3, "v": 3})
    publisher.sow_delete("px", data={"id": 2})
    publisher.sow_delete("px", filter="/id = 6")
    t2 = mark(publisher, "px")
    publisher.sow_delete("px", filter="1=1")
    t3 = mark(publisher, "px")

    assert by_id(client.sow("px", bookmark=t1)) == {
        i: {"id": i, "g": i % 2, "v": 1} for i in range(1, 7)
    }
    assert by_id(client.sow("px", bookmark=t2)) == {
        1: {"id": 1, "g": 1, "v": 2},
        3: {"id": 3, "g": 1, "v": 3},
        4: {"id": 4, "g": 0, "v": 1},
        5: {"id": 5, "g": 1, "v": 1},
    }
    # sow_delete leaves history intact, and the present is empty
    assert by_id(client.sow("px", bookmark=t3)) == {}
    assert by_id(client.sow("px")) == {}
    assert by_id(client.sow("px", bookmark="EPOCH")) == {}
    # filters, OrderBy and top_n apply to the past state
    page = [m for m in client.sow("px", "/g = 1", bookmark=t1, order_by="/id DESC", top_n=2)]
    assert [m.json()["id"] for m in page if m.command == "sow"] == [5, 3]
    assert all(m.bookmark.count("|") == 2 for m in page if m.command == "sow")


def test_point_in_time_errors(engine: EngineProcesses, client: Client) -> None:
    with pytest.raises(CommandFailedError, match="topic 'nohist' keeps no History"):
        list(client.sow("nohist", bookmark="20260101T000000"))
    two_days_ago = format_timestamp(int(time.time() * 1000) - 2 * 86_400_000)
    with pytest.raises(CommandFailedError, match="older than the History Window"):
        list(client.sow("px", bookmark=two_days_ago))
    with pytest.raises(InvalidCommandError, match="bookmark 'last tuesday' is not a timestamp"):
        list(client.sow("px", bookmark="last tuesday"))
    with pytest.raises(InvalidCommandError, match="bookmark 'soon' is not a timestamp"):
        client.subscribe("px", bookmark="soon")
    # a client that skips validation gets the engine's answer; the engine goes on
    info = client.topic_info("px")
    sub = Subscription("x", [], parse_options(""), key_fields={})
    client._connection.add_subscription(sub)
    with pytest.raises(CommandFailedError, match="bookmark 'soon' is not a timestamp"):
        list(
            client._subscribing.place(
                sub,
                [info],
                "subscribe",
                None,
                parse_options(""),
                None,
                1,
                None,
                None,
                bookmark="soon",
            )
        )
    client._connection.drop_subscription(sub)
    assert by_id(client.sow("px", top_n=0)) == {}


def _per_key(msgs: list[Message]) -> dict[str, list[tuple[str, Any, str, bool]]]:
    out: dict[str, list[tuple[str, Any, str, bool]]] = defaultdict(list)
    for m in msgs:
        out[m.sow_key].append((m.command, m.json(), m.reason, m.delta))
    return dict(out)


@pytest.mark.parametrize("delta", [False, True])
def test_historical_sow_and_subscribe_replays_what_a_live_subscriber_saw(
    engine: EngineProcesses, publisher: Client, delta: bool
) -> None:
    publisher.sow_delete("focus", filter="1=1")
    for i in range(1, 9):
        publisher.publish("focus", {"id": i, "state": "open" if i % 2 else "done", "q": 0})
    list(publisher.sow("focus", top_n=0))
    subscribe = "sow_and_delta_subscribe" if delta else "sow_and_subscribe"
    with engine.client() as live_client, engine.client() as late_client:
        live = getattr(live_client, subscribe)("focus", "/state = 'open'", options="oof")
        t0 = mark(publisher, "focus")
        publisher.publish("focus", {"id": 1, "state": "open", "q": 1})  # update in focus
        publisher.publish("focus", {"id": 2, "state": "open", "q": 1})  # comes into focus
        publisher.delta_publish("focus", {"id": 3, "state": "done"})  # leaves: oof match
        publisher.sow_delete("focus", data={"id": 5})  # oof deleted
        publisher.sow_delete("focus", filter="/id = 7")  # oof deleted, by filter
        publisher.publish("focus", {"id": 9, "state": "open", "q": 9})  # new
        publisher.delta_publish("focus", {"id": 9, "q": 10})
        list(publisher.sow("focus", top_n=0))
        seen = quiet(live)
        past = getattr(late_client, subscribe)(
            "focus", "/state = 'open'", options="oof", bookmark=t0
        )
        replayed = quiet(past)
        sow_live = [m for m in seen if m.command == "sow"]
        sow_past = [m for m in replayed if m.command == "sow"]
        assert (
            by_id(sow_past)
            == by_id(sow_live)
            == {
                1: {"id": 1, "state": "open", "q": 0},
                3: {"id": 3, "state": "open", "q": 0},
                5: {"id": 5, "state": "open", "q": 0},
                7: {"id": 7, "state": "open", "q": 0},
            }
        )
        live_part = [m for m in seen if m.command in ("publish", "oof")]
        past_part = [m for m in replayed if m.command in ("publish", "oof")]
        assert len(live_part) == 7
        assert _per_key(past_part) == _per_key(live_part)
        assert all(m.bookmark for m in past_part)
        # then live, with no gap
        publisher.publish("focus", {"id": 1, "state": "done", "q": 1})
        (now_live,) = quiet(past)
        assert (now_live.command, now_live.reason) == ("oof", "match")
        live.close()
        past.close()


@pytest.mark.parametrize("delta", [False, True])
def test_a_bookmark_replay_without_history_is_what_a_live_subscriber_saw(
    engine: EngineProcesses, publisher: Client, delta: bool
) -> None:
    """Without History the replay's base is the log folded up to the bookmark: a delta_publish
    replays merged (or as a delta), and a held record that leaves gets its oof with the state
    the subscriber held, as live."""
    topic = "nofocus"
    publisher.sow_delete(topic, filter="1=1")
    base = 100 if delta else 200
    for i in range(base, base + 8):
        publisher.publish(topic, {"id": i, "state": "open" if i % 2 else "done", "q": 0})
    list(publisher.sow(topic, top_n=0))
    subscribe = "delta_subscribe" if delta else "subscribe"
    with engine.client() as live_client, engine.client() as late_client:
        live = getattr(live_client, subscribe)(topic, "/state = 'open'", options="oof")
        t0 = mark(publisher, topic)
        publisher.delta_publish(topic, {"id": base + 1, "q": 1})  # update in focus
        publisher.delta_publish(topic, {"id": base + 3, "state": "done"})  # leaves: oof match
        publisher.sow_delete(topic, data={"id": base + 5})  # oof deleted
        publisher.sow_delete(topic, filter=f"/id = {base + 7}")  # oof deleted, by filter
        publisher.delta_publish(topic, {"id": base + 2, "state": "open"})  # comes into focus
        list(publisher.sow(topic, top_n=0))
        seen = [m for m in quiet(live) if m.command in ("publish", "oof")]
        past = getattr(late_client, subscribe)(topic, "/state = 'open'", options="oof", bookmark=t0)
        replayed = [m for m in quiet(past) if m.command in ("publish", "oof")]
        assert len(seen) == 5
        assert _per_key(replayed) == _per_key(seen)
        changed = next(m for m in replayed if m.json()["id"] == base + 1)
        if delta:
            assert changed.json() == {"id": base + 1, "q": 1}
        else:
            assert changed.json() == {"id": base + 1, "state": "open", "q": 1}
        gone = next(m for m in replayed if m.json()["id"] == base + 5)
        assert (gone.command, gone.reason) == ("oof", "deleted")
        assert gone.json() == {"id": base + 5, "state": "open", "q": 0}
        live.close()
        past.close()


def test_bookmark_subscriptions_replay_the_log_then_go_live(
    engine: EngineProcesses, client: Client, publisher: Client
) -> None:
    for i in range(3):
        publisher.publish("nohist", {"id": i, "v": 0})
    t1 = mark(publisher, "nohist")
    publisher.publish("nohist", {"id": 0, "v": 1})
    publisher.publish("nohist", {"id": 1, "v": 1})
    list(publisher.sow("nohist", top_n=0))

    since = client.subscribe("nohist", bookmark=t1)
    assert sorted((m.json()["id"], m.json()["v"]) for m in quiet(since)) == [(0, 1), (1, 1)]
    publisher.publish("nohist", {"id": 2, "v": 2})
    assert [m.json() for m in quiet(since)] == [{"id": 2, "v": 2}]
    since.close()

    everything = client.subscribe("nohist", bookmark="EPOCH", sub_id="resume-me")
    got = quiet(everything)
    values = defaultdict(list)
    for m in got:
        values[m.json()["id"]].append(m.json()["v"])
    assert values == {0: [0, 1], 1: [0, 1], 2: [0, 2]}  # each record's messages in log order
    everything.close()

    nothing = client.subscribe("nohist", bookmark="NOW")
    assert quiet(nothing, 1.0) == []
    nothing.close()

    # a message's bookmark resumes right after it, on its partition
    first = got[0]
    after = client.subscribe("nohist", bookmark=first.bookmark)
    rest = quiet(after)
    assert (first.sow_key, first.json()) not in [(m.sow_key, m.json()) for m in rest]
    assert {m.json()["id"] for m in rest} == {0, 1, 2}
    after.close()

    # MOST_RECENT: after what this client last delivered for that subscription id
    publisher.publish("nohist", {"id": 1, "v": 3})
    list(publisher.sow("nohist", top_n=0))
    resumed = client.subscribe("nohist", bookmark="MOST_RECENT", sub_id="resume-me")
    assert [m.json() for m in quiet(resumed)] == [{"id": 1, "v": 3}]
    resumed.close()


def test_bookmark_subscription_on_a_topic_without_sow(client: Client, publisher: Client) -> None:
    publisher.publish("feed", {"n": 1})
    publisher.publish("feed", {"n": 2})
    publisher.flush()
    time.sleep(1.0)
    sub = client.subscribe("feed", "/n > 1", bookmark="EPOCH")
    assert [m.json() for m in quiet(sub)] == [{"n": 2}]
    publisher.publish("feed", {"n": 3})
    assert [m.json() for m in quiet(sub)] == [{"n": 3}]
    sub.close()


def test_granularity_answers_as_of_the_interval_boundary(client: Client, publisher: Client) -> None:
    with client.subscribe("coarse") as times:
        publisher.publish("coarse", {"id": 1, "v": 1})
        list(publisher.sow("coarse", top_n=0))
        time.sleep(1.1)
        publisher.publish("coarse", {"id": 1, "v": 2})
        publisher.publish("coarse", {"id": 1, "v": 3})
        list(publisher.sow("coarse", top_n=0))
        stamps = [(m.json()["v"], m.timestamp) for m in quiet(times)]
    assert [v for v, _ in stamps] == [1, 2, 3]
    kept = {}
    for v, t in stamps:
        kept[t // 1000] = (t, v)  # the last version of each one-second interval survives

    def expected(at: int) -> int | None:
        bound = (at // 1000) * 1000 - 1
        older = [v for t, v in sorted(kept.values()) if t <= bound]
        return older[-1] if older else None

    for _, t in stamps:
        for at in (t, t + 1000):
            got = [
                m.json()["v"]
                for m in client.sow("coarse", bookmark=format_timestamp(at))
                if m.command == "sow"
            ]
            assert got == ([expected(at)] if expected(at) is not None else []), at


def test_historical_sow_and_subscribe_replays_from_the_granularity_boundary(
    client: Client, publisher: Client
) -> None:
    """Granularity 1s, a bookmark some way into an interval: the SOW part is the state at the
    interval's start, so the replay starts there too; a delete and an update made between the
    boundary and the bookmark reach the subscriber."""
    with client.subscribe("coarse", "/id IN (10, 11)") as live:
        publisher.publish("coarse", {"id": 10, "v": 1})
        publisher.publish("coarse", {"id": 11, "v": 1})
        publisher.flush()
        first = [m.timestamp for m in quiet(live)]
        while int(time.time() * 1000) // 1000 == max(first) // 1000:
            time.sleep(0.02)  # the next interval has begun
        publisher.sow_delete("coarse", filter="/id = 10")
        publisher.publish("coarse", {"id": 11, "v": 2})
        publisher.flush()
        changes = [m.timestamp for m in quiet(live)]
    at = max(changes) + 1
    assert at // 1000 == min(changes) // 1000 > max(first) // 1000, "not one interval: retry"
    sub = client.sow_and_subscribe(
        "coarse", "/id IN (10, 11)", options="oof", bookmark=format_timestamp(at)
    )
    held: dict[int, Any] = {}
    for msg in quiet(sub):
        if msg.command in ("sow", "publish"):
            held[msg.json()["id"]] = msg.json()
        elif msg.command == "oof":
            held.pop(msg.json()["id"], None)
    sub.close()
    assert held == {11: {"id": 11, "v": 2}}


def test_history_survives_a_restart(
    engine: EngineProcesses, client: Client, publisher: Client
) -> None:
    publisher.publish("px", {"id": 100, "v": "before"})
    t1 = mark(publisher, "px")
    publisher.publish("px", {"id": 100, "v": "after"})
    list(publisher.sow("px", top_n=0))
    engine.stop_all()
    engine.start("w1")
    engine.start("w2")
    engine.wait_ready(NAMES)
    assert by_id(client.sow("px", "/id = 100", bookmark=t1)) == {100: {"id": 100, "v": "before"}}
    assert by_id(client.sow("px", "/id = 100")) == {100: {"id": 100, "v": "after"}}


# -- aggregated queries ---------------------------------------------------------------------------

SALES = [
    {"id": 1, "description": "widget", "qty": 2, "px": 10.0},
    {"id": 2, "description": "widget", "qty": 3, "px": 12.5},
    {"id": 3, "description": "gadget", "qty": 1, "px": 99.0},
    {"id": 4, "description": "gadget", "qty": None, "px": 1.0},
    {"id": 5, "description": "gizmo", "qty": "4", "px": 2.0},
    {"id": 6, "qty": 7, "px": 3.0},
]
PROJECTION = (
    "[/description, COUNT(/id) AS /count, SUM(/qty) AS /qty, AVG(/px) AS /avg_px, "
    "MIN(/px) AS /low, MAX(/px) AS /high, COUNT_DISTINCT(/qty) AS /sizes, "
    "SUM(/qty * /px) AS /notional]"
)


def test_aggregated_query_across_partitions_now_and_as_of(
    client: Client, publisher: Client
) -> None:
    for rec in SALES:
        publisher.publish("sales", rec)
    t1 = mark(publisher, "sales")
    publisher.publish("sales", {"id": 7, "description": "widget", "qty": 5, "px": 20.0})
    list(publisher.sow("sales", top_n=0))

    def rows(**kw: Any) -> list[Any]:
        msgs = list(client.sow("sales", grouping="[/description]", projection=PROJECTION, **kw))
        assert msgs[0].command == "group_begin" and msgs[-1].command == "group_end"
        assert msgs[-1].count == len(msgs) - 2
        return [m.json() for m in msgs if m.command == "sow"]

    past = rows(bookmark=t1)
    assert past == [
        {
            "description": "gadget",
            "count": 2,
            "qty": 1,
            "avg_px": 50.0,
            "low": 1.0,
            "high": 99.0,
            "sizes": 1,
            "notional": 99.0,
        },
        {
            "description": "gizmo",
            "count": 1,
            "qty": 4,
            "avg_px": 2.0,
            "low": 2.0,
            "high": 2.0,
            "sizes": 1,
            "notional": 8.0,
        },
        {
            "description": "widget",
            "count": 2,
            "qty": 5,
            "avg_px": 11.25,
            "low": 10.0,
            "high": 12.5,
            "sizes": 2,
            "notional": 57.5,
        },
        # the record without a description forms its own group (NULL), last
        {
            "count": 1,
            "qty": 7,
            "avg_px": 3.0,
            "low": 3.0,
            "high": 3.0,
            "sizes": 1,
            "notional": 21.0,
        },
    ]
    now = rows()
    assert now[2] == {
        "description": "widget",
        "count": 3,
        "qty": 10,
        "avg_px": 42.5 / 3,
        "low": 10.0,
        "high": 20.0,
        "sizes": 3,
        "notional": 157.5,
    }
    # a filter selects the records first; OrderBy and top_n apply to the groups
    top = rows(filter="/px < 50", order_by="/count DESC, /description", top_n=2)
    assert [(r.get("description"), r["count"]) for r in top] == [("widget", 3), ("gadget", 1)]


def test_aggregated_query_errors(engine: EngineProcesses, client: Client) -> None:
    with pytest.raises(InvalidCommandError, match="projection"):
        list(client.sow("sales", grouping="[/description]"))
    with pytest.raises(InvalidCommandError, match="grouping"):
        list(client.sow("sales", projection="[COUNT(/id) AS /n]"))
    with pytest.raises(InvalidCommandError, match="FOO"):
        list(client.sow("sales", grouping="[/d]", projection="[FOO(/id) AS /n]"))
    # the engine's own check, for clients that skip validation; it goes on afterwards
    info = client.topic_info("sales")
    command_id = uuid.uuid4().hex
    command = protocol.Command(
        command="sow",
        command_id=command_id,
        query_id="q",
        reply_to=client.reply_topic,
        topic="sales",
        options={"grouping": "[/description]"},
    )
    client._connection.send((info.control_topic, p, command) for p in range(info.partitions))
    with pytest.raises(CommandFailedError, match="projection"):
        list(client._querying.collect(command_id, "q", info.partitions, validate_query()))
    assert rows_of(client.sow("sales", "/id = 1")) == [SALES[0]]


def rows_of(msgs: Iterator[Message]) -> list[Any]:
    return [m.json() for m in msgs if m.command == "sow"]


def test_cli_bookmark_and_aggregates(engine: EngineProcesses, publisher: Client) -> None:
    for i in range(3):
        publisher.publish("nohist", {"id": 50 + i, "kind": "cli", "qty": i})
    list(publisher.sow("nohist", top_n=0))
    done = engine.cli(
        "subscribe",
        "nohist",
        "--filter",
        "/kind = 'cli'",
        "--bookmark",
        "EPOCH",
        "--json",
        "--count",
        "3",
        "--idle",
        "20",
    )
    assert done.returncode == 0, done.stderr
    lines = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert sorted(line["data"]["id"] for line in lines) == [50, 51, 52]
    assert all(line["bookmark"].count("|") == 2 for line in lines)
    agg = engine.cli(
        "sow",
        "nohist",
        "--filter",
        "/kind = 'cli'",
        "--grouping",
        "[/kind]",
        "--projection",
        "[/kind, SUM(/qty) AS /qty, COUNT(/id) AS /n]",
        "--json",
    )
    assert agg.returncode == 0, agg.stderr
    assert [orjson.loads(line)["data"] for line in agg.stdout.splitlines()] == [
        {"kind": "cli", "qty": 3, "n": 3}
    ]
    bad = engine.cli("sow", "nohist", "--bookmark", "20260101T000000")
    assert bad.returncode == 1 and "keeps no History" in bad.stderr
    assert "Traceback" not in bad.stderr
