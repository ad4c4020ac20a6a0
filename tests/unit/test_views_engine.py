"""Views in the engine without a broker: routing of change events, the maintainer's store
entries, and the whole path (topic processor → input topic → view runner → view log) under
duplicated events and restarts, against a recomputation from the underlying state.

The real ``TopicProcessor`` and ``ViewRunner`` run on in-memory stores; Kafka is replaced by
lists the senders append to (the input topic's offsets are list positions).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sowstream.config import load_config_text
from sowstream.config.views import ViewConfig
from sowstream.engine.processor import TopicProcessor
from sowstream.engine.store import MemoryPartition, is_record_key
from sowstream.engine.views import ViewRunner
from sowstream.errors import StateStoreError
from sowstream.sow.aggregate import StateError
from sowstream.sow.compiled import compile_topic
from sowstream.sow.ops import RawRecord
from sowstream.sow.record import SowRecord
from sowstream.views.maintainer import ViewMaintainer
from sowstream.views.routing import ViewFeed, input_partitions, join_route_paths
from sowstream.wire import headers as h
from sowstream.wire.topics import TopicNames
from tests.support.expiry import expire_through_log
from tests.support.sender import RecordingSender
from tests.unit.test_processor_model import TOPIC, key_of, op, to_records

VIEW = ViewConfig(
    name="V",
    underlying_topic="t",
    projection=("/g AS /g", "SUM(/v) AS /s", "COUNT(/id) AS /n"),
    grouping=("/g",),
    filter="/v IS NULL OR /v < 8",
    partitions=3,
)


def join_view(grouping: str = "[A]./k", *joins: str) -> ViewConfig:
    return ViewConfig(
        name="J",
        joins=joins or ("[A]./k = [B]./k",),
        projection=("[A]./k AS /k", "SUM([A]./q) AS /q", "COUNT([B]./id) AS /partners"),
        grouping=(grouping,),
    )


# -- routing -------------------------------------------------------------------------------


def test_a_row_moving_group_is_a_retraction_and_an_addition_routed_apart() -> None:
    feed = ViewFeed(VIEW, "t", "in")
    before = {"id": 1, "g": 0, "v": 1}
    after = {"id": 1, "g": 1, "v": 1}
    events = feed.events("k1", before, after, ("t", 0, 7, 0))
    assert [e.key for e in events] == [b'["0"]', b'["1"]']
    bodies = [orjson.loads(e.value) for e in events]
    assert [(b["b"], b["a"], b["s"]) for b in bodies] == [
        (before, None, ["t", 0, 7, 0, 0]),
        (None, after, ["t", 0, 7, 0, 1]),
    ]
    same = feed.events("k1", before, {**before, "v": 2}, ("t", 0, 8, 0))
    assert len(same) == 1 and same[0].partition == events[0].partition


def test_the_view_filter_is_applied_before_sending() -> None:
    feed = ViewFeed(VIEW, "t", "in")
    assert feed.events("k", {"g": 0, "v": 9}, {"g": 0, "v": 9}, ("t", 0, 1, 0)) == []
    (leaves,) = feed.events("k", {"g": 0, "v": 1}, {"g": 0, "v": 9}, ("t", 0, 2, 0))
    assert orjson.loads(leaves.value)["a"] is None


def test_join_views_route_by_join_key_only_when_groups_follow_it() -> None:
    assert join_route_paths(join_view()) == {"A": ("/k",), "B": ("/k",)}
    assert input_partitions(join_view()) == 4
    # Grouped by a field that is not the join key, or by the other side's key: one partition.
    assert join_route_paths(join_view("[A]./x")) is None
    assert join_route_paths(join_view("[B]./k")) is None
    chained = join_view("[A]./k", "[A]./k = [B]./k", "[A]./c = [C]./c")
    assert join_route_paths(chained) is None and input_partitions(chained) == 1
    same_key = join_view("[A]./k", "[A]./k = [B]./k", "[B]./k = [C]./k")
    assert join_route_paths(same_key) == {"A": ("/k",), "B": ("/k",), "C": ("/k",)}


def test_join_partners_meet_on_one_partition_whatever_the_spelling() -> None:
    view = join_view()
    a, b = ViewFeed(view, "A", "in"), ViewFeed(view, "B", "in")
    for value, spelled in [(12345, "12345"), (7, 7.0), ("IBM", "IBM")]:
        (ea,) = a.events("a", None, {"k": value, "q": 1}, ("A", 0, 1, 0))
        (eb,) = b.events("b", None, {"k": spelled, "id": 2}, ("B", 0, 1, 0))
        assert ea.partition == eb.partition and ea.key == eb.key
    # A join key that changes leaves the old partition's maintainer with a deletion.
    moved = b.events("b", {"k": "IBM"}, {"k": "MSFT"}, ("B", 0, 2, 0))
    assert [orjson.loads(e.value)["a"] for e in moved] == [None, {"k": "MSFT"}]


# -- the maintainer's store entries ----------------------------------------------------------


# Shows a non-grouped field outside aggregates: each group keeps its rows' values of it (the
# latest row's is shown), stored as entries of their own.
LOOSE = ViewConfig(
    name="L",
    underlying_topic="t",
    projection=("/g AS /g", "SUM(/v) AS /s", "/v AS /latest"),
    grouping=("/g",),
)


@pytest.mark.parametrize("view", [VIEW, LOOSE], ids=["aggregates", "with-row-values"])
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 2), st.integers(0, 9)), max_size=40))
def test_entries_written_per_change_restore_the_same_state(
    view: ViewConfig, changes: list[tuple[int, int, int]]
) -> None:
    live = ViewMaintainer(view)
    store: dict[bytes, bytes] = {}
    rows: dict[str, dict[str, Any]] = {}
    for seq, (i, g, v) in enumerate(changes):
        key = f"k{i}"
        after = None if v == 9 else {"id": i, "g": g, "v": v}
        live.apply("t", key, rows.get(key), after, seq=seq)
        if after is None:
            rows.pop(key, None)
        else:
            rows[key] = after
        for k, value in live.take_entries().items():
            if value is None:
                store.pop(k, None)
            else:
                store[k] = value
        restored = ViewMaintainer(view)
        restored.load_entries(sorted(store.items()))
        assert restored.records() == live.records()
        assert restored.last_seq == seq


def _loose_state(steps: int) -> ViewMaintainer:
    live = ViewMaintainer(LOOSE)
    for seq in range(steps):
        live.apply("t", f"k{seq}", None, {"id": seq, "g": seq % 2, "v": seq}, seq=seq)
    return live


def test_a_change_writes_its_groups_head_and_its_rows_values_not_the_whole_group() -> None:
    """A group of many rows was written whole (every row's values) at each change to one."""
    live = _loose_state(40)
    live.take_entries()
    live.apply("t", "k40", None, {"id": 40, "g": 0, "v": 40}, seq=40)
    written = live.take_entries()
    group = live.groups.key_of({"g": 0})
    assert orjson.loads(written[b"g/" + group.encode()])[0] == 21  # rows, spellings, states
    assert len(orjson.loads(written[b"g/" + group.encode()])) == 3
    assert written[b"l/" + group.encode() + b"\x00k40"] == orjson.dumps([40, [40]])
    assert len(written) == 3  # the head, the row, last_seq
    live.apply("t", "k40", {"id": 40, "g": 0, "v": 40}, None, seq=41)
    assert live.take_entries()[b"l/" + group.encode() + b"\x00k40"] is None


def test_a_store_of_the_older_layout_is_read_and_rewritten_row_by_row() -> None:
    """An older release wrote each group whole: its rows' values inside the group's entry."""
    live = _loose_state(10)
    live.take_entries()
    older = {
        b"g/" + key.encode(): orjson.dumps(group.encode(live.groups.accumulators))
        for key, group in live.groups.groups.items()
    }
    older[b"seq"] = b"9"
    restored = ViewMaintainer(LOOSE)
    restored.load_entries(sorted(older.items()))
    assert restored.records() == live.records()
    migrated = restored.take_entries()  # the next batch writes them in this layout
    assert sum(1 for k in migrated if k.startswith(b"l/")) == 10
    store = {**older, **{k: v for k, v in migrated.items() if v is not None}}
    again = ViewMaintainer(LOOSE)
    again.load_entries(sorted(store.items()))
    assert again.records() == live.records()
    assert again.apply("t", "k3", {"id": 3, "g": 1, "v": 3}, None, seq=10) == live.apply(
        "t", "k3", {"id": 3, "g": 1, "v": 3}, None, seq=10
    )


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ((b"l/" + b'["0"]' + b"\x00k1", b'{"seq": 1}'), "malformed row values of group"),
        ((b"l/" + b'["7"]' + b"\x00k1", b"[1, [1]]"), "which is not stored"),
    ],
)
def test_damaged_row_values_are_refused_naming_the_group(
    entry: tuple[bytes, bytes], problem: str
) -> None:
    live = _loose_state(4)
    entries = sorted({**live.take_entries(), entry[0]: entry[1]}.items())
    with pytest.raises(StateError, match=problem):
        ViewMaintainer(LOOSE).load_entries([(k, v) for k, v in entries if v is not None])


