"""The sowstream web console: topics, queries, live grids, views and the fleet in a browser."""

from sowstream.console.auth import Auth
from sowstream.console.server import Console, Settings

__all__ = ["Auth", "Console", "Settings"]
