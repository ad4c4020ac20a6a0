"""Publishing from the client: publish, delta_publish and sow_delete, routed by SowKey."""

from __future__ import annotations

import re
import uuid
import zlib
from typing import Any

import orjson

from sowstream.client.connection import Connection
from sowstream.client.queueing import Queueing
from sowstream.client.topics import TopicInfo
from sowstream.errors import (
    InvalidCommandError,
    InvalidMessageError,
)
from sowstream.filters import compile_filter
from sowstream.messagetypes import (
    MessageParseError,
    MessageSerialiseError,
)
from sowstream.sow.enrich import Stage, StageFailure
from sowstream.sow.keygen import KeyGeneratorError, generate_sow_key, load_key_generator
from sowstream.sow.keys import generated_sow_key, validate_user_sow_key
from sowstream.wire import headers as h
from sowstream.wire.topics import JSON


def preprocess_body(info: TopicInfo, stage: Stage, parsed: dict[str, Any]) -> dict[str, Any]:
    """A message after the topic's Preprocessing, as the engine computes it (sow.ops)."""
    try:
        return stage.apply(parsed, None, 0)
    except StageFailure as exc:
        label = "topic" if info.message_type == JSON else f"{info.message_type} topic"
        raise InvalidMessageError(
            f"{label} {info.name!r}: {exc}", topic=info.name, reason="preprocessing_failed"
        ) from exc


