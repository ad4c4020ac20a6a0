"""A subscriber holds what the SOW holds for it, at every conflation flush and at the end.

The real processor (two in-memory partitions) and the real client-side ``Subscription``: random
publishes, delta publishes and deletes (by key and by filter) on several records per partition,
records entering and leaving the filter, the registration and the placement on each partition at
random moments relative to the publishes, random conflation flushes, and every combination of
``delta``, ``oof``, ``conflation``, ``conflation_key``, ``select`` and pagination.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sowstream.config import TopicConfig, load_config_text
from sowstream.sow.keys import generated_sow_key
from sowstream.sow.ops import RawRecord
from sowstream.subscriptions.model import (
    DELTA_SUBSCRIBE,
    SOW_AND_DELTA_SUBSCRIBE,
    SOW_AND_SUBSCRIBE,
    SUBSCRIBE,
    WITH_SOW,
)
from sowstream.subscriptions.options import parse_options
from sowstream.wire import headers as h
from tests.support.subscriber import Harness

TOPIC = load_config_text(
    "sow:\n  - Name: t\n    Key: /id\n    Partitions: 2\n    HashIndex: [[/g]]\n"
    "    Durability: transient\n"
).topics[0]

DURABLE = load_config_text(
    "sow:\n  - Name: t\n    Key: /id\n    Partitions: 2\n    HashIndex: [[/g]]\n"
).topics[0]

RECORDS = 6  # ids 0..5: three records per partition


def key_of(i: int) -> str:
    return generated_sow_key("t", "t", ["/id"], {"id": i})


# (kind, record id, group, value); "filter" deletes every record of a group on both partitions.
op = st.one_of(
    st.tuples(
        st.just("publish"), st.integers(0, RECORDS - 1), st.integers(0, 1), st.integers(0, 9)
    ),
    st.tuples(st.just("delta"), st.integers(0, RECORDS - 1), st.integers(0, 1), st.integers(0, 9)),
    st.tuples(st.just("delete"), st.integers(0, RECORDS - 1), st.just(0), st.just(0)),
    st.tuples(st.just("filter"), st.just(0), st.integers(0, 1), st.just(0)),
)
# Between operations: nothing, a conflation flush, or a batch boundary.
step = st.tuples(op, st.sampled_from(["", "", "flush", "cut"]))
# The same with worker crashes: what the worker had not stored is lost, a new one takes over.
crashing_step = st.tuples(op, st.sampled_from(["", "", "flush", "cut", "crash"]))


class Log:
    """The two log partitions and the naive model of the SOW they fold to."""

    def __init__(self) -> None:
        self.next_offset = [0, 0]
        self.sow: dict[str, Any] = {}
        # Per partition, the records an operation touched since the subscription was placed
        # there: all a subscriber without a SOW part can know about.
        self.touched: dict[int, set[str]] = {0: set(), 1: set()}

    def records(self, kind: str, i: int, g: int, v: int) -> list[RawRecord]:
        if kind == "filter":
            for k, r in self.sow.items():
                if r.get("g") == g:
                    self.touched[r["id"] % 2].add(k)
            self.sow = {k: r for k, r in self.sow.items() if r.get("g") != g}
            headers = {h.COMMAND: h.SOW_DELETE, h.FILTER: f"/g = {g}"}
            return [self._at(p, None, None, headers) for p in (0, 1)]
        key = key_of(i)
        self.touched[i % 2].add(key)
        if kind == "delete":
            self.sow.pop(key, None)
            return [self._at(i % 2, key, None, {h.COMMAND: h.SOW_DELETE})]
        if kind == "publish":
            body: dict[str, Any] = {"id": i, "g": g, "v": v, "ck": f"c{i}"}
            self.sow[key] = body
            return [self._at(i % 2, key, body, {})]
        # Half the deltas carry no /g and no /ck: a record they create has no conflation key.
        delta: dict[str, Any] = {"id": i, "g": g, "x": {"v": v}} if g else {"id": i, "x": {"v": v}}
        old = self.sow.get(key, {})
        self.sow[key] = {**old, **delta, "x": {**old.get("x", {}), "v": v}}
        return [self._at(i % 2, key, delta, {h.COMMAND: h.DELTA_PUBLISH})]

    def _at(self, p: int, key: str | None, body: Any, headers: dict[str, str]) -> RawRecord:
        offset = self.next_offset[p]
        self.next_offset[p] += 1
        value = orjson.dumps(body) if body is not None else None
        return RawRecord(p, offset, 1_000 + offset, key.encode() if key else None, value, headers)


FILTERS = [None, "/v > 3", "/g = 1", "/x/v >= 5 OR /v < 2"]
COMMANDS = [SUBSCRIBE, DELTA_SUBSCRIBE, SOW_AND_SUBSCRIBE, SOW_AND_DELTA_SUBSCRIBE]


def options_text(oof: bool, conflation: bool, ckey: bool, select: bool) -> str:
    parts = ["oof"] if oof else []
    if conflation:
        parts.append("conflation=1s")
        if ckey:
            parts.append("conflation_key=/ck")
    if select:
        parts.append("select=[/id,/v,/x/v]")
    return ",".join(parts)


def run(
    steps: list[tuple[tuple[str, int, int, int], str]],
    placement: tuple[int, int, int],
    command: str,
    flt: str | None,
    options: str,
    window: tuple[int, int] | None,
    topic: TopicConfig = TOPIC,
) -> None:
    user = parse_options(options)
    if window is not None:
        user = user.with_(top_n=window[0], skip_n=window[1])
    harness = Harness(topic, command, flt, user)
    log = Log()
    register_at, place_0, place_1 = sorted(x % (len(steps) + 1) for x in placement)
    place_at = {place_0: [0], place_1: [1]} if place_0 != place_1 else {place_0: [0, 1]}

    def check() -> None:
        held = harness.cache.view()
        wanted = harness.expected(log.sow)
        if command not in WITH_SOW:
            seen = (log.touched[0] | log.touched[1]) - harness.cache.partial
            wanted = {k: v for k, v in wanted.items() if k in seen}
            held = {k: v for k, v in held.items() if k not in harness.cache.partial}
        if user.oof or window is not None:
            assert held == wanted
        else:
            # Without oof nobody tells the subscriber a record left: it must hold every
            # matching record as it is now, and may keep ones that left.
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
                    log.touched[p] = set()
            if operation is not None:
                batch.extend(log.records(*operation))
            if between in ("cut", "flush", "crash"):
                await harness.apply(batch)
                batch = []
            if between == "cut":
                await harness.proc.drain()  # stored, though conflated messages may still wait
            if between == "crash":
                await harness.crash()
            if between == "flush":
                await harness.flush()
                if harness.placed:
                    check()
        await harness.apply(batch)
        await harness.flush()
        if not harness.placed:
            for p in (0, 1):
                if p not in harness._placed:
                    await harness.place(p)
                    log.touched[p] = set()
            await harness.flush()
        check()

    asyncio.run(go())


@settings(max_examples=400, deadline=None)
@given(
    st.lists(step, min_size=6, max_size=40),
    st.tuples(st.integers(0, 30), st.integers(0, 30), st.integers(0, 30)),
    st.sampled_from(COMMANDS),
    st.sampled_from(FILTERS),
    st.booleans(),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
@example(  # the reproduction: two records of one partition change within one interval
    steps=[
        (("publish", 0, 0, 0), ""),
        (("publish", 2, 0, 0), "flush"),
        (("publish", 0, 0, 1), ""),
        (("publish", 2, 0, 1), ""),
        (("publish", 0, 0, 2), "flush"),
    ],
    placement=(2, 2, 2),
    command=SOW_AND_SUBSCRIBE,
    flt="/id IN (0, 2)",
    oof=True,
    conflation=True,
    ckey=False,
    select=False,
)
@example(  # a record re-created without /ck, then given one: two conflation keys, one record
    steps=[
        (("publish", 0, 0, 1), "flush"),
        (("delete", 0, 0, 0), ""),
        (("delta", 0, 0, 5), ""),
        (("publish", 0, 1, 3), "flush"),
    ],
    placement=(0, 0, 0),
    command=SOW_AND_DELTA_SUBSCRIBE,
    flt=None,
    oof=True,
    conflation=True,
    ckey=True,
    select=False,
)
def test_subscriber_cache_equals_sow(
    steps: list[tuple[tuple[str, int, int, int], str]],
    placement: tuple[int, int, int],
    command: str,
    flt: str | None,
    oof: bool,
    conflation: bool,
    ckey: bool,
    select: bool,
) -> None:
    run(steps, placement, command, flt, options_text(oof, conflation, ckey, select), None)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(step, min_size=6, max_size=40),
    st.tuples(st.integers(0, 30), st.integers(0, 30), st.integers(0, 30)),
    st.sampled_from([SOW_AND_SUBSCRIBE, SOW_AND_DELTA_SUBSCRIBE]),
    st.sampled_from(FILTERS),
    st.booleans(),
    st.booleans(),
    st.tuples(st.integers(1, 3), st.integers(0, 2)),
)
def test_paginated_subscriber_holds_the_window(
    steps: list[tuple[tuple[str, int, int, int], str]],
    placement: tuple[int, int, int],
    command: str,
    flt: str | None,
    conflation: bool,
    select: bool,
    window: tuple[int, int],
) -> None:
    run(steps, placement, command, flt, options_text(True, conflation, False, select), window)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(crashing_step, min_size=6, max_size=40),
    st.tuples(st.integers(0, 40), st.integers(0, 40), st.integers(0, 40)),
    st.sampled_from(COMMANDS),
    st.sampled_from(FILTERS),
    st.booleans(),
    st.booleans(),
)
@example(  # in and out of focus within the interval before the kill: no oof, the record unheld
    steps=[
        (("publish", 0, 0, 0), ""),
        (("publish", 0, 0, 0), ""),
        (("delete", 0, 0, 0), "cut"),
        (("delete", 0, 0, 0), "crash"),
    ],
    placement=(0, 0, 0),
    command=SOW_AND_SUBSCRIBE,
    flt=None,
    ckey=False,
    select=False,
)
@example(  # a change after the takeover: the oof carries what the subscriber held, not v=1
    steps=[
        (("publish", 0, 0, 0), "flush"),
        (("publish", 0, 0, 1), "cut"),
        (("publish", 2, 0, 0), "crash"),
        (("delete", 0, 0, 0), "flush"),
    ],
    placement=(0, 0, 0),
    command=SOW_AND_SUBSCRIBE,
    flt=None,
    ckey=False,
    select=False,
)
def test_conflated_subscriber_survives_worker_crashes(
    steps: list[tuple[tuple[str, int, int, int], str]],
    placement: tuple[int, int, int],
    command: str,
    flt: str | None,
    ckey: bool,
    select: bool,
) -> None:
    """A crash mid-interval loses nothing: the new owner finishes the interval from the journal,
    and tells the subscriber nothing about a record it does not hold (every oof carries the state
    it last received)."""
    options = options_text(True, True, ckey, select)
    run(steps, placement, command, flt, options, None, DURABLE)