def test_join_entries_restore_rows_and_groups() -> None:
    view = join_view()
    live = ViewMaintainer(view)
    store: dict[bytes, bytes | None] = {}
    steps = [
        ("A", "a1", {"k": "x", "q": 2}),
        ("B", "b1", {"k": "x", "id": 1}),
        ("B", "b2", {"k": "x", "id": 2}),
        ("A", "a2", {"k": "y", "q": 5}),
        ("B", "b1", None),
    ]
    for seq, (topic, key, after) in enumerate(steps):
        live.apply(topic, key, None, after, seq=seq)
        store.update(live.take_entries())
    restored = ViewMaintainer(view)
    restored.load_entries((k, v) for k, v in store.items() if v is not None)
    assert restored.records() == live.records()
    # It goes on from there exactly as the live state does.
    assert restored.apply("B", "b3", None, {"k": "y", "id": 3}, seq=9) == live.apply(
        "B", "b3", None, {"k": "y", "id": 3}, seq=9
    )


# -- the whole path, with duplicates and restarts ----------------------------------------------


def partitions(sender: RecordingSender) -> dict[tuple[str, int], list[RawRecord]]:
    """What Kafka holds of each topic partition the sender was given records for (the offsets
    are list positions)."""
    out: dict[tuple[str, int], list[RawRecord]] = {}
    for rec in sender.records:
        part = out.setdefault((rec.topic, rec.partition or 0), [])
        part.append(RawRecord(rec.partition or 0, len(part), 1, rec.key, rec.value, rec.headers))
    return out


