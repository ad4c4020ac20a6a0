"""The command router: control-topic records decoded once into :class:`Command`s and answered.

A SOW topic's control topic reaches the router in batches (see :mod:`sowstream.engine.commands`):
consecutive queue acknowledgements are applied together, every other command is answered on
its own, in order. The shared control topic of topics created on first use reaches it one record
at a time: ``declare_topic`` goes to the auto-creation service, the rest to the topic's unit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import NamedTuple, Protocol

import orjson

from sowstream.auth import Authenticator
from sowstream.engine.commands import ControlRecord, runs
from sowstream.engine.gates import COMMANDS, Gates
from sowstream.engine.partition import PartitionMoved
from sowstream.engine.ports import Assignment, Sender, wall_clock_ms
from sowstream.engine.queries import TIMEOUT
from sowstream.engine.queues import NO_ANSWER, AckAnswer, QueueRuntime
from sowstream.engine.replies import ReplyWriter
from sowstream.engine.topology import Topology
from sowstream.engine.units.base import ControlInbox
from sowstream.engine.units.topic import TopicUnit
from sowstream.errors import (
    AuthenticationError,
    InvalidCommandError,
    SchemaVersionError,
    SowstreamError,
)
from sowstream.filters import FilterError
from sowstream.queues.credits import CREDIT_COMMAND
from sowstream.queues.machine import Bookmark
from sowstream.subscriptions.model import SUBSCRIBE_COMMANDS
from sowstream.wire import headers as h
from sowstream.wire.protocol import ACK, FAILURE, SOW, UNDERLYING, Command, Reply, ReplyRecord
from sowstream.wire.topics import TopicNames, topic_ident
from sowstream.wire.versions import SCHEMA_VERSION, check, version_of

log = logging.getLogger("sowstream.engine")

# Command.command values the router answers itself (the processor answers sow and subscribe).
STATUS = "status"
QUEUE_ACK = "queue_ack"
QUEUE_STATUS = "queue_status"
# Reply.reason of the router's failures.
UNKNOWN_COMMAND = "unknown_command"
UNKNOWN_TOPIC = "unknown_topic"
INVALID = "invalid"
NOT_DECLARED = "not_declared"
INTERNAL_ERROR = "internal_error"

ROWS_BATCH = 500  # status and queue rows per reply batch

# One command with the control partition it came on.
Addressed = tuple[Command, int]


class TopicCreation(Protocol):
    """What the router needs of topic auto-creation (:mod:`sowstream.engine.autotopics`)."""

    async def declare_topic(self, name: str, message_type: str = ...) -> str | None:
        """Create topic ``name`` (of ``message_type``, json by default) on first use unless it
        exists; why not, or None."""

    async def caught_up(self) -> None:
        """Wait until every topic created so far (by any worker) is known here."""


class Refused(NamedTuple):
    """A command read far enough to answer, refused before it is handled (its schema version)."""

    command: Command
    reason: str
    message: str


def decode_command(
    record: ControlRecord, names: TopicNames | None = None
) -> Command | Refused | None:
    """A control-topic record as a Command; Refused when its schema version is not accepted
    here (read as far as this side's schema goes, to answer it); None (logged) when it cannot
    be read at all, or (with ``names``) names no client's reply topic, so there is nobody to
    answer."""
    payload = record.value or b""
    problem: SchemaVersionError | None = None
    try:
        version = version_of(record.headers)
        check(version, "the command")
    except SchemaVersionError as exc:
        problem, version = exc, exc.written or 1
    try:
        cmd = Command.decode(payload, version)
    except Exception as exc:  # anything a foreign producer may send
        log.warning(
            "ignored undecodable command on %s[%d]@%d: %s%s",
            record.topic,
            record.partition,
            record.offset,
            exc,
            f" ({problem})" if problem is not None else "",
        )
        return None
    misdirected = names.reply_topic_problem(cmd.reply_to) if names is not None else None
    if misdirected is not None:
        log.warning(
            "ignored command %s on %s[%d]@%d: %s, so it cannot be answered",
            cmd.command_id,
            record.topic,
            record.partition,
            record.offset,
            misdirected,
        )
        return None
    if problem is not None:
        return Refused(cmd, SCHEMA_VERSION, str(problem))
    return cmd


class CommandRouter:
    """Answers the commands of this worker's control topics."""

    def __init__(
        self,
        topology: Topology,
        creation: TopicCreation,
        sender: Sender,
        assignment: Assignment,
        worker_name: str,
        gates: Gates | None = None,
        authenticator: Authenticator | None = None,
    ) -> None:
        """``gates``: test hooks (inactive in production); ``authenticator`` checks each
        command's credential (None: identities asserted)."""
        self._topology = topology
        self._gates = gates or Gates()
        self._creation = creation
        self._sender = sender
        self._assignment = assignment
        self._worker_name = worker_name
        self._authenticator = authenticator

    # -- control topics of configured topics: batches -------------------------------------------

    async def run(self) -> None:
        """Handle every configured topic's commands, batch by batch, for ever."""
        await asyncio.gather(
            *(
                self._serve(unit, unit.inbox)
                for unit in self._topology.static_topics
                if unit.inbox is not None
            )
        )

    async def _serve(self, unit: TopicUnit, inbox: ControlInbox) -> None:
        while True:
            batch = await inbox.take()
            await self._gates.passing(COMMANDS)
            try:
                await self.handle(unit, [record for _, record in batch])
            except Exception:  # one bad batch must not stop every later command
                log.exception("topic %s: handling commands failed", unit.topic.name)
            for ack, record in batch:
                # A record read while its partition is not held (a rebalance is running) stays
                # unacknowledged: its offset is not committed before the owner has read it.
                if self._holds(unit, record.partition):
                    await ack()

    async def handle(self, unit: TopicUnit, records: Sequence[ControlRecord]) -> None:
        """Handle control-topic records in order; consecutive queue acknowledgements together."""
        commands: list[Addressed] = []
        for record in records:
            read = decode_command(record, self._topology.ctx.names)
            held = self._holds(unit, record.partition)
            if isinstance(read, Refused):
                if held:
                    await self.refuse(
                        read.command, unit.topic.name, record.partition, read.reason, read.message
                    )
            elif read is not None:
                cmd = await self.authenticated(read, record, answer=held)
                if cmd is not None:
                    commands.append((cmd, record.partition))
        for run in runs(commands, self._is_queue_ack):
            try:
                if run.together:
                    await self._queue_acks(unit, run.items)
                else:
                    await self.answer(unit, *run.items[0])
            except Exception as exc:
                log.exception(
                    "topic %s: command %s failed", unit.topic.name, run.items[0][0].command_id
                )
                # The client is told rather than left to time out (an ack run may have stored
                # some removals: acknowledging again is harmless, they come back as acked).
                for cmd, partition in run.items:
                    await self.refuse(
                        cmd, unit.topic.name, partition, INTERNAL_ERROR, f"the engine failed: {exc}"
                    )

    async def refuse(
        self, cmd: Command, topic: str, partition: int, reason: str, message: str
    ) -> None:
        """Answer ``cmd`` with a failure naming ``reason``, in the form its client waits for: a
        failed ``ack`` for acknowledgements and topic declarations, a failed ``part_end`` for
        everything else."""
        if cmd.command in (QUEUE_ACK, h.DECLARE_TOPIC):
            if cmd.option("ack_type") == NO_ANSWER:
                return
            answer = Reply(
                command=ACK,
                command_id=cmd.command_id,
                query_id=cmd.query_id,
                topic=cmd.topic,
                partition=partition,
                status=FAILURE,
                reason=reason,
                message=message,
            )
            await ReplyWriter(self._sender, cmd.reply_to, answer).send(answer)
            return
        await ReplyWriter.for_command(self._sender, cmd, topic, partition).failure(reason, message)

    async def authenticated(
        self, cmd: Command, record: ControlRecord, *, answer: bool = True
    ) -> Command | None:
        """``cmd`` acting as the identity its credential proves; None once refused (with
        ``answer``, the client is told the reason, so a refusal never looks like silence)."""
        authenticator = self._authenticator
        if authenticator is None or not authenticator.enabled:
            return cmd
        try:
            identity = authenticator.identify(
                record.credential,
                cmd.identity,
                record.topic,
                record.key,
                record.value,
                wall_clock_ms(),
            )
        except AuthenticationError as exc:
            log.warning(
                "refused command %s on %s[%d]: %s",
                cmd.command_id,
                record.topic,
                record.partition,
                exc,
            )
            if answer:
                await self.refuse(cmd, cmd.topic, record.partition, exc.reason, str(exc))
            return None
        return cmd if identity == cmd.identity else cmd.with_(identity=identity)

    def _is_queue_ack(self, item: Addressed) -> bool:
        cmd = item[0]
        return (
            cmd.command == QUEUE_ACK
            and topic_ident(cmd.topic, cmd.message_type) in self._topology.queues
        )

    # -- the shared control topic of topics created on first use: one by one --------------------

    async def auto_command(self, record: ControlRecord) -> None:
        """A command on the shared control topic: create a topic, or one for a created topic."""
        read = decode_command(record, self._topology.ctx.names)
        if read is None:
            return
        if not self._owns(record.topic, record.partition):
            log.info(
                "%s partition %d is not held here: its command is left to its owner",
                record.topic,
                record.partition,
            )
            return
        if isinstance(read, Refused):
            refused = read.command
            await self.refuse(refused, refused.topic, record.partition, read.reason, read.message)
            return
        cmd = await self.authenticated(read, record)
        if cmd is None:
            return
        if cmd.command == h.DECLARE_TOPIC:
            await self._declare(cmd, record.partition)
            return
        ident = topic_ident(cmd.topic, cmd.message_type)
        underlying = cmd.option(UNDERLYING)
        if underlying and ident in self._topology.queues:
            # About a queue, for one of its topics created on first use (they share this
            # control topic, so the command names which).
            ident = topic_ident(underlying, cmd.message_type)
        unit = self._topology.topics.get(ident)
        if unit is None:
            await self._creation.caught_up()  # created by another worker a moment ago?
            unit = self._topology.topics.get(ident)
        if unit is None:
            writer = ReplyWriter.for_command(self._sender, cmd, cmd.topic, record.partition)
            named = underlying if underlying and ident != cmd.topic else cmd.topic
            await writer.failure(UNKNOWN_TOPIC, f"topic {named!r} is not known to the engine")
            return
        if unit.feeds_queues and self._is_queue_ack((cmd, record.partition)):
            await self._queue_acks(unit, [(cmd, record.partition)])
            return
        await self.answer(unit, cmd, record.partition)

    async def _declare(self, cmd: Command, partition: int) -> None:
        """Create a topic on first use (or refuse to), then acknowledge: its definition is on the
        meta topic by then, so the client can read it at once."""
        answer = Reply(
            command=ACK,
            command_id=cmd.command_id,
            topic=cmd.topic,
            partition=partition,
            log_offset=-1,
            count=1,
        )
        problem = await self._creation.declare_topic(cmd.topic, cmd.message_type)
        if problem is not None:
            answer = answer.with_(status=FAILURE, reason=NOT_DECLARED, message=problem, count=0)
        await ReplyWriter(self._sender, cmd.reply_to, answer).send(answer)

    # -- one command ------------------------------------------------------------------------------

    async def answer(self, unit: TopicUnit, cmd: Command, partition: int) -> None:
        """Answer one partition's share of a command about ``unit``'s topic, if this worker
        holds the partition: a command read during a rebalance, or by a worker the partition
        has just left, loads nothing here (no "ghost" partition outside the assignment) and is
        left unanswered; the partition's owner reads it again from the last committed offset
        once the rebalance is over, and answers it."""
        if not self._holds(unit, partition):
            log.info(
                "topic %s partition %d is not held here: command %s is left to its owner",
                unit.topic.name,
                partition,
                cmd.command_id,
            )
            return
        proc = unit.proc
        queue = (
            self._topology.queues.get(topic_ident(cmd.topic, cmd.message_type))
            if unit.feeds_queues
            else None
        )
        if cmd.command == STATUS:
            await self._status(unit, cmd, partition)
        elif queue is not None:
            await self._queue_command(unit, queue, cmd, partition)
        elif cmd.command == SOW:
            await proc.query(cmd, partition)
        elif cmd.command in SUBSCRIBE_COMMANDS:
            await proc.subscribe(cmd, partition)
        elif cmd.command in (QUEUE_ACK, QUEUE_STATUS):
            await self.refuse(
                cmd,
                proc.topic.name,
                partition,
                INVALID,
                f"{cmd.command} on {cmd.topic!r}, which is not a queue: it takes a queue's name",
            )
        else:
            await self.refuse(
                cmd, proc.topic.name, partition, UNKNOWN_COMMAND, f"unknown command {cmd.command!r}"
            )

    async def _status(self, unit: TopicUnit, cmd: Command, partition: int) -> None:
        """The partition's row of ``sowstream status``, from the worker holding it."""
        row = {**await unit.proc.partition_status(partition), "worker": self._worker_name}
        writer = ReplyWriter.for_command(self._sender, cmd, unit.topic.name, partition)
        count = await writer.records([ReplyRecord("", orjson.dumps(row), 0, -1)], ROWS_BATCH)
        await writer.end(count)

    async def _queue_command(
        self, unit: TopicUnit, queue: QueueRuntime, cmd: Command, partition: int
    ) -> None:
        """A command on a queue, answered for the queue messages of one log partition.

        The answer names the underlying topic, not the queue: a queue over several topics gets
        one answer per (topic, partition), and clients tell the answers apart by that pair."""
        topic = unit.topic.name
        if cmd.command == CREDIT_COMMAND:
            try:
                queue.credit(cmd, topic, partition)
            except InvalidCommandError as exc:
                log.warning("topic %s partition %d: %s", topic, partition, exc)
            return  # a grant has no answer: the subscriber's next report shows it
        writer = ReplyWriter.for_command(self._sender, cmd, topic, partition)
        try:
            if cmd.command == SOW:
                found = queue.browse(topic, partition, cmd.filter, cmd.identity)
            elif cmd.command == QUEUE_STATUS:
                status = queue.status(topic, partition)
                found = [("", orjson.dumps({"topic": topic, **status}), 0)]
            else:
                raise InvalidCommandError(
                    f"{cmd.command} is not available on queue {queue.name!r}: use subscribe to "
                    "lease its messages and sow to browse them"
                )
        except (InvalidCommandError, FilterError) as exc:
            await writer.failure(INVALID, str(exc))
            return
        rows = (ReplyRecord(key, data, ts, -1) for key, data, ts in found)
        await writer.end(await writer.records(rows, ROWS_BATCH))

    # -- queue acknowledgements, together ---------------------------------------------------------

    async def _queue_acks(self, unit: TopicUnit, commands: list[Addressed]) -> None:
        """Apply ``queue_ack`` commands together: per queue one pass and one store write per log
        partition; then each command is answered (unless it asked for no answer).

        An answer says the acknowledgement is stored for good; it is sent only when the group
        is still at the generation the partitions were held under (``still_current``): a worker
        the group went on without writes what no later owner reads."""
        topic = unit.topic.name
        generation = self._assignment.generation
        by_queue: dict[str, list[Addressed]] = {}
        for cmd, partition in await self._held_acks(unit, commands):
            by_queue.setdefault(topic_ident(cmd.topic, cmd.message_type), []).append(
                (cmd, partition)
            )
        for name, acks in by_queue.items():
            outcomes = await self._topology.queues[name].acknowledge_all(acks, topic)
            # Only answers need the check: acknowledgements sent with no answer wanted (a
            # client acking as it goes) cost no round trip to the coordinator.
            answered = any(
                isinstance(o, AckAnswer) and cmd.option("ack_type") != NO_ANSWER
                for (cmd, _), o in zip(acks, outcomes, strict=True)
            )
            if answered and not await self._assignment.still_current(generation):
                log.warning(
                    "topic %s: the group moved past generation %d while queue %s's "
                    "acknowledgements were stored: left unanswered, for the owner to answer",
                    topic,
                    generation,
                    name,
                )
                outcomes = [o if isinstance(o, InvalidCommandError) else None for o in outcomes]
            for (cmd, partition), outcome in zip(acks, outcomes, strict=True):
                if outcome is None:
                    # Not stored (the partition moved meanwhile): no answer, so no client takes
                    # it as done; the command is read again by the partition's next owner.
                    log.info(
                        "topic %s partition %d: queue ack left to the next owner", topic, partition
                    )
                    continue
                if cmd.option("ack_type") == NO_ANSWER:
                    continue
                # One answer per log partition: a command read twice after a rebalance is
                # answered twice, and the client counts (topic, partition) once.
                base = Reply(
                    command=ACK,
                    command_id=cmd.command_id,
                    query_id=cmd.query_id,
                    topic=topic,
                    partition=partition,
                )
                if isinstance(outcome, InvalidCommandError):
                    answer = base.with_(
                        topic=name, status=FAILURE, reason=INVALID, message=str(outcome)
                    )
                else:
                    count, results = outcome
                    answer = base.with_(
                        log_offset=0, count=count, message=orjson.dumps(results).decode()
                    )
                await ReplyWriter(self._sender, cmd.reply_to, base).send(answer)

    async def _held_acks(self, unit: TopicUnit, commands: list[Addressed]) -> list[Addressed]:
        """The acknowledgements this worker applies: those of log partitions it holds, once each
        is loaded and has applied the messages they name (``caught_up``). An ack applied
        earlier would be taken for one sent ahead of its message: deferred, answered 0, and the
        message dropped as acknowledged when the partition loads it or reads it from the log.
        The others are left unanswered, for the partition's owner (a read again) to answer."""
        proc = unit.proc
        highest: dict[int, int] = {}
        for cmd, partition in commands:
            top = highest.get(partition, -1)
            for text in (cmd.option("bookmarks") or "").split(","):
                try:
                    b = Bookmark.parse(text)
                except ValueError:
                    continue  # refused with its reason by the queue
                if b.topic == proc.topic.name and b.partition == partition:
                    top = max(top, b.offset)
            highest[partition] = top
        held = set()
        for partition, offset in sorted(highest.items()):
            if not self._holds(unit, partition):
                log.info(
                    "topic %s partition %d: not held here, its queue acknowledgements are left "
                    "to its owner",
                    proc.topic.name,
                    partition,
                )
                continue
            try:
                await proc.caught_up(partition, offset)
            except PartitionMoved:
                continue
            except SowstreamError as exc:
                # Held here but the log is not applied that far in time: nobody else will
                # answer, so the client is told (it may acknowledge again).
                for cmd, at in commands:
                    if at == partition:
                        await self.refuse(cmd, proc.topic.name, partition, TIMEOUT, str(exc))
                continue
            held.add(partition)
        return [item for item in commands if item[1] in held]

    def _holds(self, unit: TopicUnit, partition: int) -> bool:
        """Whether this worker is assigned ``unit``'s control partition ``partition`` (so its log
        partition) and no rebalance or recovery runs: only then may a command load it (during a
        rebalance the assignment still lists partitions already revoked)."""
        return self._owns(unit.ctl_topic, partition)

    def _owns(self, ctl_topic: str, partition: int) -> bool:
        return self._assignment.settled and self._assignment.owns(ctl_topic, partition)
