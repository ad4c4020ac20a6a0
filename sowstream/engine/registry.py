"""The worker's view of the subscription registry: the compacted ``<prefix>.subs`` topic.

Clients write a ``Subscription`` record there before placing a subscription and a tombstone when
they unsubscribe; every worker reads the whole topic, so whichever worker owns a partition after a
restart or rebalance serves the subscriptions that exist. The engine itself writes tombstones for
clients that went away or were dropped by the slow-consumer policy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition

from sowstream.auth import Authenticator
from sowstream.errors import AuthenticationError, SchemaVersionError, SowstreamError
from sowstream.filters import FilterError
from sowstream.subscriptions.model import (
    BAD_FILTER,
    BAD_OPTION,
    BAD_REGISTRATION,
    SubscriptionSpec,
)
from sowstream.wire import headers as h
from sowstream.wire.avro import encode
from sowstream.wire.kafka import producer_config
from sowstream.wire.leases import PACKED_V1
from sowstream.wire.versions import (
    PRODUCE_HEADERS,
    SCHEMA_VERSION,
    check,
    decode_versioned,
    version_of,
)

log = logging.getLogger("sowstream.engine")

# Called with (registry key, spec or None for a tombstone).
Apply = Callable[[str, SubscriptionSpec | None], None]
# Called for a registration read but not accepted: (key, its fields as far as they were read,
# the reason's code, the text).
Refuse = Callable[[str, Mapping[str, Any], str, str], None]


# The longest a placement waits for this worker to read the registration it follows (the reader
# may be behind while the broker is away): then it goes ahead, as it did before it waited.
REGISTRY_WAIT_SECONDS = 10.0


class RegistryProgress:
    """How far this worker has read the subscription registry.

    A client that places a subscription names the registry offset of its registration. The
    placement command travels on a control topic and can overtake the registry: placed before the
    worker read an earlier removal of the same key (the engine ended the subscription, the client
    placed it again), the removal would end the new placement, and changes until the new
    registration is read would reach nobody. So a placement first waits for the registry."""

    def __init__(self) -> None:
        self.position = 0  # the next registry offset to read
        self._moved = asyncio.Event()

    def advance(self, position: int) -> None:
        """The registry is read up to (not including) ``position``."""
        if position > self.position:
            self.position = position
            moved, self._moved = self._moved, asyncio.Event()
            moved.set()

    async def wait_past(self, offset: int, timeout: float = REGISTRY_WAIT_SECONDS) -> bool:
        """Wait until the record at ``offset`` is read; False if it is not within ``timeout``."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self.position <= offset:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._moved.wait(), remaining)
            except TimeoutError:
                return False
        return True


