"""The real processor and the real client-side subscription, wired together without Kafka.

``Harness`` runs a ``TopicProcessor`` on in-memory partition stores and feeds everything it sends
(live messages and command replies) into the client's ``Subscription``, the way the client's
reply reader does. ``Cache`` is what an application builds from the messages it receives
(publish replaces, delta merges, oof removes), so tests can compare it with the SOW.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from sowstream.client.messages import Message
from sowstream.client.subscription import Subscription, _Live
from sowstream.config.models import TopicConfig
from sowstream.engine.processor import TopicProcessor
from sowstream.engine.store import MemoryPartition, PartitionStore
from sowstream.filters import compile_filter
from sowstream.filters.order_by import parse_order_by
from sowstream.messagetypes.changes import merge_delta
from sowstream.sow.aggregate import parse_aggregation
from sowstream.sow.aggregate.live import group_sow_key
from sowstream.sow.compiled import compile_topic
from sowstream.sow.ops import RawRecord
from sowstream.subscriptions.delta import project
from sowstream.subscriptions.model import DELTA_SUBSCRIBE, WITH_SOW, SubscriptionSpec
from sowstream.subscriptions.options import SubscriptionOptions
from sowstream.subscriptions.window import PageWindow, ResultSet
from sowstream.wire.avro import decode
from sowstream.wire.protocol import Command
from sowstream.wire.topics import TopicNames
from tests.support.sender import RecordingSender


def without_nulls(value: Any) -> Any:
    """A delta says "field removed" with null; the subscriber's record simply lacks it."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    return value


class Cache:
    """An application's copy of what it subscribed to, built from the messages it received.

    A ``delta_subscribe`` without a SOW part gets deltas for records that were in focus before it
    subscribed (AMPS sends the key and the changed fields): with ``partial_ok`` such records are
    kept apart as ``partial``; otherwise a delta for a record the cache lacks is an error.
    """

    def __init__(
        self,
        *,
        partial_ok: bool = False,
        held_only: bool = False,
        oof_last: bool = False,
        key_of: Callable[[Message], str] | None = None,
    ) -> None:
        """``held_only``: an ``oof`` must name a record the cache holds (true when the
        subscriber saw the whole picture: a SOW part on every partition); ``oof_last``: every
        ``oof`` body must be the state held (conflation: the last state the subscriber received;
        without it, reason ``match`` carries the new state instead); ``key_of``: how the
        application names the record a message is about (by default its SowKey; an application
        may read the key fields in the body instead)."""
        self.key_of = key_of or (lambda msg: msg.sow_key)
        self.records: dict[str, Any] = {}
        self.partial: set[str] = set()
        self.partial_ok = partial_ok
        self.held_only = held_only
        self.oof_last = oof_last

    def apply(self, msg: Message) -> None:
        if msg.command not in ("oof", "sow", "publish"):
            return  # group_begin, group_end: about no record
        key = self.key_of(msg)
        if msg.command == "oof":
            held = self.records.get(key)
            if self.held_only:
                assert held is not None, (
                    f"an oof ({msg.reason}, at {msg.bookmark}) for record {key}, "
                    "which the subscriber lacks"
                )
            if (
                held is not None
                and key not in self.partial
                and (self.oof_last or msg.reason != "match")
            ):
                body = without_nulls(msg.json())
                assert body == without_nulls(held), (
                    f"the oof for {key} carries {body}, the subscriber holds {held}"
                )
            self.records.pop(key, None)
            self.partial.discard(key)
        elif msg.command in ("sow", "publish"):
            if msg.delta and key not in self.records:
                assert self.partial_ok, f"a delta for record {key}, which the subscriber lacks"
                self.partial.add(key)
                self.records[key] = msg.json()
            elif msg.delta:
                self.records[key] = merge_delta(self.records[key], msg.json())
            else:
                self.records[key] = msg.json()
                self.partial.discard(key)

    def drain(self, sub: Subscription) -> None:
        while (msg := sub.next(timeout=0)) is not None:
            self.apply(msg)

    def view(self) -> dict[str, Any]:
        return {k: without_nulls(v) for k, v in self.records.items()}


def _kept_stores(
    stores: dict[int, MemoryPartition], topic: TopicConfig, sender: RecordingSender
) -> TopicProcessor:
    """A processor whose partition stores outlive it, as RocksDB does a worker's crash."""

    def new_store(partition: int) -> PartitionStore:
        return stores.setdefault(partition, MemoryPartition())

    return TopicProcessor(compile_topic(topic), TopicNames("p"), sender, new_store=new_store)