class ListReader:
    """Reads an input partition the sender was given (what the runner fetches after a gap)."""

    def __init__(self, sender: RecordingSender, topic: str) -> None:
        self.sender = sender
        self.topic = topic

    async def end_offset(self, partition: int) -> int:
        return len(partitions(self.sender).get((self.topic, partition), [])) - 1

    async def batches(
        self, partition: int, until: int, start: int = 0
    ) -> AsyncIterator[list[RawRecord]]:
        yield [
            r
            for r in partitions(self.sender).get((self.topic, partition), [])
            if start <= r.offset <= until
        ]


def view_log(sender: RecordingSender) -> dict[str, dict[str, Any]]:
    """The view as its log leaves it: last publish per SowKey, minus the deleted ones."""
    out: dict[str, dict[str, Any]] = {}
    for (topic, _), records in sorted(partitions(sender).items()):
        if topic != "log.V":
            continue
        for rec in records:
            assert rec.headers[h.VIEW] == "V"
            assert rec.key is not None
            if rec.headers.get(h.COMMAND) == h.SOW_DELETE:
                out.pop(rec.key.decode(), None)
            else:
                assert rec.value is not None
                out[rec.key.decode()] = orjson.loads(rec.value)
    return out


def new_runner(sender: RecordingSender, memory: dict[int, Any] | None = None) -> ViewRunner:
    runner = ViewRunner(
        VIEW,
        sender,
        None,
        ListReader(sender, "in"),  # type: ignore[arg-type]
        input_topic="in",
        log_topic="log.V",
        codec=compile_topic(VIEW.topic_config()).codec,
    )
    if memory is not None:
        runner._memory = memory
    runner.assign(range(4))  # as faust's assignment hook does
    return runner


