"""A topic's share of a store that several topics share (topics created on first use that feed
queues): each sees its own keys only, as if the store were its own."""

from __future__ import annotations

from sowstream.engine.store import MemoryPartition, PrefixedPartition
from sowstream.engine.units.topic import shared_prefix


def test_topics_sharing_a_store_see_only_their_own_keys() -> None:
    shared = MemoryPartition()
    a = PrefixedPartition(shared, shared_prefix("ORDERS_A"))
    b = PrefixedPartition(shared, shared_prefix("ORDERS_AB"))  # a longer name, same start
    a.write({b"q\x00JQ\x001": b"one", b"q\x00JQ\x002": b"two", b"\x00wm": b"7"})
    b.write({b"q\x00JQ\x001": b"other", b"\x00wm": b"9"})
    assert a.get(b"\x00wm") == b"7" and b.get(b"\x00wm") == b"9"
    assert a.get_many([b"q\x00JQ\x001", b"nope"]) == [b"one", None]
    assert list(a.scan(prefix=b"q\x00JQ\x00")) == [
        (b"q\x00JQ\x001", b"one"),
        (b"q\x00JQ\x002", b"two"),
    ]
    assert list(b.scan(start=b"")) == [(b"\x00wm", b"9"), (b"q\x00JQ\x001", b"other")]
    assert list(a.keys(b"q", None)) == [b"q\x00JQ\x001", b"q\x00JQ\x002"]
    assert list(a.values(b"q", b"q\x00JQ\x002")) == [b"one"]
    a.write({b"q\x00JQ\x001": None})
    assert a.get(b"q\x00JQ\x001") is None and b.get(b"q\x00JQ\x001") == b"other"
