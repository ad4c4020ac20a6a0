"""Transaction-log operations and how each changes the SOW: the one definition of the semantics.

The engine, the test oracle and the Spark rebuild all fold the log with these functions, so they
agree by construction. Every function here is pure. Those that read bodies take the topic
compiled (:class:`~sowstream.sow.compiled.CompiledTopic`: its message type and stages made
once), the others only its definition.

One publish goes through, in this order (docs/enrichment.md): the publish entitlement check on
the message as received, the topic's Preprocessing, the SowKey, and when it is applied the
Enrichment (on the incoming message, a delta_publish's delta included, reading the stored record
as OF PREVIOUS), then for a delta_publish the merge of the enriched delta into the stored
record: AMPS preprocesses and enriches the incoming message first and merges after (the delta
messaging chapter). The log keeps what was published; the stored record is the enriched one, and
an operation is applied once (see ``apply_keyed``), so a replay never enriches a record again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sowstream.auth import Authenticator
from sowstream.errors import AuthenticationError, InvalidMessageError
from sowstream.filters import Filter, FilterError, compile_filter
from sowstream.messagetypes import MessageParseError, MessageSerialiseError, MessageType
from sowstream.messagetypes.changes import merge_delta
from sowstream.sow.compiled import CompiledTopic
from sowstream.sow.enrich import Stage, StageFailure
from sowstream.sow.expiration import expiration_time, parse_expiration_header
from sowstream.sow.keygen import generate_sow_key, load_key_generator
from sowstream.sow.keys import generated_sow_key, validate_user_sow_key
from sowstream.sow.patterns import record_key, split_key
from sowstream.sow.ports import TopicDefinition
from sowstream.sow.record import SowRecord
from sowstream.wire import headers as h
from sowstream.wire.kafka import LARGEST_LOG_RECORD, MAX_RECORD_BYTES


@dataclass(slots=True)
class RawRecord:
    """A transaction-log record as any Kafka reader delivers it (headers decoded to text)."""

    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, str]


@dataclass(slots=True)
class LogOp:
    """One decoded log record, ready to apply.

    ``sow_key`` is None only for a delete by filter, which applies to the whole partition it was
    written to. ``body`` and ``data`` are the message after the topic's Preprocessing (``data``
    is the record's own bytes when it has none). ``rekey`` is set when the record arrived
    without the right Kafka key: the engine then writes a correctly keyed copy (of the record
    as published) to the log instead of applying it here, so that all updates of a record stay
    ordered in one partition.
    """

    command: str
    sow_key: str | None
    offset: int
    timestamp: int
    body: dict[str, Any] | None = None
    data: bytes | None = None
    filter: Filter | None = None
    expiration_ms: int | None = None
    reply_to: str | None = None
    command_id: str | None = None
    rekey: bool = False
    # On a Pattern topic: the topic name the record was published under; ``sow_key`` is then
    # its record key (name and SowKey, sow.patterns.record_key) and ``kafka_key`` the SowKey.
    name: str | None = None
    kafka_key: str | None = None


def malformed_reason(message_type: str) -> str:
    """The dead-letter and ack reason of a body that does not parse as its topic's type."""
    return f"malformed_{message_type}"


def parse_body(
    topic: CompiledTopic[TopicDefinition], value: bytes | None, *, delta: bool = False
) -> dict[str, Any]:
    """A message body's fields, read by the topic's message type (a delta_publish's with the
    type's delta reading); anything else is an InvalidMessageError naming topic and position."""
    if not value:
        definition = topic.definition
        raise InvalidMessageError(
            f"{_label(definition)}: empty message body",
            topic=definition.name,
            reason=malformed_reason(definition.message_type),
        )
    codec = topic.codec
    try:
        return codec.parse_delta(value) if delta else codec.parse(value)
    except MessageParseError as exc:
        raise InvalidMessageError(
            f"{_label(topic.definition)}: {exc}",
            topic=topic.definition.name,
            reason=malformed_reason(codec.name),
        ) from exc


