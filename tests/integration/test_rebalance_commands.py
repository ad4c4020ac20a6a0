"""A command a worker reads before a rebalance and handles during it is answered by the owner.

The rebalance is held open through the worker's test gates (sowstream.engine.gates): the first
worker takes the command and waits at the command gate; a second worker joins, and the first
waits at the rebalance gate with its partitions revoked but not yet dropped; only then is the
command handled. It must load nothing and answer nothing there: once the rebalance is over each
partition's owner reads it again and answers it, once.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from sowstream.engine.gates import COMMANDS, HOOKS_ENV, REBALANCE
from tests.support.engine import EngineProcesses
from tests.support.raw import RawClient

pytestmark = pytest.mark.integration

TOPICS: list[dict[str, Any]] = [{"Name": "orders", "Key": ["/id"], "Partitions": 2}]


def wait_for(path: Path, timeout: float, procs: EngineProcesses) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"no {path.name}:\n{procs.log_tail('w1')}"
        time.sleep(0.1)


def test_a_command_handled_during_a_rebalance_is_answered_once_by_each_owner(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    procs = EngineProcesses(kafka_bootstrap, tmp_path, TOPICS)
    try:
        procs.start("w1", env={HOOKS_ENV: str(hooks)})
        procs.wait_ready(["orders"])
        raw = RawClient(procs)
        # The first worker takes the command and is held before handling it.
        (hooks / f"{COMMANDS}.hold").touch()
        cid = raw.command("status", "orders", "ctl.orders", 0)
        raw.command("status", "orders", "ctl.orders", 1, command_id=cid)
        wait_for(hooks / f"{COMMANDS}.waiting", 60, procs)
        # A second worker joins; the first is held inside the rebalance.
        (hooks / f"{REBALANCE}.hold").touch()
        procs.start("w2")
        wait_for(hooks / f"{REBALANCE}.waiting", 120, procs)
        # The command is handled now, with the rebalance running.
        (hooks / f"{COMMANDS}.hold").unlink()
        deadline = time.monotonic() + 20
        log = tmp_path / "w1.log"
        while log.read_text(errors="replace").count(f"command {cid} is left to its owner") < 2:
            if time.monotonic() > deadline:
                break  # the assertions below say what happened instead
            time.sleep(0.1)
        early = raw.replies_within(cid, 1.0)
        (hooks / f"{REBALANCE}.hold").unlink()
        procs.wait_stable(time.monotonic() + 120)
        # Each owner's answer (up to 30 s), then 10 s more in which a second answer would come.
        answers = list(early)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not {0, 1} <= {
            a["partition"] for a in answers if a["command"] == "part_end"
        }:
            answers += raw.replies_within(cid, 0.5)
        answers += raw.replies_within(cid, 10.0)
        raw.close()
    finally:
        procs.stop_all()
    assert early == [], f"answered during the rebalance: {early}"
    ends = Counter(a["partition"] for a in answers if a["command"] == "part_end")
    rows = [a for a in answers if a["command"] == "sow"]
    assert ends == {0: 1, 1: 1}, answers
    workers = {a["partition"]: orjson.loads(a["records"][0]["data"])["worker"] for a in rows}
    assert len(rows) == 2 and set(workers.values()) == {"w1", "w2"}, rows