class Publishing:
    """The publish part: every update of a record goes to the partition that owns it. A
    ``sow_delete`` with bookmarks acknowledges queue messages, through ``queueing``."""

    def __init__(self, connection: Connection, queueing: Queueing) -> None:
        self._conn = connection
        self._queueing = queueing
        # hashed once: every publish to a plain topic routes by it (plain_partition)
        self._name_hash = zlib.crc32(connection.name.encode())

    @staticmethod
    def _body(
        info: TopicInfo, data: bytes | str | dict[str, Any] | None, *, delta: bool = False
    ) -> tuple[bytes, dict[str, Any]]:
        """The body to publish and its fields: a dict is written in the topic's message type,
        text or bytes are checked against it (a delta_publish in its delta form)."""
        topic, codec = info.name, info.codec
        reason = f"malformed_{codec.name}"
        if data is None:
            raise InvalidMessageError(
                f"topic {topic!r}: no message data", topic=topic, reason=reason
            )
        try:
            if isinstance(data, dict):
                if codec.name == JSON:
                    return orjson.dumps(data), data
                raw = codec.serialise_delta(data) if delta else codec.serialise(data)
                return raw, data
            raw = data.encode() if isinstance(data, str) else bytes(data)
            if not raw:
                raise MessageParseError(codec.name, "empty message body")
            return raw, codec.parse_delta(raw) if delta else codec.parse(raw)
        except (MessageParseError, MessageSerialiseError) as exc:
            label = "topic" if codec.name == JSON else f"{codec.name} topic"
            raise InvalidMessageError(
                f"{label} {topic!r}: {exc}", topic=topic, reason=reason
            ) from exc

    @staticmethod
    def _published_name(info: TopicInfo) -> str | None:
        """The topic name a publish or delete on a Pattern topic goes under (None elsewhere):
        the name the command addressed, which its Pattern must match."""
        if info.publish_as:  # a queue whose DefaultPublishTarget is one name of a Pattern topic
            return info.publish_as
        if not info.pattern:
            return None
        name = info.published_name
        if name is None or not re.fullmatch(info.pattern, name):
            raise InvalidCommandError(
                f"topic {info.name!r} is a regular expression topic (Pattern {info.pattern!r}): "
                "publish or delete under a topic name its Pattern matches"
            )
        return name

    def _sow_key(
        self,
        info: TopicInfo,
        parsed: dict[str, Any],
        sow_key: str | None,
        name: str | None = None,
    ) -> str | None:
        """The SowKey the engine gives a record of ``info`` (published under ``name`` on a
        Pattern topic, whose names are their own key domains unless KeyDomain is set).

        On a topic with Preprocessing the key is that of the preprocessed message, so the
        publish goes to the partition that owns it; the body is sent as given and the engine
        preprocesses it again (as for any Kafka producer's records).
        """
        stage = info.preprocessing_stage
        if stage is not None:
            parsed = preprocess_body(info, stage, parsed)
        if info.key_generator is not None:
            # The engine recomputes it; the same generator here routes the publish right.
            try:
                function = load_key_generator(info.key_generator, dict(info.key_generator_options))
            except KeyGeneratorError as exc:
                raise InvalidCommandError(
                    f"topic {info.name!r}: its KeyGenerator must be importable by publishers "
                    f"too: {exc}"
                ) from exc
            return generate_sow_key(info.name, info.key_generator, function, parsed)
        if not info.keys:
            if not info.sow and sow_key is None:
                return None  # a plain topic needs no key: Kafka spreads the messages
            return validate_user_sow_key(info.name, sow_key)
        if name is not None:
            return generated_sow_key(name, info.key_domain or name, info.keys, parsed)
        return generated_sow_key(info.name, info.key_domain, info.keys, parsed)

    def plain_partition(self, info: TopicInfo) -> int:
        """The one partition this client publishes an unkeyed plain topic's messages to.

        A keyless record would land on a random partition and overtake its predecessors; one
        partition per publisher keeps a publisher's messages in order, as AMPS subscribers expect.
        """
        return self._name_hash % info.partitions

    def publish(
        self,
        topic: str,
        data: bytes | str | dict[str, Any],
        *,
        sow_key: str | None = None,
        expiration: int | str | None = None,
        ack: bool = False,
        message_type: str | None = None,
    ) -> str | None:
        """A ``publish`` routed by SowKey (:meth:`Client.publish`)."""
        return self.publish_command(h.PUBLISH, topic, data, sow_key, expiration, ack, message_type)

    def delta_publish(
        self,
        topic: str,
        data: bytes | str | dict[str, Any],
        *,
        sow_key: str | None = None,
        expiration: int | str | None = None,
        ack: bool = False,
        message_type: str | None = None,
    ) -> str | None:
        """A ``delta_publish`` routed by SowKey (:meth:`Client.delta_publish`)."""
        return self.publish_command(
            h.DELTA_PUBLISH, topic, data, sow_key, expiration, ack, message_type
        )

    def publish_command(
        self,
        command: str,
        topic: str,
        data: bytes | str | dict[str, Any] | None,
        sow_key: str | None,
        expiration: int | str | None,
        ack: bool,
        message_type: str | None = None,
    ) -> str | None:
        """A ``publish`` or ``delta_publish`` (``command``); the record's SowKey."""
        conn = self._conn
        info = conn.topic_info(topic, message_type, declare=True)
        info.refuse_writes()
        name = self._published_name(info)
        raw, parsed = self._body(info, data, delta=command == h.DELTA_PUBLISH)
        key = self._sow_key(info, parsed, sow_key, name)
        command_id = uuid.uuid4().hex if ack else None
        conn.produce(
            info.log_topic,
            raw,
            key=key,
            partition=self.plain_partition(info) if key is None else None,
            headers={
                h.COMMAND: command if command != h.PUBLISH else None,
                h.EXPIRATION: str(expiration) if expiration is not None else None,
                h.REPLY_TO: conn.reply_topic if ack else None,
                h.COMMAND_ID: command_id,
                h.TOPIC: name,
                h.IDENTITY: conn.identity or None,
            },
        )
        if command_id is not None:
            conn.flush()
            conn.await_acks(command_id, 1)
        return key

    def sow_delete(
        self,
        topic: str,
        *,
        filter: str | None = None,
        sow_keys: list[str] | tuple[str, ...] | None = None,
        data: bytes | str | dict[str, Any] | None = None,
        bookmarks: str | list[str] | tuple[str, ...] | None = None,
        options: str | None = None,
        message_type: str | None = None,
    ) -> int:
        """A ``sow_delete`` by filter, SowKeys, data or bookmarks (:meth:`Client.sow_delete`)."""
        if bookmarks is not None:
            return self._queueing.ack(topic, bookmarks, action=options or "")
        given = [x is not None for x in (filter, sow_keys, data)]
        if sum(given) != 1:
            raise InvalidCommandError("sow_delete takes exactly one of filter=, sow_keys= or data=")
        conn = self._conn
        info = conn.known(topic, message_type)
        if info is None:
            return 0  # a topic in no configuration keeps no SOW: nothing to delete
        info.refuse_writes()

        name = self._published_name(info)
        command_id = uuid.uuid4().hex
        base: dict[str, str | None] = {
            h.COMMAND: h.SOW_DELETE,
            h.REPLY_TO: conn.reply_topic,
            h.COMMAND_ID: command_id,
            h.TOPIC: name,  # a Pattern topic: only this name's records
            h.IDENTITY: conn.identity or None,
        }
        if filter is not None:
            compile_filter(filter)  # a bad filter fails here, with its position
            for partition in range(info.partitions):
                conn.produce(
                    info.log_topic, None, partition=partition, headers={**base, h.FILTER: filter}
                )
            expected = info.partitions
        elif sow_keys is not None:
            for sow_key in sow_keys:
                conn.produce(info.log_topic, None, key=sow_key, headers=base)
            expected = len(sow_keys)
        else:
            raw, parsed = self._body(info, data)
            key = self._sow_key(info, parsed, None, name)
            conn.produce(info.log_topic, raw, key=key, headers=base)
            expected = 1
        conn.flush()
        return conn.await_acks(command_id, expected) if expected else 0
