"""Fencing answers by group membership: is the consumer group still where it was?

A worker that fell out of its group (a rebalance it missed, a session that timed out) can go
on serving a partition another worker has taken. What it writes then lands in the changelog
after the new owner restored it, so no owner ever reads it: an acknowledgement it answers is
lost. Before a queue acknowledgement is answered, the group's coordinator is asked whether the
generation the partition was held under is still the group's; a new generation is formed only
after that answer, so the new owner's restore includes every write acknowledged before it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("sowstream.engine")

# A probe sends one request to the coordinator: True when ``generation`` is still current.
Probe = Callable[[int], Awaitable[bool]]


class GroupCheck:
    """Generation checks, shared: every caller waits for a probe sent after it asked, so many
    answers waiting at once cost one round trip."""

    def __init__(self, probe: Probe) -> None:
        self._probe = probe
        self._waiting: dict[int, asyncio.Future[bool]] = {}
        self._running: dict[int, asyncio.Task[None]] = {}

    async def still_current(self, generation: int) -> bool:
        """Whether the group is still at ``generation`` with this worker in it, asked now."""
        if generation < 0:
            return False
        waiting = self._waiting.get(generation)
        if waiting is None:
            waiting = self._waiting[generation] = asyncio.get_running_loop().create_future()
            if generation not in self._running:
                self._running[generation] = asyncio.create_task(self._run(generation))
        return await asyncio.shield(waiting)

    async def _run(self, generation: int) -> None:
        # A probe already on its way may have been sent before a later caller's writes were
        # acknowledged: those wait for the next one.
        try:
            while (waiting := self._waiting.pop(generation, None)) is not None:
                try:
                    current = await self._probe(generation)
                except Exception as exc:  # an answer we cannot have is no confirmation
                    log.warning("group generation %d could not be confirmed: %s", generation, exc)
                    current = False
                waiting.set_result(current)
        finally:
            self._running.pop(generation, None)
