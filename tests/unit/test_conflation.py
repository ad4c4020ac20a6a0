"""The pure part of conflated topics: the input events of a change, and the conflator."""

from __future__ import annotations

import orjson

from sowstream.config.conflated import ConflatedTopicConfig
from sowstream.views.conflated import ConflatedFeed, Conflator

SOURCE = ("json|px", 0, 7, 1)


def feed(filter: str | None = None, partitions: int = 4) -> ConflatedFeed:
    ct = ConflatedTopicConfig(
        name="px-C", underlying_topic="px", filter=filter, partitions=partitions
    )
    return ConflatedFeed(ct, "p.view-in.px-C")


def state(event_value: bytes) -> object:
    return orjson.loads(event_value)["a"]


def test_events_are_routed_by_sow_key_and_carry_the_new_state() -> None:
    f = feed()
    (one,) = f.events("k1", None, {"sym": "A", "p": 1}, SOURCE)
    (two,) = f.events("k1", {"sym": "A", "p": 1}, {"sym": "A", "p": 2}, SOURCE)
    assert one.partition == two.partition and one.key == b"k1"
    assert state(two.value) == {"sym": "A", "p": 2}
    (gone,) = f.events("k1", {"sym": "A", "p": 2}, None, SOURCE)
    assert state(gone.value) is None


def test_filter_sends_a_delete_when_a_record_stops_matching_and_nothing_outside_it() -> None:
    f = feed("/venue = 'X'")
    assert f.events("k", None, {"venue": "Y"}, SOURCE) == []
    (left,) = f.events("k", {"venue": "X"}, {"venue": "Y"}, SOURCE)
    assert state(left.value) is None
    (back,) = f.events("k", {"venue": "Y"}, {"venue": "X", "p": 3}, SOURCE)
    assert state(back.value) == {"venue": "X", "p": 3}


def event(key: str, after: object) -> bytes:
    return orjson.dumps({"t": "px", "k": key, "a": after, "s": [*SOURCE, 0]})


def test_conflator_keeps_only_the_latest_state_per_key_until_taken() -> None:
    c = Conflator()
    for offset, p in enumerate([1, 2, 3]):
        c.add(offset, event("A", {"p": p}))
    c.add(3, event("B", {"p": 1}))
    c.add(4, event("B", None))
    c.add(2, event("A", {"p": 99}))  # at or below what was taken in: ignored
    pending, upto = c.take()
    assert pending == {"A": {"p": 3}, "B": None}
    assert upto == 4
    assert c.take() == ({}, 4)
    c.flushed_to(upto)
    assert c.flushed == 4


def test_delete_then_reinsert_within_an_interval_is_one_update() -> None:
    c = Conflator()
    c.add(0, event("A", None))
    c.add(1, event("A", {"p": 9}))
    assert c.take()[0] == {"A": {"p": 9}}


def test_a_failed_flush_is_put_back_without_overwriting_newer_states() -> None:
    c = Conflator()
    c.add(0, event("A", {"p": 1}))
    c.add(1, event("B", {"p": 1}))
    pending, _ = c.take()
    c.add(2, event("A", {"p": 2}))
    c.restore(pending)
    assert c.take()[0] == {"A": {"p": 2}, "B": {"p": 1}}
    assert c.flushed == -1
