"""Folding a transaction log into SOW state outside the engine: rebuilds, audits, point-in-time.

The engine applies the log batch by batch to a partition store; a bulk job (Spark) instead sees
every record of one SowKey together, sorted by log offset, plus the partition's deletes by filter.
``fold_key`` turns that into the key's final state with the very functions the engine uses
(``decode_log_record``, ``apply_keyed``, ``deleted_by_filter``), so the two cannot drift apart.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Any

from sowstream.errors import InvalidMessageError
from sowstream.sow.compiled import CompiledTopic
from sowstream.sow.expiration import processes_expiration
from sowstream.sow.ops import (
    LogOp,
    RawRecord,
    apply_keyed,
    decode_log_record,
    deleted_by_filter,
)
from sowstream.sow.ports import TopicDefinition
from sowstream.sow.record import SowRecord
from sowstream.wire import headers as h


def is_filter_delete(headers: Mapping[str, str]) -> bool:
    """Whether a log record is a delete by filter (partition-wide, not tied to one SowKey)."""
    return headers.get(h.COMMAND) == h.SOW_DELETE and h.FILTER in headers


@dataclass(slots=True)
class FilterDeletes:
    """The deletes by filter of one log partition, by offset, for bisecting between key ops."""

    ops: list[LogOp]
    offsets: list[int]

    @classmethod
    def of(
        cls, topic: CompiledTopic[TopicDefinition], records: Iterable[RawRecord]
    ) -> FilterDeletes:
        """Decode a partition's filter deletes; a malformed one is skipped as the engine does."""
        ops: list[LogOp] = []
        for rec in sorted(records, key=lambda r: r.offset):
            try:
                op = decode_log_record(
                    topic, rec.key, rec.value, rec.headers, rec.offset, rec.timestamp
                )
            except InvalidMessageError:
                continue
            if op.filter is not None:
                ops.append(op)
        return cls(ops, [op.offset for op in ops])

    def between(self, after: int, upto: int) -> list[LogOp]:
        """The deletes with ``after < offset < upto``."""
        lo = bisect.bisect_right(self.offsets, after)
        hi = bisect.bisect_left(self.offsets, upto)
        return self.ops[lo:hi]


NO_DELETES = FilterDeletes([], [])


def _expired(state: SowRecord | None, at_ms: int) -> bool:
    return state is not None and state.expiration is not None and state.expiration <= at_ms


def fold_key(
    topic: CompiledTopic[TopicDefinition],
    records: Sequence[RawRecord],
    deletes: FilterDeletes = NO_DELETES,
    *,
    until_ms: int,
) -> SowRecord | None:
    """The state of one SowKey after its records (one partition, ascending offsets).

    A record that expired before the next operation reached it is gone by then (the engine's
    expiry sweep would have removed it), and one that has expired by ``until_ms`` is not part of
    the result. Records the engine would reject or re-key are skipped, as the engine skips them.
    """
    expires = processes_expiration(topic.definition.expiration)
    state: SowRecord | None = None
    last = -1
    for rec in records:
        state = _apply_deletes(topic, state, deletes.between(last, rec.offset), expires)
        last = rec.offset
        try:
            op = decode_log_record(
                topic, rec.key, rec.value, rec.headers, rec.offset, rec.timestamp
            )
        except InvalidMessageError:
            continue
        if op.rekey or op.sow_key is None:
            continue
        if expires and _expired(state, op.timestamp):
            state = None
        try:
            state = apply_keyed(topic, state, op)
        except InvalidMessageError:
            continue  # a merge the message type cannot write: rejected, as by the engine
    if state is not None:
        state = _apply_deletes(topic, state, deletes.between(last, 1 << 62), expires)
    if expires and _expired(state, until_ms):
        return None
    return state


def _apply_deletes(
    topic: CompiledTopic[TopicDefinition], state: SowRecord | None, ops: list[LogOp], expires: bool
) -> SowRecord | None:
    for op in ops:
        if state is None:
            return None
        if expires and _expired(state, op.timestamp):
            return None
        if deleted_by_filter(topic, state, op):
            return None
    return state


