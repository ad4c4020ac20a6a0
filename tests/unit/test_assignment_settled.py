"""When a worker's assignment counts as settled, so the router answers commands it reads.

faust resumes the stream flow once the new assignment's recovery is over and ends the rebalance
a few steps later; a command read in between is for a partition this worker now owns. Left
unanswered as "not held", it was lost: the owner had read it already (test_conflation's
worker-killed variant timed out on it under load)."""

from __future__ import annotations

from types import SimpleNamespace

from sowstream.engine.runtime import FaustAssignment


def settled(*, in_recovery: bool, rebalancing: bool, flow_resumed: bool) -> bool:
    app = SimpleNamespace(
        in_recovery=in_recovery, rebalancing=rebalancing, flow_resumed=flow_resumed
    )
    return FaustAssignment(app).settled  # type: ignore[arg-type]


def test_a_rebalance_is_unsettled_until_the_flow_resumes() -> None:
    assert not settled(in_recovery=False, rebalancing=True, flow_resumed=False)
    assert not settled(in_recovery=True, rebalancing=True, flow_resumed=False)
    assert settled(in_recovery=False, rebalancing=True, flow_resumed=True)


def test_recovery_is_never_settled_and_quiet_times_are() -> None:
    assert not settled(in_recovery=True, rebalancing=False, flow_resumed=True)
    assert settled(in_recovery=False, rebalancing=False, flow_resumed=False)
