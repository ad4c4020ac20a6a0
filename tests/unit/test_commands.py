"""Control-topic command batches: runs keep the order, a batch takes only what has arrived."""

from __future__ import annotations

import asyncio
import itertools

from hypothesis import given
from hypothesis import strategies as st

from sowstream.engine.commands import CommandInbox, runs


def test_consecutive_items_run_together_and_others_stay_alone_in_order() -> None:
    items = ["ack1", "ack2", "sow", "ack3", "sub", "sub", "ack4", "ack5"]
    out = runs(items, lambda item: item.startswith("ack"))
    assert [(r.together, r.items) for r in out] == [
        (True, ["ack1", "ack2"]),
        (False, ["sow"]),
        (True, ["ack3"]),
        (False, ["sub"]),
        (False, ["sub"]),
        (True, ["ack4", "ack5"]),
    ]


@given(st.lists(st.booleans(), max_size=40))
def test_runs_cover_every_item_once_in_order(flags: list[bool]) -> None:
    items = list(enumerate(flags))
    out = runs(items, lambda item: item[1])
    assert [item for run in out for item in run.items] == items
    for run in out:
        assert all(flag == run.together for _, flag in run.items)
        assert run.together or len(run.items) == 1
    for a, b in itertools.pairwise(out):
        assert not (a.together and b.together)  # runs are maximal


def test_a_batch_is_what_has_arrived_up_to_the_limit() -> None:
    async def scenario() -> tuple[list[int], list[int], list[int]]:
        inbox = CommandInbox(size=10)
        for n in range(5):
            await inbox.put("stream", n)
        first = [event for _, event in await inbox.take(limit=3)]
        second = [event for _, event in await inbox.take(limit=3)]
        # An empty inbox: take waits for the next record and returns it alone.
        waiting = asyncio.ensure_future(inbox.take(limit=3))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        await inbox.put("stream", 9)
        third = [event for _, event in await waiting]
        return first, second, third

    assert asyncio.run(scenario()) == ([0, 1, 2], [3, 4], [9])
