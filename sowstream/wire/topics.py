"""Names of the Kafka topics sowstream uses, all under one prefix so engines can share a cluster."""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_PREFIX = "sowstream"

_KAFKA_SAFE = re.compile(r"[A-Za-z0-9._-]+")


def kafka_part(name: str) -> str:
    """The form of an AMPS topic name inside Kafka topic names (and file names).

    A name Kafka accepts (letters, digits, ``.``, ``_``, ``-``) is used as it is. Any other, such
    as ``/ett/order``, is written with ``_`` in front and each character Kafka refuses escaped:
    ``_`` as ``__``, ``/`` as ``_-``, anything else as ``_x`` and the two hex digits of each of its
    UTF-8 bytes, so ``/ett/order`` becomes ``__-ett_-order``. :func:`name_of_kafka_part` reverses
    it; the configuration refuses two topics whose forms would be the same.
    """
    if _KAFKA_SAFE.fullmatch(name):
        return name
    out = ["_"]
    for char in name:
        if char == "_":
            out.append("__")
        elif char == "/":
            out.append("_-")
        elif _KAFKA_SAFE.fullmatch(char):
            out.append(char)
        else:
            out.extend(f"_x{byte:02X}" for byte in char.encode())
    return "".join(out)


def name_of_kafka_part(part: str) -> str:
    """The topic name ``part`` stands for (the inverse of :func:`kafka_part`)."""
    if not part.startswith("_"):
        return part
    raw = bytearray()
    i = 1
    while i < len(part):
        char = part[i]
        if char != "_":
            raw += char.encode()
            i += 1
            continue
        mark = part[i + 1 : i + 2]
        if mark == "_":
            raw += b"_"
            i += 2
        elif mark == "-":
            raw += b"/"
            i += 2
        elif mark == "x" and len(part) >= i + 4:
            raw.append(int(part[i + 2 : i + 4], 16))
            i += 4
        else:
            raise ValueError(f"{part!r} is not an encoded topic name (at position {i})")
    return raw.decode()


JSON = "json"


def topic_ident(name: str, message_type: str = JSON) -> str:
    """How the engine tells topics apart: AMPS scopes a topic by its message type, so a json and
    an nvfix topic may both be called ``orders``. A json topic is known by its name alone (as it
    always was); any other by ``<type>:<name>``, e.g. ``nvfix:orders``. The configuration refuses a
    json topic whose name would equal another topic's identity."""
    return name if message_type == JSON else f"{message_type}:{name}"


def kafka_topic_part(name: str, message_type: str = JSON) -> str:
    """A topic's part of the Kafka topic names: :func:`kafka_part` of its name, after
    ``<type>.`` for message types other than json (json topics keep the names they always had:
    ``sowstream.log.orders``; an nvfix topic ``orders`` has ``sowstream.log.nvfix.orders``)."""
    part = kafka_part(name)
    return part if message_type == JSON else f"{message_type}.{part}"


@dataclass(frozen=True)
class TopicNames:
    """The Kafka topic names under one prefix."""

    prefix: str = DEFAULT_PREFIX

    def log(self, sow_topic: str, message_type: str = JSON) -> str:
        """The transaction log of a SOW topic: every publish, delta and delete, keyed by SowKey."""
        return f"{self.prefix}.log.{kafka_topic_part(sow_topic, message_type)}"

    def control(self, sow_topic: str, message_type: str = JSON) -> str:
        """Commands that read a SOW topic (queries); co-partitioned with its log."""
        return f"{self.prefix}.ctl.{kafka_topic_part(sow_topic, message_type)}"

    @property
    def auto_control(self) -> str:
        """Commands for every topic the engine created on first use (one shared control topic:
        those topics all have the same partition count), and the requests that create them."""
        return f"{self.prefix}.ctl-auto"

    @property
    def meta(self) -> str:
        """Compacted topic holding each SOW topic's definition, for clients."""
        return f"{self.prefix}.meta"

    @property
    def dead_letter(self) -> str:
        """Rejected log records with the reason."""
        return f"{self.prefix}.deadletter"

    @property
    def workers(self) -> str:
        """Compacted topic of worker announcements (``sowstream status``), keyed by worker."""
        return f"{self.prefix}.workers"

    @property
    def subscriptions(self) -> str:
        """Compacted registry of live subscriptions, read by every worker."""
        return f"{self.prefix}.subs"

    def queue_expired(self, queue: str) -> str:
        """Expiry events of a queue (time limit, forced, MaxCancels, MaxDeliveries) as JSON."""
        return f"{self.prefix}.queue.{kafka_part(queue)}.expired"

    def queue_positions(self, queue: str) -> str:
        """Where the workers serving a queue with barriers tell each other how far each of
        their partitions is (sowstream.queues.barriers.PartitionPosition, JSON)."""
        return f"{self.prefix}.queue.{kafka_part(queue)}.positions"

    def view_input(self, view: str, message_type: str = JSON) -> str:
        """Change events of a view's underlying topics, keyed by the view's routing key."""
        return f"{self.prefix}.view-in.{kafka_topic_part(view, message_type)}"

    def reply(self, client_id: str) -> str:
        """A client's private reply topic."""
        return f"{self.prefix}.reply.{client_id}"

    def reply_topic_problem(self, topic: str) -> str | None:
        """Why the engine must not write replies to ``topic``, or None for a client's reply topic.

        Commands and registrations name where their answers go: written anywhere else, they
        would put engine records into a log, a changelog or another topic of the engine's."""
        stem = f"{self.prefix}.reply."
        if topic.startswith(stem) and len(topic) > len(stem):
            return None
        return f"reply topic {topic!r} is not a client's reply topic ({stem}<client>)"
