"""Telling a recreated transaction log from the one a partition's SOW was applied from.

A partition stores its watermark (the last log offset applied) and, beside it, a fingerprint of
that record (offset, log time, key checksum). If the log topic is deleted and created again, its
offsets start over: either the log now ends below the watermark, or the record at the watermark
is another one. Either way the stored position means nothing in the new log, and continuing from
it would silently skip the new log's first records.
"""

from __future__ import annotations

import zlib
from dataclasses import replace
from typing import Any

from sowstream.sow.record import SowRecord

RECREATED = "log_recreated"
MAX_WARNINGS = 10  # per partition: the newest are kept


def fingerprint(offset: int, timestamp: int, key: bytes | None) -> bytes:
    """What identifies the log record at ``offset``: its offset, log time and key checksum."""
    return f"{offset}:{timestamp}:{zlib.crc32(key or b'')}".encode()


def recreation(watermark: int, end: int, stored: bytes | None, found: bytes | None) -> str | None:
    """Why the log is not the one applied up to ``watermark``, or None when nothing says so.

    ``end`` is the log's last offset (-1 when empty), ``stored`` the fingerprint kept with the
    watermark and ``found`` the fingerprint of the log's record at ``watermark`` now (None when
    either is unknown, e.g. a store written before fingerprints existed: only ``end`` counts).
    """
    if watermark < 0:
        return None
    if end < watermark:
        return f"the log ends at offset {end}, below the stored watermark {watermark}"
    if stored is None or found is None or not stored.startswith(f"{watermark}:".encode()):
        return None
    if stored != found:
        return (
            f"the record at offset {watermark} is not the one applied there "
            f"(applied {stored.decode()}, found {found.decode()})"
        )
    return None


def rebased(record: SowRecord) -> SowRecord:
    """``record`` as a record no log operation has touched, so the new log's offsets apply to it.

    Its stored offset belongs to the old log; kept, it would make every new operation at a
    lower offset look already applied.
    """
    return replace(record, log_offset=-1)


def warning(
    topic: str, partition: int, watermark: int, start: int, end: int, reason: str, at_ms: int
) -> dict[str, Any]:
    """The status entry that reports a recreated log (shown by ``sowstream status``)."""
    return {
        "kind": RECREATED,
        "at_ms": at_ms,
        "watermark": watermark,
        "log_start": start,
        "log_end": end,
        "message": (
            f"topic {topic!r} partition {partition}: the transaction log was recreated ({reason});"
            f" the SOW, applied up to offset {watermark} of the old log, is kept as it is and the "
            f"new log is applied from offset {start}"
        ),
    }


def add_warning(warnings: list[dict[str, Any]], entry: dict[str, Any]) -> list[dict[str, Any]]:
    """``warnings`` with ``entry`` appended, keeping the newest MAX_WARNINGS."""
    return [*warnings, entry][-MAX_WARNINGS:]
