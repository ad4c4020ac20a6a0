"""An aggregated subscription's subscriber holds what an aggregated ``sow`` returns, at every step.

The real processor (two in-memory partitions, so groups span partitions) and the real client-side
``Subscription``: random publishes, delta publishes and deletes (by key and by filter), records
moving between groups and in and out of the filter, registration and placement on each partition at
random moments, worker crashes (a new worker loads the stores and reads the log on). After every
step the application's records (built from the SOW part, publishes, deltas and oof) equal the
aggregation of the SOW's matching records.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sowstream.client.messages import Message
from sowstream.errors import InvalidCommandError
from sowstream.sow.ops import RawRecord
from sowstream.subscriptions.model import (
    DELTA_SUBSCRIBE,
    SOW_AND_DELTA_SUBSCRIBE,
    SOW_AND_SUBSCRIBE,
    SUBSCRIBE,
    WITH_SOW,
)
from sowstream.subscriptions.options import parse_options
from sowstream.wire.avro import decode
from sowstream.wire.protocol import Command
from tests.support.subscriber import Harness
from tests.unit.test_subscriber_cache import DURABLE, TOPIC, Log, crashing_step

PROJECTIONS = [
    "[/g, COUNT(/id) AS /n, SUM(/v) AS /s, MAX(/x/v) AS /mx]",
    "[/g AS /group, STDDEV_POP(/v) AS /sd, STDDEV_SAMP(/v) AS /ss, ANY(/ck) AS /a, "
    "DISTINCT_LIST(/v) AS /dl, SUM(IF(/v > 4, 1, 0)) AS /big, AVG(/v) AS /avg]",
    "[COUNT_DISTINCT(/v) AS /d, MIN(/v) AS /lo, SUM(/v) / COUNT(/v) AS /mean]",
]
FILTERS = [None, "/v > 3", "/g = 1", "/x/v >= 5 OR /v < 2"]


def run(
    steps: list[tuple[tuple[str, int, int, int], str]],
    placement: tuple[int, int, int],
    command: str,
    flt: str | None,
    options: str,
    durable: bool,
) -> None:
    user = parse_options(options)
    harness = Harness(DURABLE if durable else TOPIC, command, flt, user)
    log = Log()
    register_at, place_0, place_1 = sorted(x % (len(steps) + 1) for x in placement)
    place_at = {place_0: [0], place_1: [1]} if place_0 != place_1 else {place_0: [0, 1]}

    def check() -> None:
        held = harness.cache.view()
        wanted = harness.expected(log.sow)
        if command not in WITH_SOW:
            # Without the SOW part the application knows the groups that changed since.
            held = {k: v for k, v in held.items() if k not in harness.cache.partial}
            wanted = {k: v for k, v in wanted.items() if k in held}
        if user.oof:
            assert held == wanted
        else:
            # Nobody tells it a group emptied: it holds every group as it is, maybe more.
            assert {k: held.get(k) for k in wanted} == wanted

    async def go() -> None:
        await harness.start()
        batch: list[RawRecord] = []
        for n, (operation, between) in enumerate([*steps, (None, "flush")]):
            if n == register_at:
                harness.register()
            if n in place_at:
                await harness.apply(batch)
                batch = []
                for p in place_at[n]:
                    await harness.place(p)
            if operation is not None:
                batch.extend(log.records(*operation))
            if between in ("cut", "flush", "crash"):
                await harness.apply(batch)
                batch = []
            if between == "cut":
                await harness.proc.drain()
            if between == "crash" and durable:
                await harness.crash()
            if harness.placed and between:
                check()
        await harness.apply(batch)
        await harness.flush()
        for p in (0, 1):
            if p not in harness._placed:
                await harness.place(p)
        check()

    asyncio.run(go())


@settings(max_examples=300, deadline=None)
@given(
    st.lists(crashing_step, min_size=6, max_size=40),
    st.tuples(st.integers(0, 30), st.integers(0, 30), st.integers(0, 30)),
    st.sampled_from([SOW_AND_SUBSCRIBE, SOW_AND_DELTA_SUBSCRIBE, SUBSCRIBE, DELTA_SUBSCRIBE]),
    st.sampled_from(FILTERS),
    st.sampled_from(PROJECTIONS),
    st.booleans(),
    st.booleans(),
)
@example(  # a crash: the new worker loads the partitions before it reads the registry
    steps=[
        (("publish", 0, 0, 0), ""),
        (("delete", 0, 0, 0), ""),
        (("publish", 0, 0, 0), "crash"),
        (("publish", 0, 0, 1), ""),
    ],
    placement=(0, 0, 0),
    command=SOW_AND_SUBSCRIBE,
    flt=None,
    projection=PROJECTIONS[0],
    oof=False,
    durable=True,
)
def test_aggregated_subscriber_equals_aggregated_sow(
    steps: list[tuple[tuple[str, int, int, int], str]],
    placement: tuple[int, int, int],
    command: str,
    flt: str | None,
    projection: str,
    oof: bool,
    durable: bool,
) -> None:
    options = f"{'oof,' if oof else ''}grouping=[/g],projection={projection}"
    run(steps, placement, command, flt, options, durable)


def test_groups_publish_and_go_out_of_focus() -> None:
    """Chapter 07's V1 as an aggregated subscription: publishes, a group move, an oof."""
    user = parse_options("oof,grouping=[/g],projection=[/g, SUM(/v) AS /total, COUNT(/id) AS /n]")
    harness = Harness(TOPIC, SOW_AND_SUBSCRIBE, None, user)
    log = Log()
    seen: list[tuple[str, Any]] = []
    keep = harness.cache.apply

    def record(msg: Message) -> None:
        seen.append((msg.command, msg.json() if msg.data else None))
        keep(msg)

    harness.cache.apply = record  # type: ignore[method-assign]

    async def go() -> None:
        await harness.start()
        harness.register()
        for p in (0, 1):
            await harness.place(p)
        for operation in [
            ("publish", 1, 0, 10),
            ("publish", 2, 0, 5),  # the other partition: the group spans both
            ("publish", 1, 0, 7),
            ("publish", 2, 1, 5),  # moves to group 1
            ("delete", 1, 0, 0),  # group 0 empties
        ]:
            await harness.apply(log.records(*operation))

    asyncio.run(go())
    assert seen == [
        ("group_begin", None),
        ("group_end", None),
        ("publish", {"g": 0, "total": 10, "n": 1}),
        ("publish", {"g": 0, "total": 15, "n": 2}),
        ("publish", {"g": 0, "total": 12, "n": 2}),
        ("publish", {"g": 0, "total": 7, "n": 1}),
        ("publish", {"g": 1, "total": 5, "n": 1}),
        ("oof", {"g": 0, "total": 7, "n": 1}),
    ]


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ("grouping=[/g]", "grouping needs a projection"),
        ("projection=[/g]", "projection needs a grouping"),
        ("grouping=[/g],projection=[/g],select=[/g]", "takes no select list"),
        ("grouping=[/g],projection=[/g],top_n=3", "no top_n window"),
        ("grouping=[/g],projection=[/g],conflation=1s", "not conflated"),
        ("grouping=[/g],projection=[/g],replace", "cannot be replaced"),
        ("grouping=[/g],projection=[MEDIAN(/v) AS /m]", "unknown function 'MEDIAN'"),
    ],
)
def test_refused_aggregated_options_say_why(options: str, words: str) -> None:
    with pytest.raises(InvalidCommandError) as info:
        parse_options(options)
    assert words in str(info.value)


