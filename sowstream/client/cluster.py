"""The cluster as ``sowstream status`` shows it (``Client.cluster_status``, ``/status/cluster``).

Where each figure comes from:

* workers: the workers topic (``<prefix>.workers``), on which every worker announces itself every
  couple of seconds (name, host, uptime, readiness, owned partitions with their watermarks,
  restore progress, subscriptions). A worker whose last announcement is older than
  ``WORKER_STALE_SECONDS`` is shown as not answering, with what it said last.
* partitions: each partition's owner answers the ``status`` command (watermark, records,
  warnings); a partition whose owner does not answer within the wait keeps the watermark its
  owner last announced, marked ``answered: false``. The log end comes from Kafka, so the lag
  of a partition nobody serves keeps growing.
* queues: the same data as ``sowstream queue status``; dead letters: the dead-letter topic.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterable
from typing import Any, cast

import orjson
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from sowstream.client.connection import Connection
from sowstream.client.querying import Querying
from sowstream.client.topics import TopicInfo
from sowstream.errors import CommandTimeoutError, SowstreamError
from sowstream.queues.machine import EXPIRY_REASONS
from sowstream.wire import headers as h
from sowstream.wire import protocol
from sowstream.wire.kafka import quiet
from sowstream.wire.versions import decode_headed

WORKER_STALE_SECONDS = 10.0  # five announcements missed (engine.status.ANNOUNCE_SECONDS)
WORKER_FORGET_SECONDS = 3600.0  # workers silent for longer are left out (gone for good)
DEAD_LETTER_READ_MAX = 10_000  # dead letters read for their reasons; beyond, only the count


def queue_row(queue: str, raw: dict[str, Any]) -> dict[str, Any]:
    """A queue's counters (``Client.queue_status``) in a fixed shape: expiries by reason."""
    row: dict[str, Any] = {
        "queue": queue,
        "depth": raw.get("depth", 0),
        "leased": raw.get("leased", 0),
        "delivered": raw.get("delivered", 0),
        "acked": raw.get("acked", 0),
        "expired": {reason: raw[reason] for reason in EXPIRY_REASONS if raw.get(reason)},
        "returned": raw.get("returned"),  # None: the engine does not report it
        "seconds_behind": raw.get("seconds_behind", 0.0),
        "age_of_oldest_lease": raw.get("age_of_oldest_lease", 0.0),
        "priority_count": raw.get("priority_count", 0),
    }
    row.update({k: v for k, v in raw.items() if k not in row and k not in EXPIRY_REASONS})
    return row


