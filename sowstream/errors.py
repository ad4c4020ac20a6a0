"""The exceptions sowstream raises: one hierarchy, so callers can catch broadly or precisely."""

from __future__ import annotations


class SowstreamError(Exception):
    """Base class of every error sowstream raises on purpose."""


class InvalidMessageError(SowstreamError):
    """A message could not be used: malformed JSON, a missing key field, a bad SowKey.

    ``topic`` names the SOW topic and ``reason`` is the machine-readable code that also travels
    in dead-letter records and failed acks.
    """

    def __init__(self, message: str, *, topic: str = "", reason: str = "invalid_message") -> None:
        super().__init__(message)
        self.topic = topic
        self.reason = reason


class WireFormatError(SowstreamError, ValueError):
    """Bytes that are not a record of the Avro schema they should be (random, cut or damaged):
    one error for whatever the decoder tripped on, so every reader can skip them alike."""


class UnknownTopicError(SowstreamError):
    """The command names a topic that has no SOW definition (and so cannot be queried)."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"unknown topic {topic!r}: no SOW topic of that name is defined")
        self.topic = topic


class InvalidCommandError(SowstreamError):
    """A command's options are wrong (BatchSize over the limit, skip_n without top_n, ...)."""


class AuthenticationError(SowstreamError):
    """A credential is missing, malformed, expired or does not verify; ``str()`` says which.

    ``reason`` is ``authentication_failed``, or ``not_entitled`` when the credential is valid
    but belongs to another identity than the one claimed.
    """

    def __init__(self, message: str, *, reason: str = "authentication_failed") -> None:
        super().__init__(message)
        self.reason = reason


class CommandFailedError(SowstreamError):
    """The engine rejected a command; ``reason`` is its code and ``str()`` its explanation."""

    def __init__(self, message: str, *, reason: str = "failed", command_id: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.command_id = command_id


class CorruptReplyError(SowstreamError):
    """A reply from the engine could not be read (e.g. a truncated or malformed raw batch)."""


class CommandTimeoutError(SowstreamError, TimeoutError):
    """No complete answer arrived in time, e.g. because no worker owns some partitions."""


class StateStoreError(SowstreamError):
    """The local RocksDB state could not be opened or written."""


class BrokerError(SowstreamError):
    """The embedded local Kafka broker could not be provisioned, started or stopped."""


class KafkaUnreachableError(SowstreamError):
    """No broker of the bootstrap list answered."""


class SubscriptionDroppedError(SowstreamError):
    """The engine ended a subscription, e.g. because its client fell too far behind."""


class PipelineError(SowstreamError):
    """A data-pipeline job cannot run: broker unreachable, log missing, records aged out."""


class SchemaVersionError(SowstreamError):
    """A record written with a protocol schema version the reader does not accept."""

    def __init__(self, message: str, *, written: int | None, accepted: tuple[int, int]) -> None:
        super().__init__(message)
        self.written = written
        self.accepted = accepted