@settings(max_examples=40, deadline=None)
@given(
    st.lists(op, min_size=1, max_size=30),
    st.integers(1, 30),
    st.integers(0, 40),
    st.integers(0, 60),
    st.integers(0, 20),
    st.integers(0, 20),
)
def test_duplicated_events_and_restarts_leave_the_view_equal_to_a_recomputation(
    sequence: list[tuple[str, int, int, int]],
    split: int,
    cut: int,
    replay_from: int,
    jump_at: int,
    jump_by: int,
) -> None:
    async def go() -> None:
        sender = RecordingSender()
        records = to_records(sequence)
        # The underlying worker applies the log ...
        source = TopicProcessor(compile_topic(TOPIC), TopicNames("p"), sender)
        source.views.append(ViewFeed(VIEW, "t", "in"))
        await source.ready(0)
        for start in range(0, len(records), split):
            await source.process(records[start : start + split])
        await source.drain()
        # ... and after a crash another one applies it again from nothing (a transient topic
        # rebuilt without its events): every event is produced a second time.
        again = TopicProcessor(compile_topic(TOPIC), TopicNames("p"), sender)
        again.views.append(ViewFeed(VIEW, "t", "in"))
        await again.ready(0)
        await again.process(records)
        await again.drain()

        memory: dict[int, Any] = {}
        runner = new_runner(sender, memory)
        inputs = {p: recs for (t, p), recs in partitions(sender).items() if t == "in"}
        for recs in inputs.values():
            await runner.handle(recs[: cut % (len(recs) + 1)])
        # The maintainer restarts: its state comes back from the store, and faust hands it
        # events from an older committed offset (repeats) or a later one (a gap to fetch).
        runner = new_runner(sender, memory)
        if replay_from % 2:
            await runner.warm(inputs)  # the worker's timer, before or after faust's events
        for recs in inputs.values():
            start = replay_from % (len(recs) + 1)
            # faust may also jump inside one batch: records it fetched before seeking to its
            # committed offset, then records from that offset on.
            jumped = recs[start : start + jump_at] + recs[start + jump_at + jump_by :]
            await runner.handle(jumped)
            if start > 0:
                await runner.handle(recs[start:])
        await runner.warm(inputs)

        state: dict[str, tuple[dict[str, Any], int]] = {}
        ps = source.state(0)
        assert ps is not None
        for key, raw in ps.store.scan():
            if is_record_key(key):
                rec = SowRecord.from_bytes(raw)
                state[rec.sow_key] = (orjson.loads(rec.data), rec.log_offset)
        expected = ViewMaintainer(VIEW).recompute({"t": state})
        assert view_log(sender) == expected
        assert runner.records() == expected

    asyncio.run(go())


def test_a_batch_in_which_faust_jumped_ahead_is_completed_from_the_input_topic() -> None:
    """After a restart faust can hand over, in one batch, records it fetched before seeking to
    its committed offset and then records from that offset on. The events in between are read
    from the input topic; the watermark never passes them unapplied (found by the SIGKILL test
    of test_view_joins: a view a few counts short, or one partition far behind)."""

    async def go() -> None:
        sender = RecordingSender()
        source = TopicProcessor(compile_topic(TOPIC), TopicNames("p"), sender)
        source.views.append(ViewFeed(VIEW, "t", "in"))
        await source.ready(0)
        # Three records moving between two groups: every update is a retraction and an addition.
        await source.process(to_records([("publish", i % 3, i % 2, i % 7) for i in range(40)]))
        await source.drain()
        memory: dict[int, Any] = {}
        runner = new_runner(sender, memory)
        inputs = {p: recs for (t, p), recs in partitions(sender).items() if t == "in"}
        assert max(len(recs) for recs in inputs.values()) > 10
        for recs in inputs.values():
            await runner.handle(recs[:2])
        runner = new_runner(sender, memory)  # restarted: state and watermark from the store
        for recs in inputs.values():
            await runner.handle(recs[:5] + recs[-3:])

        ps = source.state(0)
        assert ps is not None
        state = {
            rec.sow_key: (orjson.loads(rec.data), rec.log_offset)
            for rec in (SowRecord.from_bytes(raw) for k, raw in ps.store.scan() if is_record_key(k))
        }
        expected = ViewMaintainer(VIEW).recompute({"t": state})
        assert runner.records() == expected
        assert view_log(sender) == expected

    asyncio.run(go())