def cluster_status(
    connection: Connection,
    querying: Querying,
    answer_seconds: float = 5.0,
    topic: str | None = None,
) -> dict[str, Any]:
    """Workers, partitions, topics, queues and dead letters of the cluster (stable keys,
    docs/deploy.md *Status*); waits at most ``answer_seconds`` for the workers' answers.
    ``topic`` (a name or regular expression) limits partitions, topics and queues to it.
    ``querying`` sends the ``status`` command and reads the queues' counters."""
    infos = list(connection.refresh_topics().values())
    if topic is not None:
        names = {i.name for i in connection.resolve_topics(topic)}
        infos = [i for i in infos if i.name in names]
    now = time.time()
    workers = _read_workers(connection, now)
    answers = _partition_answers(connection, querying, infos, answer_seconds)
    topics = [i for i in infos if not i.queue or i.name in i.queue_of]
    shown = {i.name for i in topics}
    # The freshest announcement naming a partition tells who owns it (a rebalance may leave an
    # older claim in a silent worker's last announcement).
    claimed: dict[tuple[str, int], tuple[float, dict[str, Any], dict[str, Any]]] = {}
    for worker in workers:
        for part in worker["partitions"]:
            key = (part["topic"], part["partition"])
            if part["topic"] not in shown:
                continue
            if key not in claimed or claimed[key][0] < worker["announced_at"]:
                claimed[key] = (worker["announced_at"], worker, part)
    ends = _log_ends(connection, [(i.log_topic, i.partitions) for i in topics])
    partitions: list[dict[str, Any]] = []
    for info in sorted(topics, key=lambda i: i.name):
        for p in range(info.partitions):
            answer = answers.get((info.name, p))
            claim = claimed.get((info.name, p))
            row: dict[str, Any] = {"topic": info.name, "partition": p, "sow": info.sow}
            if answer is not None:
                row.update(
                    worker=answer.get("worker"),
                    answered=True,
                    watermark=answer["watermark"],
                    records=answer.get("records"),
                    warnings=answer.get("warnings", []),
                )
            else:
                row.update(
                    worker=claim[1]["worker"] if claim else None,
                    answered=False,
                    watermark=claim[2].get("watermark") if claim else None,
                    records=None,
                    warnings=[],
                )
            end = ends.get((info.log_topic, p))
            row["log_end"] = end
            mark = row["watermark"]
            # The watermark is the last offset applied; the log end the next offset to write.
            row["lag"] = None if end is None or mark is None else max(0, end - mark - 1)
            partitions.append(row)
    for worker in workers:
        worker["partitions"] = sorted(
            [f"{t}/{p}" for (t, p), claim in claimed.items() if claim[1] is worker],
            key=lambda s: (s.rsplit("/", 1)[0], int(s.rsplit("/", 1)[1])),
        )
    subscriptions = _subscriptions(workers)
    conflation = _conflation(workers)
    topic_rows = []
    for info in sorted(topics, key=lambda i: i.name):
        rows = [r for r in partitions if r["topic"] == info.name]
        counted = [r["records"] for r in rows if r["records"] is not None]
        topic_rows.append(
            {
                "topic": info.name,
                "message_type": info.message_type,
                "sow": info.sow,
                "partitions": info.partitions,
                "records": sum(counted) if len(counted) == len(rows) and info.sow else None,
                "lag": sum(r["lag"] or 0 for r in rows),
                "subscriptions": subscriptions.get(info.name, 0),
                "conflation": conflation.get(info.name),
            }
        )
    return {
        "at": round(now, 3),
        "workers": workers,
        "partitions": partitions,
        "topics": topic_rows,
        "queues": _queues(querying, infos),
        "dead_letters": _dead_letters(connection),
    }


def _read_workers(connection: Connection, now: float) -> list[dict[str, Any]]:
    """The last announcement of every worker on the workers topic, with its age."""
    latest: dict[bytes, dict[str, Any]] = {}
    for key, value, _ in _read_all(connection, connection.names.workers):
        if value is None:
            latest.pop(key, None)
        else:
            latest[key] = orjson.loads(value)
    workers = []
    for info in latest.values():
        age = max(0.0, now - float(info.get("at", 0)))
        if age > WORKER_FORGET_SECONDS:
            continue
        workers.append(
            {
                "worker": info.get("worker"),
                "host": info.get("host"),
                "pid": info.get("pid"),
                "answering": age <= WORKER_STALE_SECONDS,
                "last_seen_s": round(age, 1),
                "uptime_s": round(float(info["at"]) - float(info["started"]), 1),
                "ready": bool(info.get("ready")) and age <= WORKER_STALE_SECONDS,
                "reason": info.get("reason", ""),
                "http": info.get("http"),
                "partitions": info.get("partitions", []),
                "inputs": info.get("inputs", []),
                "restore": info.get("restore", []),
                "subscriptions": info.get("subscriptions", {}),
                "conflated": info.get("conflated", {}),
                "announced_at": float(info.get("at", 0)),
            }
        )
    workers.sort(key=lambda w: str(w["worker"]))
    return workers


