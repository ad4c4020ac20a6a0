"""A revocation flushes the producers; replies to a reply topic that is gone never complete, and
an unbounded flush held the revocation until the worker fell out of its group (a chaos run)."""

from __future__ import annotations

import asyncio

from sowstream.engine.runtime import bounded_flush


def test_a_flush_that_never_ends_is_left_after_its_bound() -> None:
    async def never() -> None:
        await asyncio.Event().wait()

    async def scenario() -> tuple[bool, float]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        done = await bounded_flush(never, "replies", 0.05)
        return done, loop.time() - started

    done, took = asyncio.run(scenario())
    assert not done and took < 1.0


def test_a_flush_that_ends_in_time_is_waited_for() -> None:
    flushed: list[bool] = []

    async def quick() -> None:
        await asyncio.sleep(0.01)
        flushed.append(True)

    assert asyncio.run(bounded_flush(quick, "replies", 5.0)) is True
    assert flushed == [True]
