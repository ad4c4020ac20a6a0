"""Kafka header names on transaction-log records, so a plain Kafka producer can speak to the engine.

A log record's value is the message body (JSON); everything else travels in these headers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

# publish (default) | delta_publish | sow_delete | sow_expire; on replies: publish | oof
COMMAND = "sow.cmd"
SOW_KEY = "sow.key"  # SowKey for topics whose publishers supply keys, when the record has no key
EXPIRATION = "sow.expiration"  # per-message expiration in seconds; 0 = never
FILTER = "sow.filter"  # sow_delete by content filter (partition-scoped: send one per partition)
REPLY_TO = "sow.reply_to"  # reply topic for the processed ack
COMMAND_ID = "sow.cmd_id"  # correlates the ack with the command
VIEW = "sow.view"  # on a view's log: the view whose maintainer wrote the record (only it may)
ORIGIN = "sow.origin"  # "partition:offset" of the unkeyed record this keyed copy came from
IDENTITY = "sow.identity"  # the publisher's identity, for publish entitlements
# The record's credential (sowstream.auth): on commands, registrations and publishes.
CREDENTIAL = "sow.credential"
# Set by the worker itself on a log record whose credential it refused ("<reason> <message>"):
# the fold dead-letters the record with that reason.
REFUSED = "sow.refused"
# On Command, Reply and Subscription records: the protocol schema version their Avro value was
# written with (sowstream.wire.versions); absent means version 1.
SCHEMA = "sow.schema"

# Live subscription messages on a reply topic: the value is the JSON body, the rest is here, so a
# plain Kafka consumer can read a subscription. Engine replies (Avro) carry no sow.cmd header.
SUB_ID = "sow.sub_id"  # the subscription (SubId) the message is for
TOPIC = "sow.topic"  # SOW topic name
REASON = "sow.reason"  # oof reason: deleted | expired | match | entitlement
PARTITION = "sow.partition"  # log partition of the change
OFFSET = "sow.offset"  # log offset of the change: with partition, the sequence for de-duplication
TIMESTAMP = "sow.timestamp"  # log timestamp (ms) of the change
SEQ = "sow.seq"  # with sow.offset, orders messages one operation produced several of (default 0)
DELTA = "sow.delta"  # "1" when the body holds only the changed fields
# Queue deliveries (a leased message): what to acknowledge it with and how long the lease runs.
BOOKMARK = "sow.bookmark"  # "topic|partition|offset" of the publish the message is
DELIVERIES = "sow.deliveries"  # how many times the message has been leased, this one included
LEASE = "sow.lease"  # when the lease ends (epoch ms); absent for a lease that never ends
# On a queue registration: the lease-batch layout the client reads (wire.leases), asking for
# a pass's deliveries in one record. A header: older workers ignore it, where they refuse an
# option string entry they do not know.
PACKED = "sow.packed"
# The engine's acknowledgement of a queue subscription (sow.cmd = ack): its kind, and the
# options it reports back, as AMPS's ack ``opts`` (``max_backlog=<n>``: the effective backlog).
ACK_TYPE = "sow.ack_type"
OPTIONS = "sow.options"

PUBLISH = "publish"
DELTA_PUBLISH = "delta_publish"
SOW_DELETE = "sow_delete"
# Written by the engine's expiry sweep: remove the record if its expiration is still ``sow.due``
# (epoch ms). Logged rather than applied on the spot, so every owner of the partition meets the
# expiry at the same log position.
SOW_EXPIRE = "sow_expire"
DUE = "sow.due"
LOG_COMMANDS = frozenset({PUBLISH, DELTA_PUBLISH, SOW_DELETE, SOW_EXPIRE})
PUBLISHES = frozenset({PUBLISH, DELTA_PUBLISH})  # the commands that carry a message
# On <prefix>.ctl-auto: a client asks for a topic in no configuration (created on first use).
DECLARE_TOPIC = "declare_topic"

RawHeaders = Sequence[tuple[str, bytes | None]] | None


def header_map(headers: RawHeaders) -> dict[str, str]:
    """Kafka headers as a ``str -> str`` dict (last one wins; undecodable bytes are replaced)."""
    if not headers:
        return {}
    return {k: (v.decode("utf-8", "replace") if v is not None else "") for k, v in headers}


def to_kafka_headers(values: dict[str, str | None]) -> list[tuple[str, bytes]]:
    """A header dict as Kafka's list of pairs, dropping unset values."""
    return [(k, v.encode()) for k, v in values.items() if v is not None]


def pairs(headers: Iterable[tuple[str, bytes | None]] | None) -> list[tuple[str, bytes]]:
    """Normalise whatever a Kafka client returned for headers into ``[(name, bytes)]``."""
    return [(k, v or b"") for k, v in (headers or [])]