class Harness:
    """One subscription on a processor, from registration through placement to live traffic."""

    def __init__(
        self,
        topic: TopicConfig,
        command: str,
        filter: str | None,
        user: SubscriptionOptions,
        *,
        order_by: str | None = None,
        key_of: Callable[[Message], str] | None = None,
    ) -> None:
        """``key_of``: how the subscriber's cache names records (see :class:`Cache`)."""
        self.topic = topic
        self.sender = RecordingSender()
        self.stores: dict[int, MemoryPartition] = {}
        self.proc = _kept_stores(self.stores, topic, self.sender)
        self.log: list[RawRecord] = []
        self.user = user
        self.command = command
        self.filter = filter
        self.order_by = order_by
        paginated = user.top_n is not None
        # As the client does: a window needs the whole filtered stream, with every leave.
        wire = user.with_(oof=True, select=None, no_empties=False) if paginated else user
        self.spec = SubscriptionSpec("s", "r", topic.name, command, filter, wire, "", order_by)
        window = None
        if paginated:
            assert user.top_n is not None
            results = ResultSet(parse_order_by(order_by) if order_by else ())
            window = PageWindow(results, user.top_n, user.skip_n or 0)
        self.aggregation = (
            parse_aggregation(user.grouping, user.projection) if user.aggregated else None
        )
        self.sub = Subscription(
            "s",
            [self.spec],
            user,
            key_fields={topic.name: topic.delta_keys},
            window=window,
            aggregation=self.aggregation,
        )
        self.cache = Cache(
            partial_ok=command == DELTA_SUBSCRIBE,
            held_only=command in WITH_SOW,
            oof_last=user.conflation_ms is not None and not paginated,
            key_of=key_of,
        )
        self._group: list[Message] = []
        self._partials: dict[int, dict[str, Any]] = {}
        self._placed: set[int] = set()

    @property
    def placed(self) -> bool:
        return len(self._placed) == self.topic.partitions

    async def start(self) -> None:
        """The worker takes every partition (records reach only partitions it has loaded)."""
        for partition in range(self.topic.partitions):
            await self.proc.ready(partition)

    def register(self) -> None:
        """The registry record reaches the worker (it may come before the placement)."""
        self.proc.subs.upsert(self.spec)

    async def place(self, partition: int) -> None:
        """The placement command runs on ``partition``."""
        await self.proc.subscribe(
            Command(
                command=self.command,
                command_id="c",
                query_id="q",
                reply_to="r",
                topic=self.topic.name,
                filter=self.filter,
                order_by=self.order_by,
                batch_size=10,
                sub_id="s",
                sub_options=self.spec.options.to_text(),
            ),
            partition,
        )
        self.pump()

    async def apply(self, records: list[RawRecord]) -> None:
        self.log.extend(records)
        await self.proc.process(records)
        self.pump()

    async def crash(self) -> None:
        """The worker dies (what it sent is out, what it had not stored is lost) and a new one
        takes every partition: it loads what the stores hold, learns the subscription from the
        registry and reads the log on from each partition's stored watermark."""
        for task in [ps.committer for _, ps in self.proc.table.states() if ps.committer]:
            task.cancel()
        self.pump()
        self.proc = _kept_stores(self.stores, self.topic, self.sender)
        await self.start()  # before the registry is read, as a worker's timer may do
        self.register()
        marks = {p: ps.watermark for p, ps in self.proc.table.states()}
        await self.proc.process([r for r in self.log if r.offset > marks[r.partition]])
        self.pump()

    async def flush(self) -> None:
        """Every conflation interval ends now."""
        await self.proc.drain()
        await self.proc.flush_conflated(10**15)
        self.pump()

    def pump(self) -> None:
        """Hand what the processor sent to the client, as its reply reader would."""
        for value, headers in self.sender.take():
            if headers is not None:
                self.sub.on_live(_Live.from_headers(value, headers))
                continue
            reply = decode("Reply", value)
            assert reply["status"] == "success", reply
            if reply["command"] == "partial":
                for r in reply["records"]:
                    self._partials.setdefault(reply["partition"], {}).update(
                        orjson.loads(r["data"])
                    )
            elif reply["command"] == "sow":
                self._group.extend(
                    Message("sow", reply["topic"], r["sow_key"], data=r["data"])
                    for r in reply["records"]
                )
            elif reply["command"] == "part_end" and self.sub.aggregated:
                # As Subscribing.place does for an aggregated subscription.
                partition = reply["partition"]
                self.sub.reset_partition(reply["topic"], partition, reply["log_offset"])
                self.sub.load_groups(reply["topic"], partition, self._partials.pop(partition, {}))
                self._placed.add(partition)
                if self.placed:
                    group = [Message("group_begin"), Message("group_end")]
                    self.sub.deliver_groups(iter(group), with_sow=self.command in WITH_SOW)
                    self.sub.release()
            elif reply["command"] == "part_end":
                self.sub.set_cut(reply["topic"], reply["partition"], reply["log_offset"])
                self._placed.add(reply["partition"])
                if self.placed:
                    group = [Message("group_begin"), *self._group, Message("group_end")]
                    if self.command in WITH_SOW:
                        self.sub.deliver_group(iter(group))
                    self.sub.release()
        self.cache.drain(self.sub)

    def expected(self, sow: dict[str, Any]) -> dict[str, Any]:
        """What the subscriber must hold when it is up to date with ``sow`` (key -> body)."""
        flt = compile_filter(self.filter) if self.filter else None
        matching = {k: v for k, v in sow.items() if flt is None or flt.matches(v)}
        if self.aggregation is not None:
            agg = self.aggregation
            partials = agg.partial(matching.values())
            return {
                group_sow_key(self.topic.name, key): without_nulls(agg.finish_group(entry))
                for key, entry in partials.items()
            }
        if self.user.top_n is not None:
            results = ResultSet(parse_order_by(self.order_by) if self.order_by else ())
            for key, body in matching.items():
                results.upsert(key, body)
            window = PageWindow(results, self.user.top_n, self.user.skip_n or 0)
            window.reset()
            matching = dict(window.records())
        select = self.user.select
        return {
            k: without_nulls(v if select is None else project(v, select))
            for k, v in matching.items()
        }


def body_of(record: RawRecord) -> Any:
    return orjson.loads(record.value) if record.value else None
