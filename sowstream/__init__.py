"""sowstream: State-of-the-World messaging on Apache Kafka.

The public surface is the :class:`Client`, its :class:`Command` and :class:`Message` types and the
exception hierarchy rooted at :class:`SowstreamError`.
"""

from sowstream.client import Client, Command, Message
from sowstream.errors import (
    CommandFailedError,
    CommandTimeoutError,
    InvalidCommandError,
    InvalidMessageError,
    SowstreamError,
    StateStoreError,
    UnknownTopicError,
)
from sowstream.filters import FilterError

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
    "UnknownTopicError",
]
