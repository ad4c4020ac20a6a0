"""What views and conflated topics read of their definitions, as ports.

The maintainer, the feeds and the routing need a few fields of a view or conflated topic
definition and its compiled form; these protocols name only those, and the pydantic models of
``sowstream.config`` (``ViewConfig``, ``ConflatedTopicConfig``) satisfy them structurally, so
``config`` sits above ``views``. :class:`CompiledView` is what a definition compiles to.
"""

from __future__ import annotations

from typing import Protocol

from sowstream.views.joins import PRESERVE, JoinPlan, Side
from sowstream.views.projection import JoinCondition, ViewProjection

__all__ = ["CompiledView", "ConflatedDefinition", "ViewDefinition"]


class CompiledView:
    """What the maintainer runs: the join plan (None for one topic) and the projection."""

    def __init__(self, plan: JoinPlan | None, projection: ViewProjection) -> None:
        self.plan = plan
        self.projection = projection


class ViewDefinition(Protocol):
    """One view as its maintainer, feeds and routing read it."""

    @property
    def name(self) -> str: ...

    @property
    def partitions(self) -> int:
        """The view's own log, table and input topic."""
        ...

    @property
    def underlying_topic(self) -> str | None:
        """The single topic read; None for a join view."""
        ...

    @property
    def effective_key_domain(self) -> str: ...

    @property
    def join_null_equivalency(self) -> bool: ...

    @property
    def join_conditions(self) -> tuple[JoinCondition, ...]: ...

    def compile(self, preserve: Side = PRESERVE) -> CompiledView:
        """The join plan and compiled projection."""
        ...


class ConflatedDefinition(Protocol):
    """One conflated topic as its feed reads it."""

    @property
    def underlying_topic(self) -> str: ...

    @property
    def partitions(self) -> int: ...

    @property
    def filter(self) -> str | None: ...
