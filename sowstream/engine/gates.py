"""Gates a test can hold a running worker at, to make its interleaving with a rebalance exact.

Some behaviour depends on what a worker does *while* a rebalance runs (a command read before it
and handled during it). A test of it with real worker processes cannot rely on timing, so the
worker passes named gates at those points: with the environment variable ``SOWSTREAM_TEST_HOOKS``
naming a directory, a worker reaching gate ``NAME`` while ``NAME.hold`` exists there writes
``NAME.waiting`` and waits until the hold file is removed. Without the variable every gate is
open and costs one attribute test.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

log = logging.getLogger("sowstream.engine")

HOOKS_ENV = "SOWSTREAM_TEST_HOOKS"
POLL_SECONDS = 0.05

# The gates a worker passes.
COMMANDS = "commands"  # a batch of control-topic records taken, before it is handled
REBALANCE = "rebalance"  # partitions revoked, before the units drop them


class Gates:
    """The worker's gates; open unless a directory for their files is given."""

    def __init__(self, directory: Path | None = None) -> None:
        self._dir = directory

    @classmethod
    def from_environment(cls) -> Gates:
        """The gates as ``SOWSTREAM_TEST_HOOKS`` sets them (all open without it)."""
        path = os.environ.get(HOOKS_ENV)
        return cls(Path(path) if path else None)

    async def passing(self, name: str) -> None:
        """Wait at gate ``name`` while the test holds it."""
        if self._dir is None:
            return
        hold = self._dir / f"{name}.hold"
        if not hold.exists():
            return
        log.info("held at gate %s", name)
        (self._dir / f"{name}.waiting").touch()
        while hold.exists():
            await asyncio.sleep(POLL_SECONDS)
        log.info("gate %s released", name)
