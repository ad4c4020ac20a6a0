"""The queue's stored forms: messages, ack markers and the memory that ages markers out."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sowstream.queues.store import (
    ACK_MEMORY_MS,
    AckMemory,
    StoredMessage,
    ack_marker,
    entry_key,
    offset_of,
    read_ack_marker,
)


def test_a_marker_is_told_apart_from_a_stored_message() -> None:
    message = StoredMessage(b'{"n":1}', 5, None).to_bytes()
    assert read_ack_marker(message) is None
    assert read_ack_marker(ack_marker("client-7", 1234)) == ("client-7", 1234)
    assert offset_of(entry_key("Q", 42)) == 42


def test_markers_age_out_in_the_order_written() -> None:
    memory = AckMemory()
    memory.remember(10, 1_000)
    memory.remember(11, 2_000)
    memory.remember(3, 2_500)  # a redelivered, older message acknowledged late
    assert list(memory.due(1_000 + ACK_MEMORY_MS - 1)) == []
    assert list(memory.due(2_000 + ACK_MEMORY_MS)) == [10, 11]
    assert len(memory) == 1
    assert list(memory.due(10**12)) == [3]
    assert len(memory) == 0


@given(st.lists(st.integers(0, 10**6), max_size=6000), st.integers(0, 2 * 10**6))
def test_every_marker_is_due_exactly_once(times: list[int], cut: int) -> None:
    """Whatever the cut, each marker comes out once: before it if old enough (and not held
    back by an older-written younger one), else after; compaction loses nothing."""
    memory = AckMemory()
    written = sorted(times)
    for offset, at in enumerate(written):
        memory.remember(offset, at)
    early = list(memory.due(cut, memory_ms=0))
    late = list(memory.due(10**9, memory_ms=0))
    assert early == [o for o, at in enumerate(written) if at <= cut]
    assert early + late == list(range(len(written)))
