"""Reading what clients see in tests: the next n messages of a subscription (or fail saying how
many came), every message within a time, a topic's records by SowKey, and polling until a read
gives what is expected (views and conflated topics follow their topics asynchronously)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sowstream.client import Client, Message, QueueSubscription, Subscription


def take(sub: Subscription | QueueSubscription, n: int, timeout: float = 20.0) -> list[Message]:
    """The next ``n`` messages, failing if they do not come in time."""
    out: list[Message] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"only {len(out)} of {n} messages arrived: {out}"
        msg = sub.next(timeout=remaining)
        if msg is not None:
            out.append(msg)
    return out


def drain(sub: Subscription | QueueSubscription, seconds: float) -> list[Message]:
    """Every message arriving within ``seconds``."""
    out: list[Message] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        msg = sub.next(timeout=left)
        if msg is not None:
            out.append(msg)
    return out


def by_sow_key(client: Client, topic: str) -> dict[str, dict[str, Any]]:
    """The topic's records as a ``sow`` query returns them, by SowKey."""
    return {m.sow_key: m.json() for m in client.sow(topic) if m.command == "sow"}


def eventually(
    read: Callable[[], Any], expected: Any, timeout: float = 30.0, interval: float = 0.2
) -> None:
    """Poll ``read()`` until it equals ``expected``; fail with the last value after ``timeout``."""
    deadline = time.monotonic() + timeout
    got = read()
    while got != expected and time.monotonic() < deadline:
        time.sleep(interval)
        got = read()
    assert got == expected
