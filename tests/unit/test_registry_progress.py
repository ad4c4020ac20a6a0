"""A placement waits until the worker has read the registration it follows, so a removal of the
same key read after it cannot end it (issue 26: a resumed subscriber missed a publish)."""

from __future__ import annotations

import asyncio

from sowstream.engine.registry import RegistryProgress


def test_a_placement_waits_for_its_registration_then_goes_ahead() -> None:
    async def scenario() -> list[str]:
        progress = RegistryProgress()
        seen: list[str] = []

        async def place() -> None:
            assert await progress.wait_past(41, timeout=5)
            seen.append("placed")

        task = asyncio.create_task(place())
        await asyncio.sleep(0.01)
        progress.advance(30)  # the removal the engine wrote, read; not yet the registration
        await asyncio.sleep(0.01)
        seen.append("removal read")
        progress.advance(42)  # the registration at offset 41 read
        await task
        return seen

    assert asyncio.run(scenario()) == ["removal read", "placed"]


def test_a_registry_that_stays_behind_lets_the_placement_go_after_the_wait() -> None:
    async def scenario() -> tuple[bool, bool]:
        progress = RegistryProgress()
        progress.advance(10)
        already = await progress.wait_past(9, timeout=0.05)
        late = await progress.wait_past(10, timeout=0.05)
        return already, late

    assert asyncio.run(scenario()) == (True, False)
