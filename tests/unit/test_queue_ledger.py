"""The queue's state as ranges over the log: the ranges, the ledger's low-water offset, the ack
chunks and the log-retention rules (sowstream.queues.ledger, sowstream.queues.retention)."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sowstream.queues.ledger import (
    AckChunk,
    AckLog,
    LedgerError,
    PartitionLedger,
    Ranges,
    ack_chunk_prefix,
    ledger_key,
)
from sowstream.queues.retention import LogRetention

# -- ranges -----------------------------------------------------------------------------------


def canonical(ranges: Ranges) -> bool:
    """Sorted, disjoint and not touching: one way only to spell each set."""
    pairs = list(ranges)
    return all(a <= b for a, b in pairs) and all(
        pairs[i][1] + 1 < pairs[i + 1][0] for i in range(len(pairs) - 1)
    )


edits = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 60), st.just(0)),
        st.tuples(st.just("range"), st.integers(0, 60), st.integers(0, 8)),
        st.tuples(st.just("drop"), st.integers(0, 60), st.just(0)),
    ),
    max_size=60,
)


@given(edits)
def test_ranges_hold_the_same_offsets_as_a_set(steps: list[tuple[str, int, int]]) -> None:
    ranges, model = Ranges(), set[int]()
    for kind, a, width in steps:
        if kind == "add":
            ranges.add(a)
            model.add(a)
        elif kind == "range":
            ranges.add_range(a, a + width)
            model.update(range(a, a + width + 1))
        else:
            ranges.drop_below(a)
            model = {o for o in model if o >= a}
        assert canonical(ranges)
        assert {o for o in range(80) if o in ranges} == model
        assert all(ranges.first_from(o) not in model for o in range(80))
        assert Ranges.from_list(ranges.to_list(), "t") == ranges


def test_ranges_refuse_what_is_not_a_range() -> None:
    with pytest.raises(LedgerError, match="ends before it starts"):
        Ranges([(5, 3)])
    with pytest.raises(LedgerError, match="not an integer"):
        Ranges([(1, "2")])  # type: ignore[list-item]
    with pytest.raises(LedgerError, match="list of \\[start, end\\] pairs"):
        Ranges.from_list([[1, 2, 3]], "queue ledger")


# -- the ledger -------------------------------------------------------------------------------


@given(
    st.lists(st.tuples(st.booleans(), st.integers(0, 3)), min_size=1, max_size=60),
    st.randoms(use_true_random=False),
)
def test_a_reload_offers_exactly_the_messages_not_finished(
    offsets: list[tuple[bool, int]], rng: random.Random
) -> None:
    """Offsets are offered in log order, some tracked as messages (the others are not queue
    messages); messages finish in any order, and some untracked offsets are refused. After every
    step the stored ledger skips each finished offset and never a message still in the queue."""
    ledger = PartitionLedger(0)
    live: list[int] = []
    finished: set[int] = set()
    for offset, (tracked, finishes) in enumerate(offsets):
        if tracked:
            ledger.track(offset)
            live.append(offset)
        else:
            ledger.offered(offset)
            if finishes == 0:  # refused when applied, or acknowledged before it arrived
                ledger.finish(offset)
                finished.add(offset)
        for _ in range(finishes):
            if not live:
                break
            done = live.pop(rng.randrange(len(live)))
            ledger.finish(done)
            finished.add(done)
        stored = PartitionLedger.from_bytes(ledger.to_bytes())
        assert all(stored.skips(o) for o in finished)
        assert not any(stored.skips(o) for o in live)
        assert stored.low == (min(live) if live else offset + 1)


def test_the_low_water_offset_passes_everything_offered_when_the_queue_is_empty() -> None:
    ledger = PartitionLedger(10)
    ledger.track(10)
    ledger.offered(14)  # 11 to 14: records that are not queue messages
    ledger.finish(10)
    assert ledger.advance() == 15 and len(ledger.done) == 0
    assert PartitionLedger.from_bytes(ledger.to_bytes()).low == 15


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (b"not json", "not JSON"),
        (b'{"v": 9, "low": 1}', "unknown version"),
        (b'{"v": 1, "low": -4}', "low-water offset -4"),
        (b'{"v": 1, "low": 3, "done": [[9, 2]]}', "ends before it starts"),
    ],
)
def test_a_damaged_ledger_names_what_is_wrong(value: bytes, problem: str) -> None:
    with pytest.raises(LedgerError, match=problem):
        PartitionLedger.from_bytes(value)


def test_each_queue_has_its_own_keys() -> None:
    assert ledger_key("A") != ledger_key("AB") and not ledger_key("AB").startswith(ledger_key("A"))
    assert not ack_chunk_prefix("AB").startswith(ack_chunk_prefix("A"))


# -- ack chunks -------------------------------------------------------------------------------


def test_acknowledgements_are_remembered_with_their_client_until_they_age_out() -> None:
    acks = AckLog("Q")
    first = acks.chunk("alice", [4, 3, 5, 9], 1_000)
    second = acks.chunk("bob", [6], 1_000)  # the same millisecond: another key
    assert first.key != second.key and first.key < second.key
    assert first.offsets.to_list() == [[3, 5], [9, 9]]
    assert acks.who_acked(4) is None  # not remembered before it is stored
    acks.restore(first)
    acks.restore(second)
    assert (acks.who_acked(4), acks.who_acked(6), acks.who_acked(7)) == ("alice", "bob", None)
    assert acks.due(1_000 + 59_999, 60_000) == []
    assert acks.due(1_000 + 60_000, 60_000) == [first.key, second.key]
    assert acks.who_acked(4) is None and len(acks) == 0


def test_a_chunk_survives_the_store_and_a_new_owner_keys_after_it() -> None:
    old = AckLog("Q")
    chunk = old.chunk("alice", [1, 2], 5_000)
    read = AckChunk.from_bytes(chunk.key, chunk.to_bytes())
    assert (read.client, read.at_ms, read.offsets) == ("alice", 5_000, chunk.offsets)
    new = AckLog("Q")
    new.restore(read)
    assert new.chunk("bob", [3], 4_000).key > chunk.key  # a clock behind: still a new key


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (b"{", "not JSON"),
        (b'{"t": 1, "r": []}', "names no client"),
        (b'{"c": "a", "t": "x", "r": []}', "time 'x'"),
        (b'{"c": "a", "t": 1, "r": 5}', "pairs"),
    ],
)
def test_a_damaged_chunk_names_what_is_wrong(value: bytes, problem: str) -> None:
    with pytest.raises(LedgerError, match=problem):
        AckChunk.from_bytes(b"k", value)


# -- retention --------------------------------------------------------------------------------


def test_a_compacted_log_is_refused_naming_the_queue_and_the_log() -> None:
    with pytest.raises(ValueError, match=re.escape("queue 'WQ': its log 'p.log.t' is compacted")):
        LogRetention.check("WQ", "p.log.t", {"cleanup.policy": "compact,delete"})
    with pytest.raises(ValueError, match=re.escape("retention.ms='soon', not a number")):
        LogRetention.check("WQ", "p.log.t", {"retention.ms": "soon"})


def test_a_finite_retention_is_held_against_the_messages_lifetime_and_age() -> None:
    forever = LogRetention.check("WQ", "log", {"retention.ms": "-1"})
    assert forever.retention_ms is None and not forever.outlives(None)
    assert not forever.alarmed(0, 10**12)
    day = LogRetention.check("WQ", "log", {"retention.ms": "86400000", "cleanup.policy": "delete"})
    assert day.outlives(None) and day.outlives(86_400_001) and not day.outlives(3_600_000)
    assert not day.alarmed(0, int(86_400_000 * 0.79)) and day.alarmed(0, int(86_400_000 * 0.8))
    assert not day.alarmed(None, 10**12)  # no message: nothing to lose