class InputOutage:
    """Kafka takes the first ``accepted`` change events sent to the view's input topic, then
    refuses every one until ``down`` is cleared (a broker outage)."""

    def __init__(self, accepted: int) -> None:
        self.accepted = accepted
        self.down = True
        self.sender = RecordingSender(refuse=self.refuses)

    def refuses(self, topic: str) -> bool:
        if topic != "in" or not self.down or self.accepted > 0:
            self.accepted -= topic == "in"
            return False
        return True


def test_a_batch_whose_change_events_kafka_refused_is_not_stored() -> None:
    """The underlying topic stores a batch only once Kafka has its change events: events
    refused during an outage leave the batch unstored (the partition is loaded again and the
    log replayed), so the view still gets every change. Subscribers' messages are only waited
    for, a bounded time; a view's input is not optional."""

    async def go() -> None:
        outage = InputOutage(accepted=5)
        sender = outage.sender
        source = TopicProcessor(compile_topic(TOPIC), TopicNames("p"), sender)
        source.views.append(ViewFeed(VIEW, "t", "in"))
        records = to_records([("publish", i % 3, i % 2, i % 7) for i in range(12)])
        await source.ready(0)
        await source.process(records)
        with pytest.raises(StateStoreError, match=r"change events.* of topic 't'"):
            await source.drain()
        assert source.state(0) is None  # forgotten: nothing of the batch was stored
        # The broker is back. What the log pump does next: load the partition again and read
        # the log from its watermark.
        outage.down = False
        ps = await source.ready(0)
        assert ps.watermark == -1
        await source.process(records)
        await source.drain()

        runner = new_runner(sender)
        for (topic, _), recs in list(partitions(sender).items()):
            if topic == "in":
                await runner.handle(recs)
        state = {
            rec.sow_key: (orjson.loads(rec.data), rec.log_offset)
            for rec in (SowRecord.from_bytes(raw) for k, raw in ps.store.scan() if is_record_key(k))
        }
        assert runner.records() == ViewMaintainer(VIEW).recompute({"t": state})

    asyncio.run(go())


def test_an_expiry_kafka_refused_is_postponed_and_reaches_the_view_through_the_log() -> None:
    """The sweep writes its removals to the log; while Kafka refuses them the records stay (and
    are swept again at the next pass); once applied from the log they leave the view too."""

    async def go() -> None:
        topic = load_config_text(
            "sow:\n  - Name: t\n    Key: /id\n    Expiration: enabled\n    Durability: transient\n"
        ).topics[0]
        log_down = True
        sender = RecordingSender(refuse=lambda name: log_down and name == source.log_topic)
        source = TopicProcessor(compile_topic(topic), TopicNames("p"), sender)
        source.views.append(ViewFeed(VIEW, "t", "in"))
        ps = await source.ready(0)
        body = {h.EXPIRATION: "5"}
        await source.process(
            [
                RawRecord(
                    0,
                    i,
                    1_000,
                    key_of(i),
                    orjson.dumps({"id": i, "g": i % 2, "v": 1}),
                    body,
                )
                for i in range(6)
            ]
        )
        await source.drain()
        assert await expire_through_log(source, sender, 10_000) == 0
        assert sum(1 for k, _ in ps.store.scan() if is_record_key(k)) == 6
        log_down = False
        assert await expire_through_log(source, sender, 10_000) == 6
        assert sum(1 for k, _ in ps.store.scan() if is_record_key(k)) == 0

        runner = new_runner(sender)
        for (name, _), recs in list(partitions(sender).items()):
            if name == "in":
                await runner.handle(recs)
        assert runner.records() == {}
        assert view_log(sender) == {}

    asyncio.run(go())


