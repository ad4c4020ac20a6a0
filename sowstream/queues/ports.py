"""What the queue state machine reads of a queue's definition, as a port.

:class:`QueueRules` names the leasing, ordering and expiry settings of one queue;
``sowstream.config.queues.QueueConfig`` satisfies it structurally, so ``config`` sits above
``queues``. Members are read-only properties so that a frozen model's fields fit them.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["QueueRules"]


class QueueRules(Protocol):
    """One queue's rules as :class:`~sowstream.queues.machine.QueueMachine` applies them."""

    @property
    def filter(self) -> str | None:
        """What messages the queue takes (a filter text; None: all)."""
        ...

    @property
    def barrier_expression(self) -> str | None: ...

    @property
    def priority(self) -> str | None:
        """A value expression ordering the available messages (None: log order)."""
        ...

    @property
    def semantics(self) -> str:
        """``at-least-once`` or ``at-most-once``."""
        ...

    @property
    def fairness_model(self) -> str:
        """``fast``, ``round-robin`` or ``proportional``."""
        ...

    @property
    def leasing(self) -> str:
        """``strict`` or ``sublet``."""
        ...

    @property
    def lease_period_ms(self) -> int | None: ...

    @property
    def expiration_ms(self) -> int | None: ...

    @property
    def expiration_model(self) -> str:
        """How a message's own expiration and ``expiration_ms`` combine: ``default``,
        ``queue``, ``latest`` or ``earliest`` (see ``machine.message_lifetime``)."""
        ...

    @property
    def deferred_ack_expiration_ms(self) -> int: ...

    @property
    def max_backlog(self) -> int | None: ...

    @property
    def max_per_subscription_backlog(self) -> int: ...

    @property
    def target_queue_depth(self) -> int | None: ...

    @property
    def max_deliveries(self) -> int:
        """Deliveries after which a message expires (0: no limit)."""
        ...

    @property
    def max_cancels(self) -> int:
        """Cancelled leases after which a message expires (0: no limit)."""
        ...
