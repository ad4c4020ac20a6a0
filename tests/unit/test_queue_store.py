"""The older layout's stored forms, which a worker still reads: copies and ack markers."""

from __future__ import annotations

from sowstream.queues.store import StoredMessage, ack_marker, entry_key, offset_of, read_ack_marker


def test_a_marker_is_told_apart_from_a_stored_message() -> None:
    message = StoredMessage(b'{"n":1}', 5, None).to_bytes()
    assert read_ack_marker(message) is None
    assert read_ack_marker(ack_marker("client-7", 1234)) == ("client-7", 1234)
    assert offset_of(entry_key("Q", 42)) == 42
    assert StoredMessage.from_bytes(message) == StoredMessage(b'{"n":1}', 5, None)
