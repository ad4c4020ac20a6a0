"""The control protocol as typed messages: a :class:`Command` to the engine, a :class:`Reply` back.

Both are read from and written to Avro once, here, with the schemas in ``schemas/``; everything
past the edge works with attributes that mypy checks instead of string keys. The field names,
types and defaults are the schemas' own (``tests/unit/test_protocol.py`` holds the two together).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from operator import itemgetter
from typing import Any, NamedTuple

from sowstream.wire.avro import encode
from sowstream.wire.versions import PROTOCOL_VERSION, decode_versioned

# Reply.command values (the client's reply reader dispatches on them).
SOW = "sow"  # a batch of records of a partition's answer
SOW_RAW = "sow_raw"  # the same as one raw batch (wire.rawscan), for commands that ask for it
PART_END = "part_end"  # one partition finished a command
PARTIAL = "partial"  # partial aggregates of one partition
ACK = "ack"  # a publish, delete or queue acknowledgement was processed
SUCCESS = "success"
FAILURE = "failure"
# The option naming, in a command about a queue, which of its topics the command is for: needed
# on the control topic topics created on first use share (a declared topic's is its own).
UNDERLYING = "underlying"
# The option of a subscription's placement naming the registry offset of its registration: the
# worker reads the registry that far before placing it.
REGISTRY_OFFSET = "registry_offset"


@dataclass(frozen=True, slots=True)
class Command:
    """A request to the engine on a control topic; one copy goes to each partition it concerns."""

    command: str
    command_id: str
    query_id: str
    reply_to: str
    topic: str
    filter: str | None = None
    sow_keys: tuple[str, ...] | None = None
    order_by: str | None = None
    top_n: int | None = None
    skip_n: int | None = None
    batch_size: int = 1
    after_offset: int = -1
    options: Mapping[str, str] = field(default_factory=dict)
    sub_id: str = ""
    identity: str = ""
    sub_options: str = ""
    previous_filter: str | None = None
    message_type: str = "json"
    topic_regex: str | None = None

    def option(self, name: str, default: str | None = None) -> str | None:
        """One of the AMPS-style ``options`` (``bookmark``, ``grouping``, ``ack_type``...)."""
        return self.options.get(name, default)

    def with_(self, **changes: Any) -> Command:
        """A copy with ``changes`` (a command is frozen)."""
        return replace(self, **changes)

    def encode(self) -> bytes:
        """The command as the Avro record a control topic carries."""
        record = asdict(self)
        if self.sow_keys is not None:
            record["sow_keys"] = list(self.sow_keys)
        record["options"] = dict(self.options)
        return encode("Command", record)

    @classmethod
    def decode(cls, payload: bytes, version: int = PROTOCOL_VERSION) -> Command:
        """Read a control-topic record written with schema version ``version`` (its
        ``sow.schema`` header); raises what fastavro raises on a bad one."""
        r = decode_versioned("Command", payload, version)
        keys = r["sow_keys"]
        return cls(
            command=r["command"],
            command_id=r["command_id"],
            query_id=r["query_id"],
            reply_to=r["reply_to"],
            topic=r["topic"],
            filter=r["filter"],
            sow_keys=tuple(keys) if keys is not None else None,
            order_by=r["order_by"],
            top_n=r["top_n"],
            skip_n=r["skip_n"],
            batch_size=r["batch_size"],
            after_offset=r["after_offset"],
            options=r["options"],
            sub_id=r["sub_id"],
            identity=r["identity"],
            sub_options=r["sub_options"],
            previous_filter=r["previous_filter"],
            message_type=r["message_type"],
            topic_regex=r["topic_regex"],
        )


class ReplyRecord(NamedTuple):
    """One record of a reply batch: a stored body with where it came from."""

    sow_key: str
    data: bytes
    timestamp: int  # log time (ms) of the record's last update
    log_offset: int
    sort_rank: int = 0  # position within the partition's ordered answer
    topic: str = ""  # on a Pattern topic, the name the record was published under


_RECORD_FIELDS = itemgetter(*ReplyRecord._fields)


@dataclass(frozen=True, slots=True)
class Reply:
    """A message from the engine on a client's reply topic."""

    command: str
    command_id: str
    query_id: str = ""
    topic: str = ""
    partition: int = -1
    partitions: int = 0
    status: str = SUCCESS
    reason: str = ""
    message: str = ""
    count: int = 0
    answer_id: str = ""
    log_offset: int = -1
    records: Sequence[ReplyRecord] = ()

    @property
    def failed(self) -> bool:
        return self.status == FAILURE

    def with_(self, **changes: Any) -> Reply:
        """A copy with ``changes`` (a reply is frozen)."""
        return replace(self, **changes)

    def encode(self) -> bytes:
        """The reply as the Avro record a reply topic carries."""
        return encode(
            "Reply",
            {
                "command": self.command,
                "command_id": self.command_id,
                "query_id": self.query_id,
                "topic": self.topic,
                "partition": self.partition,
                "partitions": self.partitions,
                "status": self.status,
                "reason": self.reason,
                "message": self.message,
                "count": self.count,
                "answer_id": self.answer_id,
                "log_offset": self.log_offset,
                # Built here rather than by the caller: a scan sends many records per reply.
                "records": [
                    {
                        "sow_key": r.sow_key,
                        "data": r.data,
                        "timestamp": r.timestamp,
                        "log_offset": r.log_offset,
                        "sort_rank": r.sort_rank,
                        "topic": r.topic,
                    }
                    for r in self.records
                ],
            },
        )

    @classmethod
    def decode(cls, payload: bytes, version: int = PROTOCOL_VERSION) -> Reply:
        """Read a reply-topic record written with version ``version`` of the Reply schema."""
        r = decode_versioned("Reply", payload, version)
        return cls(
            command=r["command"],
            command_id=r["command_id"],
            query_id=r["query_id"],
            topic=r["topic"],
            partition=r["partition"],
            partitions=r["partitions"],
            status=r["status"],
            reason=r["reason"],
            message=r["message"],
            count=r["count"],
            answer_id=r["answer_id"],
            log_offset=r["log_offset"],
            # itemgetter and _make: less Python per record, and a scan decodes many records.
            records=list(map(ReplyRecord._make, map(_RECORD_FIELDS, r["records"]))),
        )
