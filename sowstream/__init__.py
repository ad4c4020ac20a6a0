"""sowstream: State-of-the-World messaging on Apache Kafka.

The public surface is the :class:`Client`, its :class:`Command`, :class:`Message` and
:class:`Subscription` types, :class:`SubscriptionOptions` and the exception hierarchy rooted at
:class:`SowstreamError`.
"""

from sowstream.client import Client, Command, Message, Subscription
from sowstream.errors import (
    CommandFailedError,
    CommandTimeoutError,
    InvalidCommandError,
    InvalidMessageError,
    SowstreamError,
    StateStoreError,
    SubscriptionDroppedError,
    UnknownTopicError,
)
from sowstream.filters import FilterError
from sowstream.subscriptions.options import SubscriptionOptions

__version__ = "0.1.0"

__all__ = [
    "Client",
    "Command",
    "CommandFailedError",
    "CommandTimeoutError",
    "FilterError",
    "InvalidCommandError",
    "InvalidMessageError",
    "Message",
    "SowstreamError",
    "StateStoreError",
    "Subscription",
    "SubscriptionDroppedError",
    "SubscriptionOptions",
    "UnknownTopicError",
]
