"""A stored SOW record and its Avro encoding (the state schema ``schemas/SowRecord.avsc``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sowstream.wire.avro import decode, encode

if TYPE_CHECKING:
    from sowstream.messagetypes import MessageType


@dataclass(frozen=True, slots=True)
class SowRecord:
    """The current state of one SOW key plus what replay and expiry need to know about it."""

    sow_key: str
    data: bytes
    log_offset: int
    log_timestamp: int
    expiration: int | None = None

    def parsed(self, mtype: MessageType) -> dict[str, Any]:
        """The message body's fields, read by its topic's message type."""
        return mtype.parse(self.data)

    def to_bytes(self) -> bytes:
        """Avro bytes for RocksDB and the changelog."""
        return encode(
            "SowRecord",
            {
                "sow_key": self.sow_key,
                "data": self.data,
                "log_offset": self.log_offset,
                "log_timestamp": self.log_timestamp,
                "expiration": self.expiration,
            },
        )

    @classmethod
    def from_bytes(cls, payload: bytes) -> SowRecord:
        """Inverse of :meth:`to_bytes`."""
        d = decode("SowRecord", payload)
        return cls(d["sow_key"], d["data"], d["log_offset"], d["log_timestamp"], d["expiration"])