def _label(topic: TopicDefinition) -> str:
    """How errors name a topic: with its message type unless it is json (as they always did)."""
    if topic.message_type == "json":
        return f"topic {topic.name!r}"
    return f"{topic.message_type} topic {topic.name!r}"


def resolve_sow_key(
    topic: TopicDefinition,
    body: Mapping[str, Any] | None,
    supplied: str | None,
    name: str | None = None,
) -> str:
    """The SowKey of a message: made by the topic's KeyGenerator or from its Key fields, or
    the publisher's own. ``name`` is the topic name a Pattern topic's message was published
    under: the key domain of its generated keys (unless KeyDomain is set), named in errors."""
    label = name or topic.name
    if topic.user_supplied_keys:
        return validate_user_sow_key(label, supplied)
    if body is None:
        # Without data only the key itself can identify a record (delete by SowKey).
        if supplied:
            return supplied
        raise InvalidMessageError(
            f"topic {label!r}: a delete needs data, keys or a filter",
            topic=label,
            reason="missing_key_field",
        )
    generator = topic.key_generator
    if generator is not None:
        function = load_key_generator(generator.module, dict(generator.options))
        return generate_sow_key(label, generator.module, function, body)
    return generated_sow_key(label, topic.key_domain_of(label), topic.keys, body)


def published_name(topic: TopicDefinition, headers: Mapping[str, str]) -> str | None:
    """The topic name a record of a Pattern topic was published under (its ``sow.topic``
    header), checked against the Pattern; None on other topics."""
    if topic.pattern is None:
        return None
    name = headers.get(h.TOPIC) or ""
    if not name:
        raise InvalidMessageError(
            f"topic {topic.name!r} is a regular expression topic (Pattern {topic.pattern!r}): "
            f"each record needs the topic name it is published under in header {h.TOPIC}",
            topic=topic.name,
            reason="missing_topic",
        )
    if not topic.matches_name(name) or any(c.isspace() or not c.isprintable() for c in name):
        raise InvalidMessageError(
            f"topic {topic.name!r}: topic name {name!r} in header {h.TOPIC} does not match its "
            f"Pattern {topic.pattern!r}",
            topic=topic.name,
            reason="bad_topic",
        )
    return name


def decode_log_record(
    compiled: CompiledTopic[TopicDefinition],
    key: bytes | None,
    value: bytes | None,
    headers: Mapping[str, str],
    offset: int,
    timestamp: int,
) -> LogOp:
    """Turn a raw log record into a :class:`LogOp`; bad input raises InvalidMessageError."""
    topic = compiled.definition
    check_refused(topic, headers)
    command = headers.get(h.COMMAND) or h.PUBLISH
    if command not in h.LOG_COMMANDS:
        raise InvalidMessageError(
            f"topic {topic.name!r}: unknown command {command!r} in header {h.COMMAND} "
            f"(expected one of {', '.join(sorted(h.LOG_COMMANDS))})",
            topic=topic.name,
            reason="unknown_command",
        )
    kafka_key = key.decode("utf-8", "replace") if key else None
    op = LogOp(
        command,
        None,
        offset,
        timestamp,
        reply_to=headers.get(h.REPLY_TO) or None,
        command_id=headers.get(h.COMMAND_ID) or None,
        name=published_name(topic, headers),
    )
    if command == h.SOW_EXPIRE:
        raw_due = headers.get(h.DUE) or ""
        if not raw_due.isdigit() or len(raw_due) > 18:
            raise InvalidMessageError(
                f"topic {topic.name!r}: sow_expire needs the expiration it removes, in ms, in "
                f"header {h.DUE} (got {raw_due[:40]!r})",
                topic=topic.name,
                reason="bad_header",
            )
        op.expiration_ms = int(raw_due)
        supplied = kafka_key or headers.get(h.SOW_KEY)
        _keyed(op, resolve_sow_key(topic, None, supplied, op.name), False)
        return op
    if command == h.SOW_DELETE:
        filter_text = headers.get(h.FILTER)
        if filter_text is not None:
            try:
                op.filter = compile_filter(filter_text)
            except FilterError as exc:
                raise InvalidMessageError(
                    f"topic {topic.name!r}: sow_delete filter: {exc}",
                    topic=topic.name,
                    reason="bad_filter",
                ) from exc
            return op
        if not value:
            supplied = kafka_key or headers.get(h.SOW_KEY)
            _keyed(op, resolve_sow_key(topic, None, supplied, op.name), kafka_key is None)
            return op
    delta = command == h.DELTA_PUBLISH
    op.body = parse_body(compiled, value, delta=delta)
    op.data = value
    if command != h.SOW_DELETE:
        check_publish_entitlement(topic, headers, op.body)
    preprocessing = compiled.stages.preprocessing
    if preprocessing is not None:
        op.body = preprocess(topic, preprocessing, op.body)
        if command != h.SOW_DELETE:
            op.data = _written(compiled, op.body, "Preprocessing", delta=delta)
    supplied = kafka_key if topic.user_supplied_keys and kafka_key else headers.get(h.SOW_KEY)
    sow_key = resolve_sow_key(topic, op.body, supplied, op.name)
    _keyed(op, sow_key, kafka_key != sow_key)
    if command != h.SOW_DELETE:
        op.expiration_ms = parse_expiration_header(topic.name, headers.get(h.EXPIRATION))
    return op