def test_events_of_a_revoked_partition_are_not_applied_and_drop_waits_for_a_batch() -> None:
    """A rebalance revokes an input partition while the runner applies a batch of it: the
    revocation returns only once that batch is stored, and events faust still hands over for
    the partition afterwards are left to its next owner (who reads them from the store's
    watermark), so two maintainers never write the same partition."""

    async def go() -> None:
        sender = RecordingSender()
        source = TopicProcessor(compile_topic(TOPIC), TopicNames("p"), sender)
        source.views.append(ViewFeed(VIEW, "t", "in"))
        await source.ready(0)
        await source.process(to_records([("publish", 1, 1, 5), ("publish", 2, 1, 7)]))
        await source.drain()
        inputs = [r for (t, _), recs in partitions(sender).items() if t == "in" for r in recs]
        assert inputs

        memory: dict[int, Any] = {}
        runner = new_runner(sender, memory)
        partition = inputs[0].partition
        applying = asyncio.create_task(runner.handle(inputs[:1]))
        await asyncio.sleep(0)  # the batch holds the partition's lock now
        await runner.drop([partition])
        assert applying.done(), "drop returned while a batch of the partition was applying"
        stored = dict(memory[partition].scan(start=b""))
        log_before = view_log(sender)

        await runner.handle(inputs[1:])  # late events of the revoked partition
        assert dict(memory[partition].scan(start=b"")) == stored
        assert view_log(sender) == log_before
        assert runner.records() == {}

        runner.assign([partition])  # assigned back: it catches up from its store
        await runner.handle(inputs[1:])
        assert runner.records() == view_log(sender) != {}

    asyncio.run(go())


class ObservedMemory(MemoryPartition):
    """A memory store that also keeps each batch as written, in order (what the changelog
    receives, record after record)."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[tuple[bytes, bytes | None]]] = []

    def write(self, changes: Mapping[bytes, bytes | None]) -> None:
        self.batches.append(list(changes.items()))
        super().write(changes)


@settings(max_examples=40, deadline=None)
@given(st.lists(op, min_size=2, max_size=30), st.integers(1, 29), st.integers(0, 200))
def test_a_batch_cut_short_in_the_changelog_is_rolled_back(
    sequence: list[tuple[str, int, int, int]], split: int, cut: int
) -> None:
    """A worker killed while a batch's state records are on their way to the changelog leaves a
    prefix of them; the next owner restores that prefix without the batch's watermark, applies
    the batch again, and must still end equal to a recomputation (no group counted twice)."""

    async def go() -> None:
        sender = RecordingSender()
        source = TopicProcessor(compile_topic(TOPIC), TopicNames("p"), sender)
        source.views.append(ViewFeed(VIEW, "t", "in"))
        await source.ready(0)
        await source.process(to_records(sequence))
        await source.drain()
        inputs = {p: recs for (t, p), recs in partitions(sender).items() if t == "in"}

        observed = {p: ObservedMemory() for p in inputs}
        runner = new_runner(sender, dict(observed))
        for recs in inputs.values():
            at = min(split, len(recs))
            await runner.handle(recs[:at])
            await runner.handle(recs[at:])
        expected = runner.records()
        assert expected == view_log(sender)

        # The changelog as a crash leaves it: every batch but the last whole, then a prefix of
        # the last one that stops before its watermark.
        restored: dict[int, Any] = {}
        for p, store in observed.items():
            copy = MemoryPartition()
            *whole, last = store.batches
            for batch in whole:
                copy.write(dict(batch))
            copy.write(dict(last[: cut % len(last)]))
            restored[p] = copy
        again = new_runner(sender, restored)
        for recs in inputs.values():
            await again.handle(recs)
        assert again.records() == expected

    asyncio.run(go())


def test_a_group_emptied_and_filled_again_survives_a_restart() -> None:
    """A deleted entry is removed for good by a later batch; one that a batch in between wrote
    again must stay in the store, so a restarted maintainer holds the group."""

    async def go() -> None:
        sender = RecordingSender()
        source = TopicProcessor(compile_topic(TOPIC), TopicNames("p"), sender)
        source.views.append(ViewFeed(VIEW, "t", "in"))
        await source.ready(0)
        steps = [("publish", 1, 0, 5), ("delete", 1, 0, 0), ("publish", 1, 0, 6)]
        steps += [("publish", 2, g, v) for v in range(3) for g in range(1, 7)]  # other groups
        await source.process(to_records(steps))
        await source.drain()
        inputs = {p: r for (t, p), r in partitions(sender).items() if t == "in"}
        memory: dict[int, Any] = {}
        runner = new_runner(sender, memory)
        for recs in inputs.values():
            for rec in recs:  # one batch each
                await runner.handle([rec])
        expected = runner.records()
        assert expected == view_log(sender) and any(r["g"] == 0 for r in expected.values())
        restarted = new_runner(sender, memory)
        await restarted.warm(inputs)
        assert restarted.records() == expected

    asyncio.run(go())