@dataclass(frozen=True, slots=True)
class Step:
    """What one log record did to one record of an in-memory state.

    ``seq`` numbers the records one delete by filter removed (1..n, in SowKey order), as the
    engine numbers them, so messages derived from a replay carry the engine's sequences.
    """

    sow_key: str
    before: SowRecord | None
    after: SowRecord | None
    seq: int = 0


def apply_record(
    topic: CompiledTopic[TopicDefinition], state: dict[str, SowRecord], rec: RawRecord
) -> list[Step]:
    """Apply one log record to ``state`` (in place) and say what it changed.

    Records the engine rejects or re-keys change nothing, as in the engine.
    """
    try:
        op = decode_log_record(topic, rec.key, rec.value, rec.headers, rec.offset, rec.timestamp)
    except InvalidMessageError:
        return []
    if op.rekey:
        return []
    if op.sow_key is None:
        gone = [key for key in sorted(state) if deleted_by_filter(topic, state[key], op)]
        return [Step(key, state.pop(key), None, seq) for seq, key in enumerate(gone, 1)]
    old = state.get(op.sow_key)
    try:
        new = apply_keyed(topic, old, op)
    except InvalidMessageError:
        return []
    if new is old:
        return []
    if new is None:
        state.pop(op.sow_key, None)
    else:
        state[op.sow_key] = new
    return [Step(op.sow_key, old, new)]


def replaces_record(topic: CompiledTopic[TopicDefinition], rec: RawRecord) -> bool:
    """Whether ``rec`` is a full publish the engine applies as it stands under its own key.

    Such a record replaces whatever came before it, so a bulk fold may start a key's history
    there; a record the engine would reject or re-key does not, nor any publish on a topic
    whose Enrichment reads the record before it (``OF PREVIOUS``).
    """
    if (rec.headers.get(h.COMMAND) or h.PUBLISH) != h.PUBLISH or rec.value is None:
        return False
    if reads_previous(topic):
        return False
    try:
        op = decode_log_record(topic, rec.key, rec.value, rec.headers, rec.offset, rec.timestamp)
    except InvalidMessageError:
        return False
    return not op.rekey and op.sow_key is not None


def fold_sorted(
    topic: CompiledTopic[TopicDefinition],
    records: Iterable[RawRecord],
    deletes: Mapping[int, FilterDeletes],
    *,
    until_ms: int,
    anchored: bool = False,
) -> Iterator[tuple[int, bytes | None, SowRecord | None]]:
    """(partition, Kafka key, final state) of every key in a stream sorted by (key, partition,
    offset); keys whose record is gone are left out.

    Runs of the same Kafka key form one record's history; the stream is consumed lazily so a
    Spark task folds any number of keys in constant memory per key. With ``anchored`` each run
    starts at the key's last full publish (earlier records were dropped as irrelevant): a run
    whose first record is a publish the engine would not apply as it stands then yields state
    None, so the caller folds that key again from its whole history.
    """
    for (key, partition), group in groupby(records, key=lambda r: (r.key, r.partition)):
        run = list(group)
        if anchored and _looks_like_publish(run[0]) and not replaces_record(topic, run[0]):
            yield partition, key, None
            continue
        state = fold_key(topic, run, deletes.get(partition, NO_DELETES), until_ms=until_ms)
        if state is not None:
            yield partition, key, state


def reads_previous(topic: CompiledTopic[TopicDefinition]) -> bool:
    """Whether applying a publish depends on the record before it (Enrichment with
    ``OF PREVIOUS``), so a key's history cannot be cut at its last publish."""
    enrichment = topic.stages.enrichment
    return enrichment is not None and enrichment.reads_previous


def _looks_like_publish(rec: RawRecord) -> bool:
    return (rec.headers.get(h.COMMAND) or h.PUBLISH) == h.PUBLISH and rec.value is not None


def state_row(state: SowRecord, partition: int) -> dict[str, Any]:
    """A folded record as a flat row (the rebuild's output columns)."""
    return {
        "sow_key": state.sow_key,
        "data": state.data.decode("utf-8", "replace"),
        "log_partition": partition,
        "log_offset": state.log_offset,
        "log_timestamp": state.log_timestamp,
        "expiration": state.expiration,
    }