def _conflation(workers: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per conflated topic, the changes taken in and records written, summed over the workers'
    last announcements (each counts since its own start), and their ratio."""
    totals: dict[str, dict[str, Any]] = {}
    for worker in workers:
        for name, counts in worker["conflated"].items():
            row = totals.setdefault(name, {"incoming": 0, "published": 0})
            row["incoming"] += int(counts.get("incoming", 0))
            row["published"] += int(counts.get("published", 0))
    for row in totals.values():
        published = row["published"]
        row["ratio"] = round(row["incoming"] / published, 2) if published else None
    return totals


def _subscriptions(workers: list[dict[str, Any]]) -> dict[str, int]:
    """Subscriptions per topic: every worker reads the whole registry, so the freshest
    answering worker's count stands for the cluster's."""
    answering = [w for w in workers if w["answering"]] or workers
    if not answering:
        return {}
    freshest = max(answering, key=lambda w: w["announced_at"])
    return dict(freshest["subscriptions"])


def _partition_answers(
    connection: Connection, querying: Querying, infos: Iterable[TopicInfo], answer_seconds: float
) -> dict[tuple[str, int], dict[str, Any]]:
    """The ``status`` answers that arrive within ``answer_seconds`` (one per partition)."""
    infos = [i for i in infos if not i.queue or i.name in i.queue_of]
    command_id = uuid.uuid4().hex
    query_id = uuid.uuid4().hex[:16]
    expected = querying.send_status(infos, command_id, query_id)
    answers: dict[tuple[str, int], dict[str, Any]] = {}
    done: set[tuple[str, int]] = set()
    deadline = time.monotonic() + answer_seconds
    while len(done) < expected:
        try:
            reply = connection.next_reply(command_id, deadline)
        except CommandTimeoutError:
            break  # the rest show what their owners last announced
        part = (reply.topic, reply.partition)
        if reply.status != protocol.SUCCESS:
            done.add(part)  # e.g. a topic that disappeared meanwhile: its row shows no answer
        elif reply.command == protocol.SOW:
            for rec in reply.records:
                answers.setdefault(part, orjson.loads(rec.data))
        elif reply.command == protocol.PART_END:
            done.add(part)
    return answers


def _log_ends(
    connection: Connection, topics: list[tuple[str, int]]
) -> dict[tuple[str, int], int | None]:
    """Each log partition's end offset (the next offset to be written)."""
    if not topics:
        return {}
    admin = AdminClient(
        quiet({"bootstrap.servers": connection.bootstrap, **connection.kafka_config})
    )
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    request = {TopicPartition(t, p): latest for t, n in topics for p in range(n)}
    ends: dict[tuple[str, int], int | None] = {}
    timeout = connection.timeout
    for tp, future in admin.list_offsets(request, request_timeout=timeout).items():
        try:
            ends[(tp.topic, tp.partition)] = future.result(timeout).offset
        except KafkaException:
            ends[(tp.topic, tp.partition)] = None  # e.g. a log deleted meanwhile
    return ends


def _queues(querying: Querying, infos: Iterable[TopicInfo]) -> list[dict[str, Any]]:
    """Every queue's counters, as ``sowstream queue status`` shows them."""
    rows = []
    for name in sorted({i.name for i in infos if i.queue}):
        try:
            rows.append(queue_row(name, querying.queue_status(name)))
        except SowstreamError as exc:  # a partition's owner did not answer in time
            rows.append({"queue": name, "error": str(exc)})
    return rows


def _dead_letters(connection: Connection) -> dict[str, Any]:
    """How many records the dead-letter topic holds, by topic and reason when there are at
    most ``DEAD_LETTER_READ_MAX`` of them (reading more would make status slow)."""
    consumer = connection.consumer()
    try:
        tp = TopicPartition(connection.names.dead_letter, 0)
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=connection.timeout)
        except KafkaException:
            return {"count": 0, "by_reason": {}, "by_topic": {}}
        count = max(0, high - low)
        if count == 0 or count > DEAD_LETTER_READ_MAX:
            return {"count": count, "by_reason": None, "by_topic": None}
    finally:
        consumer.close()
    reasons: Counter[str] = Counter()
    topics: Counter[str] = Counter()
    for _, value, headers in _read_all(connection, connection.names.dead_letter):
        if value is not None:
            letter = decode_headed("DeadLetter", value, headers)
            reasons[letter["reason"]] += 1
            topics[letter["topic"]] += 1
    return {"count": count, "by_reason": dict(reasons), "by_topic": dict(topics)}


def _read_all(
    connection: Connection, topic: str
) -> list[tuple[bytes, bytes | None, dict[str, str]]]:
    """Every (key, value, headers) of partition 0 of ``topic`` up to its end now; [] when it is
    missing."""
    consumer = connection.consumer()
    try:
        tp = TopicPartition(topic, 0)
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=connection.timeout)
        except KafkaException:
            return []
        if high <= low:
            return []
        consumer.assign([TopicPartition(topic, 0, low)])
        found: list[tuple[bytes, bytes | None, dict[str, str]]] = []
        deadline = time.monotonic() + connection.timeout
        position = low
        while position < high and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.5):
                if msg.error():
                    continue
                position = (msg.offset() or 0) + 1
                headers = h.header_map(cast(h.RawHeaders, msg.headers()))
                found.append((msg.key() or b"", msg.value(), headers))
        return found
    finally:
        consumer.close()
