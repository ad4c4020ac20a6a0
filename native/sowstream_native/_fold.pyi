"""Type stub of the compiled fold (native/src/lib.rs)."""

from typing import Any

# An op of Chunk.fold's result, by its first item:
#   (0, index, key, sow_key, data, changed, offset, timestamp, expiration)  applied (a record)
#   (0, index, key, sow_key, None, changed)                                 applied (a delete)
#   (1, index, reason, message)                                             dead letter
#   (2, index, sow_key)                                                     re-keyed copy
#   (3, index, key, sow_key)                                                unchanged (a replay)
Op = tuple[Any, ...]

class Chunk:
    """One partition's chunk of log records of a JSON SOW topic, decoded."""

    def __init__(
        self,
        spec: tuple[str, str, list[str], bool, int | None, int | None],
        records: list[Any],
        folded: int,
    ) -> None: ...
    def reads(self) -> list[bytes]:
        """The store keys whose current records the fold reads, in first-use order."""
    def fold(
        self, olds: list[Any], index_paths: list[str], watch_paths: list[str] = ...
    ) -> tuple[
        int,
        list[Op],
        list[tuple[bytes, bytes | None, bool]],
        list[tuple[tuple[Any, ...] | None, tuple[Any, ...] | None] | None],
    ]:
        """(declined_at, ops, per key touched: its final stored form and whether its values at
        ``index_paths`` stayed the same, per op: the scalars at ``watch_paths`` before and after
        it, None where absent or not read); ``olds``: per key of :meth:`reads`, None, its stored
        form (format 1) or a record object."""

def raw_records(
    block: bytes, starts: list[int], ends: list[int]
) -> list[tuple[str, bytes, int, int, int | None] | None]:
    """Per record of a raw scan batch spanning ``[starts[i], ends[i])`` of ``block``: what
    ``RawBatch.record(i)`` returns, or None where that raises."""
