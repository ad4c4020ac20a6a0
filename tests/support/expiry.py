"""Expiry in unit tests: the sweep writes ``sow_expire`` records to the log, and the engine removes
the records when it reads them back; here the test plays the log, handing them straight back."""

from __future__ import annotations

from sowstream.engine.processor import TopicProcessor
from sowstream.sow.ops import RawRecord
from tests.support.sender import RecordingSender


async def expire_through_log(proc: TopicProcessor, sender: RecordingSender, now_ms: int) -> int:
    """Run the expiry sweep at ``now_ms`` and apply the removals it wrote, each placed after
    what its partition has folded; returns how many removals the sweep wrote."""
    already = len(sender.records)
    written = await proc.expire_due(now_ms=now_ms)
    removals = [r for r in sender.records[already:] if r.topic == proc.log_topic]
    records = []
    for rec in removals:
        ps = proc.state(rec.partition or 0)
        assert ps is not None
        offset = max(ps.folded, *(r.offset for r in records if r.partition == rec.partition), -1)
        records.append(
            RawRecord(rec.partition or 0, offset + 1, now_ms, rec.key, rec.value, rec.headers)
        )
    if records:
        await proc.process(records)
        await proc.drain()
    return written
