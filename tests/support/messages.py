"""Reading a subscription in tests: the next n messages, or fail saying how many came."""

from __future__ import annotations

import time

from sowstream.client import Message, QueueSubscription, Subscription


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
