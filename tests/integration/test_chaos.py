"""The short variant of ``make chaos``: one run of the whole engine under load while workers are
SIGKILLed, the broker restarts, a client process is killed and another paused (see
tests/support/chaos.py for what is checked)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.support.chaos import run

pytestmark = pytest.mark.integration


def test_a_short_chaos_run_loses_nothing(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    report = run(tmp_path, seconds=45, seed=seed)
    story = "\n".join(report.events)
    assert report.published > 300, f"seed {seed}: too little load\n{story}"
    assert not report.problems, f"seed {seed}:\n{story}\n" + "\n".join(report.problems)