# The dead-letter reason of a log record too large for the engine to take.
TOO_LARGE = "too_large"


def record_size(rec: RawRecord) -> int:
    """The bytes of a log record that the engine may have to write again: value, key, headers."""
    size = len(rec.value or b"") + len(rec.key or b"")
    headers = rec.headers
    if headers:  # in C: this runs for every record of a chunk the compiled fold takes
        text = sum(map(len, headers)) + sum(map(len, headers.values()))
        if text > 4096:  # rare: count the UTF-8 bytes, which may be more than the characters
            text = sum(len(k.encode()) + len(v.encode()) for k, v in headers.items())
        size += text
    return size


def check_size(topic: TopicDefinition, rec: RawRecord) -> None:
    """Refuse a log record too large for the engine to write again (see LARGEST_LOG_RECORD):
    Kafka took it, but its changelog record or its dead letter would not fit, and the batch
    could never be stored."""
    size = record_size(rec)
    if size > LARGEST_LOG_RECORD:
        raise InvalidMessageError(
            f"{_label(topic)}: the record is {size} bytes (value, key and headers), more than "
            f"the {LARGEST_LOG_RECORD} the engine takes (what it writes for a record must fit "
            f"Kafka's {MAX_RECORD_BYTES}-byte messages): publish smaller records",
            topic=topic.name,
            reason=TOO_LARGE,
        )


def check_refused(topic: TopicDefinition, headers: Mapping[str, str]) -> None:
    """Refuse a record whose credential the worker refused (see :func:`authenticated`)."""
    refused = headers.get(h.REFUSED)
    if refused is not None:
        reason, _, message = refused.partition(" ")
        raise InvalidMessageError(f"{_label(topic)}: {message}", topic=topic.name, reason=reason)


