"""When the engine takes a silent client for gone (``slow_consumer.client_timeout``)."""

from __future__ import annotations

from sowstream.engine.slow import taken_for_gone

TIMEOUT = 6_000


def test_silent_past_the_timeout_is_gone_and_a_recent_heartbeat_is_not() -> None:
    assert taken_for_gone(beat=0, ended=None, now=6_001, grace_until=0, timeout=TIMEOUT)
    assert not taken_for_gone(beat=0, ended=None, now=6_000, grace_until=0, timeout=TIMEOUT)


def test_nobody_is_gone_during_the_grace_after_a_broker_restart() -> None:
    assert not taken_for_gone(beat=0, ended=None, now=20_000, grace_until=20_000, timeout=TIMEOUT)
    assert taken_for_gone(beat=0, ended=None, now=20_001, grace_until=20_000, timeout=TIMEOUT)


def test_a_client_just_ended_gets_a_whole_timeout_to_place_again_and_heartbeat() -> None:
    """Found by the chaos run: its old heartbeat ended the re-placed subscriptions at once,
    again and again, until the client's next heartbeat landed."""
    ended = 30_000
    assert not taken_for_gone(beat=0, ended=ended, now=ended + 1, grace_until=0, timeout=TIMEOUT)
    assert not taken_for_gone(
        beat=0, ended=ended, now=ended + TIMEOUT, grace_until=0, timeout=TIMEOUT
    )
    assert taken_for_gone(
        beat=0, ended=ended, now=ended + TIMEOUT + 1, grace_until=0, timeout=TIMEOUT
    )
