"""Stored state batches that read whole or not at all (sowstream.engine.atomic)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sowstream.engine.atomic import purgeable, unwrap, wrap, wrap_batch

VALUES = st.one_of(st.none(), st.binary(max_size=20))


@given(st.integers(0, 2**40), VALUES, VALUES)
def test_a_committed_batch_reads_its_new_value_a_later_one_its_previous(
    mark: int, new: bytes | None, previous: bytes | None
) -> None:
    stored = wrap(mark, new, previous)
    assert unwrap(stored, mark) == new
    assert unwrap(stored, mark + 5) == new
    assert unwrap(stored, mark - 1) == previous
    assert purgeable(stored, mark) == (new is None)
    assert not purgeable(stored, mark - 1)


def test_plain_values_written_before_the_format_read_as_they_are() -> None:
    for plain in (b'[1, {"a": 2}]', b"17", b'{"x": 1}', b""):
        assert unwrap(plain, -1) == plain
        assert not purgeable(plain, 10)
    assert unwrap(None, 3) is None


def test_a_batch_keeps_each_entry_committed_value_as_its_previous() -> None:
    store = {b"g/a": wrap(4, b"A4", b"A3"), b"g/b": b"plain", b"g/c": wrap(9, b"C9", b"C8")}
    batch = wrap_batch({b"g/a": b"A7", b"g/b": None, b"g/c": b"C10", b"g/d": b"D"}, 7, 4, store.get)
    # g/c's stored batch (9) is past the committed mark 4: its committed value is C8.
    assert {k: unwrap(v, 4) for k, v in batch.items()} == {
        b"g/a": b"A4",
        b"g/b": b"plain",
        b"g/c": b"C8",
        b"g/d": None,
    }
    assert {k: unwrap(v, 7) for k, v in batch.items()} == {
        b"g/a": b"A7",
        b"g/b": None,
        b"g/c": b"C10",
        b"g/d": b"D",
    }
    assert [k for k, v in batch.items() if purgeable(v, 7)] == [b"g/b"]
