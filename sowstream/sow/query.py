"""The ``sow`` query's options, their validation and result order; shared by engine and client."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sowstream.errors import InvalidCommandError
from sowstream.filters import Filter, compile_filter
from sowstream.filters.order_by import SortField, parse_order_by, sort_key

MAX_BATCH_SIZE = 10_000
SERVER_DEFAULT_BATCH_SIZE = 1
CLIENT_DEFAULT_BATCH_SIZE = 10


@dataclass(frozen=True)
class QueryOptions:
    """What a ``sow`` query asks for, after validation."""

    filter: Filter | None
    order_by: tuple[SortField, ...]
    top_n: int | None
    skip_n: int
    batch_size: int

    @property
    def ordered(self) -> bool:
        """Whether results need sorting (OrderBy given, or a window that must be stable)."""
        return bool(self.order_by) or self.top_n is not None

    @property
    def keep(self) -> int | None:
        """How many of a partition's best records can reach the final window."""
        return None if self.top_n is None else self.skip_n + self.top_n


def validate_query(
    *,
    filter: str | None = None,
    order_by: str | None = None,
    top_n: int | None = None,
    skip_n: int | None = None,
    batch_size: int = SERVER_DEFAULT_BATCH_SIZE,
) -> QueryOptions:
    """Check a query's options; raise FilterError or InvalidCommandError naming the problem."""
    if batch_size < 1 or batch_size > MAX_BATCH_SIZE:
        raise InvalidCommandError(
            f"BatchSize {batch_size} is out of range: it must be between 1 and {MAX_BATCH_SIZE}"
        )
    if skip_n is not None and top_n is None:
        raise InvalidCommandError("skip_n requires top_n: give top_n with skip_n")
    if top_n is not None and top_n < 0:
        raise InvalidCommandError(f"top_n must be zero or more, got {top_n}")
    if skip_n is not None and skip_n < 0:
        raise InvalidCommandError(f"skip_n must be zero or more, got {skip_n}")
    return QueryOptions(
        filter=compile_filter(filter) if filter and filter.strip() else None,
        order_by=parse_order_by(order_by) if order_by and order_by.strip() else (),
        top_n=top_n,
        skip_n=skip_n or 0,
        batch_size=batch_size,
    )


def result_order(order_by: Sequence[SortField]) -> Callable[[tuple[str, dict[str, Any]]], Any]:
    """Sort key over ``(sow_key, parsed record)``: the OrderBy fields, then the SowKey.

    With no OrderBy the SowKey alone gives an arbitrary but stable order, so top_n/skip_n pages
    do not shift between queries.
    """
    if not order_by:
        return lambda item: item[0]
    by_fields = sort_key(order_by)
    return lambda item: (by_fields(item[1]), item[0])
