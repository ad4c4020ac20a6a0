"""Recovery seeks each changelog partition to where its store stands; one whose offset could not
be learnt (the broker was restarting) crashed the recovery and stopped a worker (a chaos run)."""

from __future__ import annotations

from faust.types import TP

from sowstream.engine.runtime_restore import seekable


def test_unknown_offsets_read_the_changelog_from_its_start() -> None:
    a, b, c, d = (TP("t-changelog", p) for p in range(4))
    offsets = {a: 41, b: None, c: -1, d: -7}
    assert dict(seekable(offsets, {a, b, c, d})) == {a: 41, b: -1, c: -1, d: -1}
    # faust's own step then turns -1 into 0: every offset it seeks to is one aiokafka takes.