def authenticated(
    authenticator: Authenticator, log_topic: str, recs: Sequence[RawRecord]
) -> list[RawRecord]:
    """``recs`` acting as the identities their credentials prove: header ``sow.identity`` set
    to the verified identity, or ``sow.refused`` set when the credential does not hold (checked
    against each record's own timestamp, so a replay of the log after a restart decides alike)."""
    out: list[RawRecord] = []
    for rec in recs:
        headers = rec.headers
        if headers.get(h.COMMAND) == h.SOW_EXPIRE and h.REFUSED not in headers:
            # The engine's own expiry sweep, unsigned: it can only remove a record whose own
            # expiration has passed, which the worker would remove anyway.
            out.append(rec)
            continue
        claimed = headers.get(h.IDENTITY) or ""
        try:
            identity = authenticator.identify(
                headers.get(h.CREDENTIAL), claimed, log_topic, rec.key, rec.value, rec.timestamp
            )
            refused = None
        except AuthenticationError as exc:
            identity, refused = claimed, f"{exc.reason} {exc}"
        if identity == claimed and refused is None and h.REFUSED not in headers:
            out.append(rec)  # the common case: the record stays as it is, no copy
            continue
        changed = {k: v for k, v in headers.items() if k != h.REFUSED}
        changed[h.IDENTITY] = identity
        if refused is not None:
            changed[h.REFUSED] = refused
        out.append(replace(rec, headers=changed))
    return out


def check_publish_entitlement(
    topic: TopicDefinition, headers: Mapping[str, str], body: Mapping[str, Any]
) -> None:
    """Refuse a publish its publisher's identity (header ``sow.identity``) is not entitled to:
    one that does not match the identity's publish entitlement filter, as received."""
    if not topic.publish_filters:
        return
    identity = headers.get(h.IDENTITY) or ""
    flt = topic.publish_filter(identity)
    if flt is not None and not flt.matches(body):
        raise InvalidMessageError(
            f"{_label(topic)}: identity {identity!r} may not publish this message: it does not "
            f"match the identity's publish entitlement filter {flt.text!r}",
            topic=topic.name,
            reason="entitlement",
        )