class SubscriptionRegistry:
    """Follows the registry topic and reports every registration and removal to ``apply``."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        extra: Mapping[str, str],
        apply: Apply,
        *,
        refuse: Refuse | None = None,
        loaded: asyncio.Event | None = None,
        authenticator: Authenticator | None = None,
        reply_topic_problem: Callable[[str], str | None] | None = None,
        progress: RegistryProgress | None = None,
    ) -> None:
        """``authenticator`` checks each registration's credential (None: identities are
        asserted); ``reply_topic_problem`` says why a registration's reply topic is none a
        client has (:meth:`~sowstream.wire.topics.TopicNames.reply_topic_problem`)."""
        self.topic = topic
        self._authenticator = authenticator
        self._reply_topic_problem = reply_topic_problem or (lambda topic: None)
        self.progress = progress or RegistryProgress()
        self._bootstrap = bootstrap
        self._extra = dict(extra)
        self._apply = apply
        self._refuse = refuse
        # Set once every registration written before the start is applied.
        self.loaded = loaded if loaded is not None else asyncio.Event()
        self._producer: Producer | None = None
        # Registry keys whose registration asks for packed queue deliveries in a layout this
        # worker writes (header sow.packed): known when the registration is applied.
        self.packed: set[str] = set()

    def _consumer(self) -> Consumer:
        return Consumer(
            {
                "bootstrap.servers": self._bootstrap,
                "group.id": "sowstream-registry",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 20,
                "log_level": 4,
                **self._extra,
            }
        )

    def _handle(self, msg: Any) -> None:
        key = (msg.key() or b"").decode("utf-8", "replace")
        value = msg.value()
        self.packed.discard(key)
        if value is None:
            self._apply(key, None)
            return
        headers = h.header_map(msg.headers())
        problem: SchemaVersionError | None = None
        try:
            version = version_of(headers)
            check(version, "the registration")
        except SchemaVersionError as exc:
            problem, version = exc, exc.written or 1
        try:
            raw = decode_versioned("Subscription", value, version)
        except Exception as exc:  # not a Subscription record: its key may say whom to tell
            log.warning("ignored unreadable registration %r on %s: %s", key, self.topic, exc)
            addressed = addressee(key)
            if addressed is not None and not self._reply_topic_problem(addressed["reply_to"]):
                self._refused(
                    key,
                    addressed,
                    BAD_REGISTRATION,
                    f"registration {key!r} is not a Subscription record of protocol schema "
                    f"version {version} ({type(exc).__name__}: {exc}); the engine keeps "
                    "none of it: write the registration again",
                )
            return
        if problem is not None:
            self._refused(key, raw, SCHEMA_VERSION, str(problem))
            return
        misdirected = self._reply_topic_problem(str(raw.get("reply_to", "")))
        if misdirected is not None:
            # Nobody to tell: a refusal would go where the registration points.
            log.warning("ignored registration %r on %s: %s", key, self.topic, misdirected)
            return
        try:
            spec = SubscriptionSpec.from_wire(raw)
        except (SowstreamError, FilterError, ValueError, KeyError) as exc:
            self._refused(
                key, raw, BAD_FILTER if isinstance(exc, FilterError) else BAD_OPTION, str(exc)
            )
            return
        auth = self._authenticator
        if auth is not None and auth.enabled:
            # Checked against the time the registration was written, so a worker reading the
            # registry again after a restart decides as the first one did.
            try:
                identity = auth.identify(
                    headers.get(h.CREDENTIAL),
                    spec.identity,
                    self.topic,
                    msg.key(),
                    value,
                    msg.timestamp()[1],
                )
            except AuthenticationError as exc:
                self._refused(key, raw, exc.reason, str(exc))
                self._apply(key, None)  # an earlier registration under this key ends too
                return
            if identity != spec.identity:
                spec = replace(spec, identity=identity)
        if headers.get(h.PACKED) == PACKED_V1:
            self.packed.add(key)
        self._apply(key, spec)

    def _refused(self, key: str, raw: Mapping[str, Any], reason: str, text: str) -> None:
        log.warning("refused registration %r on %s: %s", key, self.topic, text)
        if self._refuse is not None:
            self._refuse(key, raw, reason, text)

    async def run(self) -> None:
        """Read the registry from the start, then follow it until cancelled."""
        loop = asyncio.get_running_loop()
        consumer = self._consumer()
        try:
            tp = TopicPartition(self.topic, 0)
            _, end = await loop.run_in_executor(
                None, lambda: consumer.get_watermark_offsets(tp, timeout=30)
            )
            consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
            position = 0
            if end <= 0:
                self.loaded.set()
            while True:
                msgs = await loop.run_in_executor(None, poll_batch, consumer)
                for msg in msgs:
                    if msg.error():
                        continue
                    self._handle(msg)
                    position = (msg.offset() or 0) + 1
                self.progress.advance(position)
                if not self.loaded.is_set() and position >= end:
                    self.loaded.set()
        finally:
            await loop.run_in_executor(None, consumer.close)

    def write(self, spec: SubscriptionSpec, *, remove: bool = False) -> None:
        """Write (or, with ``remove``, tombstone) a registration; used for dropped clients."""
        if self._producer is None:
            self._producer = Producer(producer_config(self._bootstrap, self._extra))
        value = None if remove else encode("Subscription", spec.to_wire())
        try:
            self._producer.produce(
                self.topic, key=spec.key.encode(), value=value, headers=PRODUCE_HEADERS
            )
            self._producer.poll(0)
        except (KafkaException, BufferError) as exc:
            log.warning("could not update the subscription registry for %s: %s", spec.key, exc)

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until what :meth:`write` produced is in Kafka (blocking: run it in an executor).

        A client told its subscription ended registers it again: the engine's tombstone must
        be on the registry before the client can hear of it, or it could land after the new
        registration and end that too."""
        if self._producer is not None and self._producer.flush(timeout):
            log.warning("subscription registry writes not acknowledged within %.0fs", timeout)


def addressee(key: str) -> dict[str, str] | None:
    """Whom an unreadable registration's key names (``reply_to|sub_id|topic``, the fields a
    refusal needs), or None when it names nobody."""
    parts = key.split("|")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        return None
    return {"reply_to": parts[0], "sub_id": parts[1], "topic": parts[2]}


def poll_batch(consumer: Consumer) -> list[Any]:
    """What is there to read, returning as soon as anything is (at most 0.1 s of waiting)."""
    first = consumer.poll(0.1)
    if first is None:
        return []
    return [first, *consumer.consume(500, 0)]
