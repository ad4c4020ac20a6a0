"""Views as tests define them (YAML-shaped dicts) and their reference: a recomputation from the
underlying SOW."""

from __future__ import annotations

from typing import Any

from sowstream.client import Client
from sowstream.config.views import ViewConfig
from sowstream.views.maintainer import ViewMaintainer


def view_config(view: dict[str, Any]) -> ViewConfig:
    """A view of this file's YAML-shaped definitions as the engine reads it."""
    underlying = view["UnderlyingTopic"]
    return ViewConfig(
        name=view["Name"],
        underlying_topic=underlying if isinstance(underlying, str) else None,
        joins=tuple(underlying["Join"]) if isinstance(underlying, dict) else (),
        projection=tuple(view["Projection"]),
        grouping=tuple(view["Grouping"]),
        filter=view.get("Filter"),
    )


def recomputed(client: Client, view: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The view computed from scratch (ViewMaintainer.recompute) from the underlying SOW.

    Each record's position is its log time: fields shown from a group's last processed row
    then agree with the engine wherever that row is not a tie within one millisecond.
    """
    config = view_config(view)
    state = {
        topic: {m.sow_key: (m.json(), m.timestamp) for m in client.sow(topic) if m.command == "sow"}
        for topic in config.underlying_names
    }
    return ViewMaintainer(config).recompute(state)