def preprocess(topic: TopicDefinition, stage: Stage, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` after the topic's Preprocessing; a Field that cannot be applied is an
    InvalidMessageError (reason ``preprocessing_failed``) naming it. The Python client does the
    same before keying a publish (``client.publishing.preprocess_body``)."""
    try:
        # No stored record and no log time yet: Preprocessing may use neither (sow.enrich).
        return stage.apply(body, None, 0)
    except StageFailure as exc:
        raise InvalidMessageError(
            f"{_label(topic)}: {exc}", topic=topic.name, reason="preprocessing_failed"
        ) from exc


def _written(
    compiled: CompiledTopic[TopicDefinition],
    body: dict[str, Any],
    stage: str,
    *,
    delta: bool = False,
) -> bytes:
    """``body`` in the topic's message type, or InvalidMessageError naming ``stage``."""
    codec = compiled.codec
    try:
        return codec.serialise_delta(body) if delta else codec.serialise(body)
    except (MessageSerialiseError, TypeError, ValueError, OverflowError) as exc:
        # orjson refuses integers beyond 64 bits with a TypeError, for example.
        topic = compiled.definition
        raise InvalidMessageError(
            f"{_label(topic)}: the message after {stage} cannot be written as {codec.name}: {exc}",
            topic=topic.name,
            reason=f"{stage.lower()}_failed",
        ) from exc


def _keyed(op: LogOp, sow_key: str, rekey: bool) -> None:
    """Give ``op`` its SowKey: on a Pattern topic the record key of its name holds it."""
    op.kafka_key = sow_key
    op.sow_key = record_key(op.name, sow_key) if op.name is not None else sow_key
    op.rekey = rekey


def apply_keyed(
    compiled: CompiledTopic[TopicDefinition], stored: SowRecord | None, op: LogOp
) -> SowRecord | None:
    """The record's state after ``op`` (None = absent).

    An op at or below the stored record's log offset was applied before (a replay after a crash)
    and changes nothing, which makes replay idempotent: the stored, enriched record stays what
    the first application made it. A delta_publish whose merge the message type cannot write
    (an xml update with another root element, an avro insert missing fields), or an Enrichment
    that cannot be applied, raises InvalidMessageError and changes nothing.
    """
    if stored is not None and stored.log_offset >= op.offset:
        return stored
    if op.command == h.SOW_DELETE:
        return None
    if op.command == h.SOW_EXPIRE:
        # Only the expiration it names: a record published again meanwhile stays.
        expired = stored is not None and stored.expiration == op.expiration_ms
        return None if expired else stored
    assert op.sow_key is not None and op.body is not None and op.data is not None
    data = op.data
    enrichment = compiled.stages.enrichment
    if enrichment is not None:
        data = _enriched(compiled, enrichment, stored, op)
    elif op.command == h.DELTA_PUBLISH and (codec := compiled.codec).supports_delta:
        try:
            if stored is not None:
                data = codec.merge_fields(codec.parse(stored.data), op.body)
            elif not codec.delta_form_is_full:
                # An inserting delta_publish is stored in the type's record form (avro).
                data = codec.serialise(op.body)
        except MessageSerialiseError as exc:
            topic = compiled.definition
            raise InvalidMessageError(
                f"{_label(topic)}: the delta_publish cannot be merged into the record: {exc}",
                topic=topic.name,
                reason="bad_merge",
            ) from exc
    topic = compiled.definition
    expires = expiration_time(topic.expiration, op.expiration_ms, op.timestamp, topic.name)
    return SowRecord(op.sow_key, data, op.offset, op.timestamp, expires)


def _enriched(
    compiled: CompiledTopic[TopicDefinition], stage: Stage, stored: SowRecord | None, op: LogOp
) -> bytes:
    """The record ``op`` stores on a topic with Enrichment: the incoming message after the
    Enrichment, which reads the stored record as ``OF PREVIOUS`` and the log time as
    ``UNIX_TIMESTAMP()``; a delta_publish's enriched delta is then merged into the stored record.

    The Enrichment of a delta_publish sees the delta as ``OF CURRENT``: a field the delta lacks
    is NULL there (``COALESCE(/f OF CURRENT, /f OF PREVIOUS)`` reads the stored value), and a
    Field whose result is NULL writes null over the stored value unless ``HINT OPTIONAL`` leaves
    it out of the delta.
    """
    assert op.body is not None
    topic = compiled.definition
    codec = compiled.codec
    delta = op.command == h.DELTA_PUBLISH
    needed = stored is not None and (delta or stage.reads_previous)
    previous = stored.parsed(codec) if needed and stored is not None else None
    try:
        enriched = stage.apply(op.body, previous, op.timestamp)
    except StageFailure as exc:
        raise InvalidMessageError(
            f"{_label(topic)}: {exc}", topic=topic.name, reason="enrichment_failed"
        ) from exc
    record = merge_delta(previous, enriched) if delta and previous is not None else enriched
    try:
        return _written(compiled, record, "Enrichment")
    except InvalidMessageError:
        if delta:  # the merge itself, not the Enrichment, may be what cannot be written
            merged = merge_delta(previous, op.body) if previous is not None else op.body
            problem = _unwritable(codec, merged)
            if problem is not None:
                raise InvalidMessageError(
                    f"{_label(topic)}: the delta_publish cannot be merged into the record: "
                    f"{problem}",
                    topic=topic.name,
                    reason="bad_merge",
                ) from None
        raise


def _unwritable(codec: MessageType, message: dict[str, Any]) -> str | None:
    """Why ``message`` cannot be written in ``codec``'s type, or None."""
    try:
        codec.serialise(message)
    except (MessageSerialiseError, TypeError, ValueError, OverflowError) as exc:
        return str(exc)
    return None


def deleted_by_filter(
    compiled: CompiledTopic[TopicDefinition], stored: SowRecord, op: LogOp
) -> bool:
    """Whether a delete-by-filter at ``op.offset`` removes ``stored``.

    Records written after the delete (a higher log offset, seen again during a replay) are kept,
    and so are, on a Pattern topic, the records of other topic names than the delete's.
    """
    assert op.filter is not None
    if op.name is not None and split_key(stored.sow_key)[0] != op.name:
        return False
    return stored.log_offset < op.offset and op.filter.matches(stored.parsed(compiled.codec))
