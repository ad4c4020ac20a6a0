"""GroupCheck: generation checks shared by the answers waiting at once, never one sent before."""

from __future__ import annotations

import asyncio

from sowstream.engine.fence import GroupCheck


async def settle() -> None:
    """Let every ready task run to its next wait."""
    for _ in range(5):
        await asyncio.sleep(0)


class Coordinator:
    """Answers probes when told, recording each; the group is at ``generation``."""

    def __init__(self, generation: int) -> None:
        self.generation = generation
        self.probes: list[int] = []
        self.release = asyncio.Event()

    async def probe(self, generation: int) -> bool:
        self.probes.append(generation)
        await self.release.wait()
        self.release.clear()
        return generation == self.generation


def test_callers_waiting_together_share_one_probe_and_a_later_one_waits_for_the_next() -> None:
    async def scenario() -> tuple[list[bool], bool, list[int]]:
        group = Coordinator(generation=3)
        check = GroupCheck(group.probe)
        first = [asyncio.create_task(check.still_current(3)) for _ in range(5)]
        await settle()
        assert group.probes == [3]  # one probe on its way
        late = asyncio.create_task(check.still_current(3))
        await settle()
        group.release.set()
        answers = await asyncio.gather(*first)
        await settle()
        # The late caller asked after the first probe left: it needs a probe of its own.
        assert not late.done()
        group.generation = 4  # the group moved on meanwhile
        group.release.set()
        return answers, await late, group.probes

    answers, late, probes = asyncio.run(scenario())
    assert answers == [True] * 5
    assert late is False
    assert probes == [3, 3]


def test_a_failing_probe_and_no_generation_confirm_nothing() -> None:
    async def failing(generation: int) -> bool:
        raise ConnectionError("coordinator unreachable")

    async def scenario() -> tuple[bool, bool]:
        check = GroupCheck(failing)
        return await check.still_current(2), await check.still_current(-1)

    assert asyncio.run(scenario()) == (False, False)
