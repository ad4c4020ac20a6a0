"""When a worker's assignment counts as settled: loads, commands and answers wait for it.

faust resumes the stream flow once the new assignment's recovery is over and ends the rebalance
a few steps later; a command read in between is for a partition this worker now owns. Left
unanswered as "not held", it was lost: the owner had read it already (test_conflation's
worker-killed variant timed out on it under load). And a recovery of the assignment just revoked
can finish after the revocation: the worker must not look settled until its next assignment is
recovered (a chaos run saw a queue partition loaded from a store not restored yet)."""

from __future__ import annotations

from types import SimpleNamespace

from sowstream.engine.runtime import AssignmentProgress, FaustAssignment


def settled(progress: AssignmentProgress, *, in_recovery: bool = False) -> bool:
    app = SimpleNamespace(in_recovery=in_recovery, progress=progress)
    return FaustAssignment(app).settled  # type: ignore[arg-type]


def test_a_rebalance_is_unsettled_until_its_assignment_is_recovered() -> None:
    progress = AssignmentProgress()
    assert not settled(progress)  # nothing assigned yet
    progress.revoked()
    assert not settled(progress)
    progress.assignment()
    assert not settled(progress)
    progress.resumed()  # faust resumes the flow as the restore starts ...
    assert not settled(progress, in_recovery=True)
    assert settled(progress)  # ... and once it is over, before it ends the rebalance


def test_a_late_recovery_of_the_revoked_assignment_settles_nothing() -> None:
    progress = AssignmentProgress()
    progress.revoked()
    progress.assignment()
    progress.resumed()
    assert settled(progress)
    progress.revoked()  # the next rebalance begins
    progress.resumed()  # the previous assignment's recovery finishes only now
    assert not settled(progress)
    progress.assignment()  # the new assignment arrives: its stores are not restored yet
    assert not settled(progress)
    progress.resumed()
    assert settled(progress)
