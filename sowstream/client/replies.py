"""Where the client's reader thread parks engine replies until the command's caller reads them.

Some replies are never read: a duplicate answer after a rebalance arriving once the caller has
its count, the rest of an answer whose first part failed, answers to a command that timed out.
Parking those forever made a long-lived client grow without bound, so a command's replies that
nobody took for ``keep_s`` seconds are dropped (its caller gave up long before).
"""

from __future__ import annotations

from collections import deque

from sowstream.wire.protocol import Reply

__all__ = ["ReplyBox"]

# Purge at most this often: the sweep walks every parked command.
_SWEEP_EVERY_S = 1.0


class ReplyBox:
    """Replies per command id, oldest first; not thread-safe (the client holds its lock)."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self._replies: dict[str, deque[Reply]] = {}
        self._touched: dict[str, float] = {}
        self._swept = 0.0

    def __len__(self) -> int:
        """How many commands have replies parked."""
        return len(self._replies)

    def park(self, reply: Reply, now: float) -> None:
        """Keep ``reply`` for its command; sweep out what waited longer than ``keep_s``."""
        command_id = reply.command_id
        self._replies.setdefault(command_id, deque()).append(reply)
        self._touched[command_id] = now
        if now - self._swept >= _SWEEP_EVERY_S:
            self._swept = now
            stale = [c for c, at in self._touched.items() if now - at > self.keep_s]
            for gone in stale:
                del self._replies[gone], self._touched[gone]

    def has(self, command_id: str) -> bool:
        """Whether a reply for ``command_id`` is waiting."""
        return command_id in self._replies

    def take(self, command_id: str, now: float) -> Reply | None:
        """The oldest parked reply of ``command_id``, or None."""
        queue = self._replies.get(command_id)
        if not queue:
            return None
        reply = queue.popleft()
        if queue:
            self._touched[command_id] = now
        else:
            del self._replies[command_id], self._touched[command_id]
        return reply