def placement_answer(harness: Harness, **command: Any) -> dict[str, Any]:
    """The failed ``part_end`` a placement is answered with."""

    async def go() -> dict[str, Any]:
        await harness.start()
        await harness.proc.subscribe(
            Command(
                command=harness.command,
                command_id="c",
                query_id="q",
                reply_to="r",
                topic=harness.topic.name,
                sub_id="s",
                sub_options=harness.spec.options.to_text(),
                **command,
            ),
            0,
        )
        (reply,) = [decode("Reply", v) for v, headers in harness.sender.take() if headers is None]
        return reply

    return asyncio.run(go())


def test_engine_refuses_an_aggregated_placement_with_a_bookmark() -> None:
    user = parse_options("grouping=[/g],projection=[/g, COUNT(/id) AS /n]")
    reply = placement_answer(
        Harness(TOPIC, SOW_AND_SUBSCRIBE, None, user), options={"bookmark": "EPOCH"}
    )
    assert reply["status"] != "success"
    assert "aggregated subscription takes no bookmark" in reply["message"]


def test_engine_refuses_an_aggregated_placement_on_a_topic_without_sow() -> None:
    plain = TOPIC.model_copy(update={"sow": False})
    user = parse_options("grouping=[/g],projection=[/g, COUNT(/id) AS /n]")
    reply = placement_answer(Harness(plain, SUBSCRIBE, None, user))
    assert reply["status"] != "success"
    assert "keeps no SOW" in reply["message"]
