"""Bad input at the wire, against the real engine: random bytes, truncated Avro, wrong, missing and
garbled headers and oversized values written straight onto the control topic, the registry and a
SOW topic's log, interleaved with valid publishes and commands (tests/unit/test_bad_input.py does
the same through the decoders alone).

Afterwards: both workers are alive and logged no failure, the SOW equals the fold of the valid
log records, every bad log record has a dead letter naming its problem (and a failed ack where it
asked for one), every bad command or registration with a usable reply address has an error answer
with the reason, and the ones without are the ones the workers logged as unreadable.

Deterministic from a seed ($SOWSTREAM_BAD_INPUT_SEED, default 26), printed with any failure. The
counts of a run are printed (``pytest -s``) and kept in docs/reliability.md.
"""

from __future__ import annotations

import io
import os
import random
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import fastavro
import orjson
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from sowstream.sow.keys import generated_sow_key
from sowstream.wire import headers as h
from sowstream.wire.kafka import LARGEST_LOG_RECORD
from sowstream.wire.topics import TopicNames
from tests.support.engine import EngineProcesses, running_engine
from tests.support.raw import COMMAND, REPLY, SUBSCRIPTION, avro, schema

pytestmark = pytest.mark.integration

SEED = int(os.environ.get("SOWSTREAM_BAD_INPUT_SEED", "26"))
PARTITIONS = 4
TOPICS: list[dict[str, Any]] = [
    {"Name": "orders", "Key": ["/id"], "Partitions": PARTITIONS, "Expiration": "enabled"}
]
WORKERS = ("w1", "w2")
# As large a value as a client writes with librdkafka's defaults (message.max.bytes 1,000,000):
# valid, and stored. Then one the broker takes (its message.max.bytes, 1 MiB + 12) but the engine
# does not (LARGEST_LOG_RECORD): its changelog record or dead letter would not fit.
LARGE = 999_000
OVERSIZED = LARGEST_LOG_RECORD + 1_000
# Terms of an oversized filter (about 22 KB). Filters are parsed on a worker's event loop: one of
# 220 KB took 8 s to refuse on a loaded machine, long enough to lapse the group session.
OVERSIZED_FILTER_TERMS = 2_000
# What a worker log must not hold after the run: a failure of the engine itself.
DEAD_LETTER = schema("DeadLetter")
FAILURES = re.compile(r"Traceback|storing a batch failed|handling commands failed|panicked")


@pytest.fixture(scope="module")
def engine(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EngineProcesses]:
    with running_engine(
        kafka_bootstrap, tmp_path_factory.mktemp("bad-input"), TOPICS, workers=WORKERS
    ) as procs:
        yield procs


def sow_key(ident: Any) -> bytes:
    return generated_sow_key("orders", "orders", ["/id"], {"id": ident}).encode()


@dataclass
class LogItem:
    """A record for the log: ``expect`` is "valid", or the dead letter's reason."""

    kind: str
    key: bytes | None
    value: bytes | None
    headers: dict[str, str]
    expect: str
    timestamp: int = 0
    ack: str | None = None  # the command id of the ack it asks for
    partition: int = -1  # where Kafka put it (delivery report)
    offset: int = -1
    refused_by_kafka: str = ""


@dataclass
class CommandItem:
    """A control-topic record: ``expect`` is the reply reason ("" for success), or None when
    there is nothing to answer on (``why`` says why)."""

    kind: str
    value: bytes
    headers: dict[str, str]
    partition: int
    command_id: str
    expect: str | None
    why: str = ""


@dataclass
class RegistrationItem:
    """A registry record: ``expect`` is the failure reason, "" for a registration that holds,
    None for one nobody can be told about (``why``)."""

    kind: str
    key: bytes
    value: bytes
    headers: dict[str, str]
    sub_id: str
    expect: str | None
    why: str = ""


@dataclass
class Plan:
    log: list[LogItem] = field(default_factory=list)
    commands: list[CommandItem] = field(default_factory=list)
    registrations: list[RegistrationItem] = field(default_factory=list)
    order: list[tuple[str, int]] = field(default_factory=list)  # (which list, index), interleaved


def command_record(reply_to: str, command_id: str, **fields: Any) -> dict[str, Any]:
    return {
        "command": "sow",
        "command_id": command_id,
        "query_id": "q",
        "reply_to": reply_to,
        "topic": "orders",
        **fields,
    }


def every_kind_then_any(rng: random.Random, kinds: list[Any], count: int) -> list[Any]:
    """``count`` of ``kinds``: each once, the rest drawn at random."""
    return [*kinds, *(rng.choice(kinds) for _ in range(count - len(kinds)))]


def make_plan(rng: random.Random, reply_to: str, missing_reply_to: str) -> Plan:
    """The records to write, valid and bad, in the order they are written."""
    plan = Plan()
    log, commands, regs = plan.log, plan.commands, plan.registrations

    def body(ident: Any) -> dict[str, Any]:
        return {"id": ident, "v": rng.randrange(1000), "s": rng.choice(["a", "é", "x y", ""])}

    def junk_text(n: int) -> str:
        return "".join(rng.choice("abc XYZ=;|{}\u00e9") for _ in range(n))

    # -- the log: valid operations on ids 0..11, unkeyed ones on ids of their own ------------------
    unkeyed = iter(range(100, 1000))
    for _ in range(90):
        ident = rng.randrange(12)
        op = rng.choice(["publish", "publish", "delta_publish", "sow_delete"])
        headers: dict[str, str] = {}
        value: bytes | None = orjson.dumps(body(ident))
        if op == "delta_publish":
            value = orjson.dumps({"id": ident, "d": rng.randrange(1000)})
        if op != "publish" or rng.random() < 0.5:
            headers[h.COMMAND] = op
        if op == "sow_delete":
            value = None
        extra = rng.random()
        if extra < 0.2:  # headers the engine does not read, garbled: ignored
            headers.update({"junk": junk_text(8), h.SCHEMA: junk_text(3), h.ORIGIN: "x:y"})
        elif extra < 0.35:
            headers[h.EXPIRATION] = "0"  # never expires
        item = LogItem(op, sow_key(ident), value, headers, "valid")
        if rng.random() < 0.3:
            item.ack = uuid.uuid4().hex
        log.append(item)
        if rng.random() < 0.15:  # no key, no headers: the engine keys it
            log.append(
                LogItem("unkeyed publish", None, orjson.dumps(body(next(unkeyed))), {}, "valid")
            )
    # The engine's log topics take the broker's time (LogAppendTime): a producer's timestamp
    # near 2**63 never reaches the fold (tests/unit/test_expiration_bounds.py covers one that
    # would), so these are valid records.
    for ident in range(600, 603):
        item = LogItem(
            "producer timestamp near 2^63 (the broker stamps the log)",
            sow_key(ident),
            orjson.dumps(body(ident)),
            {h.EXPIRATION: "0"},
            "valid",
            timestamp=2**63 - 1 - rng.randrange(1000),
        )
        log.insert(rng.randrange(len(log) + 1), item)
    log.append(
        LogItem(
            "large valid",
            sow_key(500),
            orjson.dumps({"id": 500, "big": "x" * LARGE}),
            {},
            "valid",
        )
    )
    # Over the 1,000,000 bytes the engine's producers once sent at most: its changelog record
    # could not be written, and the partition was loaded again and again.
    log.append(
        LogItem(
            "large valid, over 1,000,000 bytes",
            sow_key(501),
            orjson.dumps({"id": 501, "big": "x" * (LARGEST_LOG_RECORD - 1_000)}),
            {},
            "valid",
        )
    )

    # -- the log: bad records ------------------------------------------------------------------
    def good_json(ident: Any) -> bytes:
        return orjson.dumps(body(ident))

    bad_log: list[Callable[[], LogItem]] = [
        lambda: LogItem(
            "random bytes",
            sow_key(rng.randrange(12)),
            bytes([rng.randrange(0x80, 0x100)]) + rng.randbytes(rng.randrange(300)),
            {},
            "malformed_json",
        ),
        lambda: LogItem(
            "truncated json",
            sow_key(rng.randrange(12)),
            (lambda b: b[: rng.randrange(1, len(b) - 1)])(good_json(rng.randrange(12))),
            {},
            "malformed_json",
        ),
        lambda: LogItem("empty value", sow_key(rng.randrange(12)), b"", {}, "malformed_json"),
        lambda: LogItem("not an object", sow_key(1), b"[1, 2]", {}, "malformed_json"),
        lambda: LogItem(
            "no key field, no key", None, orjson.dumps({"x": 1}), {}, "missing_key_field"
        ),
        lambda: LogItem(
            "garbled sow.cmd",
            sow_key(rng.randrange(12)),
            good_json(rng.randrange(12)),
            {h.COMMAND: junk_text(6)},
            "unknown_command",
        ),
        lambda: LogItem(
            "garbled sow.expiration",
            sow_key(3),
            good_json(3),
            {h.EXPIRATION: rng.choice(["soon", "-5", "1e3", junk_text(4)])},
            "bad_expiration",
        ),
        lambda: LogItem(
            "sow.expiration beyond 64 bits",
            sow_key(4),
            good_json(4),
            {h.EXPIRATION: "9" * rng.randrange(17, 40)},
            "bad_expiration",
        ),
        lambda: LogItem(
            "sow_delete with a garbled filter",
            None,
            None,
            {h.COMMAND: h.SOW_DELETE, h.FILTER: "/id = = " + junk_text(3)},
            "bad_filter",
        ),
        lambda: LogItem(
            "sow_delete with nothing to delete by",
            None,
            None,
            {h.COMMAND: h.SOW_DELETE},
            "missing_key_field",
        ),
    ]
    for make in every_kind_then_any(rng, bad_log, 44):
        item = make()
        if rng.random() < 0.5:
            item.ack = uuid.uuid4().hex
        log.insert(rng.randrange(len(log) + 1), item)
    log.insert(
        rng.randrange(len(log) + 1),
        LogItem(
            "oversized malformed json",
            sow_key(6),
            b'{"id": 6, "big": "' + b"x" * OVERSIZED,
            {},
            "too_large",
            ack=uuid.uuid4().hex,
        ),
    )
    log.insert(
        rng.randrange(len(log) + 1),
        LogItem(
            "oversized valid json",
            sow_key(7),
            orjson.dumps({"id": 7, "big": "x" * OVERSIZED}),
            {},
            "too_large",
        ),
    )

    # -- the control topic ---------------------------------------------------------------------
    def cmd(
        kind: str,
        expect: str | None,
        why: str = "",
        headers: dict[str, str] | None = None,
        mangle: Callable[[bytes], bytes] = lambda b: b,
        to: str = reply_to,
        **fields: Any,
    ) -> CommandItem:
        cid = uuid.uuid4().hex
        value = mangle(avro(COMMAND, command_record(to, cid, **fields)))
        version = {h.SCHEMA: "1"} if headers is None else headers
        return CommandItem(kind, value, version, rng.randrange(PARTITIONS), cid, expect, why)

    kinds: list[Callable[[], CommandItem]] = [
        lambda: cmd("valid sow", "", filter="/v > 500"),
        lambda: cmd("valid sow without headers", "", headers={}),
        lambda: cmd(
            "valid sow with junk headers",
            "",
            headers={"junk": junk_text(5), h.CREDENTIAL: junk_text(9)},
        ),
        lambda: cmd("valid sow with trailing bytes", "", mangle=lambda b: b + rng.randbytes(7)),
        lambda: cmd(
            "random bytes",
            None,
            "not a Command: nothing to answer on",
            mangle=lambda _: rng.randbytes(rng.randrange(1, 200)),
        ),
        lambda: cmd(
            "truncated Avro",
            None,
            "not a whole Command: nothing to answer on",
            mangle=lambda b: b[: rng.randrange(len(b))],
        ),
        lambda: cmd(
            "garbled sow.schema",
            "schema_version",
            headers={h.SCHEMA: rng.choice(["x", "0", "-1", "1.5"])},
        ),
        lambda: cmd("newer sow.schema", "schema_version", headers={h.SCHEMA: "7"}),
        lambda: cmd("unknown command", "unknown_command", command=junk_text(7)),
        lambda: cmd("garbled filter", "bad_filter", filter="/v = = " + junk_text(4)),
        lambda: cmd("bad option", "bad_option", skip_n=3),
        lambda: cmd(
            "garbled subscription options",
            "bad_option",
            command="sow_and_subscribe",
            sub_id="s",
            sub_options="conflation=" + junk_text(3),
        ),
        lambda: cmd(
            "oversized filter", "", filter="/v = -1 OR " * OVERSIZED_FILTER_TERMS + "/v > 500"
        ),
        lambda: cmd(
            "oversized garbled filter",
            "bad_filter",
            filter="/v = -1 OR " * OVERSIZED_FILTER_TERMS + "/v = =",
        ),
        lambda: cmd(
            "reply topic that does not exist",
            None,
            "its reply topic does not exist",
            to=missing_reply_to,
        ),
    ]
    commands.extend(make() for make in every_kind_then_any(rng, kinds, 45))

    # -- the registry --------------------------------------------------------------------------
    def reg(
        kind: str,
        expect: str | None,
        why: str = "",
        headers: dict[str, str] | None = None,
        mangle: Callable[[bytes], bytes] = lambda b: b,
        **fields: Any,
    ) -> RegistrationItem:
        sub_id = uuid.uuid4().hex[:8]
        record = {
            "sub_id": sub_id,
            "reply_to": reply_to,
            "topic": "orders",
            "command": "subscribe",
            "options": "",
            "identity": "",
            **fields,
        }
        value = mangle(avro(SUBSCRIPTION, record))
        key = f"{reply_to}|{sub_id}|orders".encode()
        version = {h.SCHEMA: "1"} if headers is None else headers
        return RegistrationItem(kind, key, value, version, sub_id, expect, why)

    reg_kinds: list[Callable[[], RegistrationItem]] = [
        lambda: reg("valid registration", "", filter="/v > 990"),
        lambda: reg(
            "random bytes",
            "bad_registration",
            "",
            mangle=lambda _: rng.randbytes(rng.randrange(1, 200)),
        ),
        lambda: reg(
            "truncated Avro",
            "bad_registration",
            "",
            mangle=lambda b: b[: rng.randrange(len(b))],
        ),
        lambda: reg(
            "garbled sow.schema", "schema_version", headers={h.SCHEMA: rng.choice(["x", "0"])}
        ),
        lambda: reg("newer sow.schema", "schema_version", headers={h.SCHEMA: "3"}),
        lambda: reg("garbled filter", "bad_filter", filter="/v = = " + junk_text(3)),
        lambda: reg("garbled options", "bad_option", options="max_backlog=" + junk_text(3)),
        lambda: reg("unknown command", "bad_option", command=junk_text(6)),
        lambda: reg(
            "oversized garbled filter",
            "bad_filter",
            filter="/v = -1 OR " * OVERSIZED_FILTER_TERMS + "/v = =",
        ),
    ]
    regs.extend(make() for make in every_kind_then_any(rng, reg_kinds, 27))

    plan.order = [("log", i) for i in range(len(log))]
    for which, items in (("command", commands), ("registration", regs)):
        for i in range(len(items)):
            plan.order.insert(rng.randrange(len(plan.order) + 1), (which, i))
    return plan


class Run:
    """Writes a plan and reads back what the engine made of it."""

    def __init__(self, engine: EngineProcesses) -> None:
        self.engine = engine
        self.names = TopicNames(engine.prefix)
        self.reply_to = self.names.reply(f"bad-input-{uuid.uuid4().hex[:8]}")
        admin = AdminClient({"bootstrap.servers": engine.bootstrap})
        for fut in admin.create_topics([NewTopic(self.reply_to, 1, 1)]).values():
            fut.result(30)
        self.producer = Producer(
            {
                "bootstrap.servers": engine.bootstrap,
                "partitioner": "murmur2_random",  # the engine's partitioning of SowKeys
                "enable.idempotence": True,  # log order as written, per partition
                "message.max.bytes": 1_048_588,  # as large as the broker takes
                "log_level": 3,
            }
        )

    def write(self, plan: Plan) -> None:
        log_topic = self.names.log("orders")
        for which, i in plan.order:
            if which == "log":
                item = plan.log[i]
                headers = dict(item.headers)
                if item.ack is not None:
                    headers.update({h.REPLY_TO: self.reply_to, h.COMMAND_ID: item.ack})

                def report(err: KafkaError | None, msg: Any, item: LogItem = item) -> None:
                    if err is not None:
                        item.refused_by_kafka = err.str()
                    else:
                        item.partition, item.offset = msg.partition(), msg.offset()

                self.producer.produce(
                    log_topic,
                    item.value,
                    key=item.key,
                    headers=headers,
                    timestamp=item.timestamp,
                    on_delivery=report,
                )
            elif which == "command":
                c = plan.commands[i]
                self.producer.produce(
                    self.names.control("orders"), c.value, partition=c.partition, headers=c.headers
                )
            else:
                r = plan.registrations[i]
                self.producer.produce(
                    self.names.subscriptions, r.value, key=r.key, headers=r.headers
                )
            self.producer.poll(0)
        assert self.producer.flush(60) == 0

    def tidy(self, plan: Plan) -> None:
        """Tombstone every registration written (the registry is the module's)."""
        for r in plan.registrations:
            self.producer.produce(self.names.subscriptions, None, key=r.key)
        self.producer.flush(30)


@dataclass
class Answers:
    replies: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # by command id
    failures: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # by sub id
    schema_headers: Counter[str] = field(default_factory=Counter)


def read_answers(
    bootstrap: str, reply_to: str, done: Callable[[Answers], bool], timeout: float
) -> Answers:
    """Everything on ``reply_to`` until ``done`` holds (and 3 s more, for stragglers)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "enable.auto.commit": False,
            "log_level": 3,
        }
    )
    consumer.assign([TopicPartition(reply_to, 0, 0)])
    found = Answers()
    deadline = time.monotonic() + timeout
    extra: float | None = None
    try:
        while time.monotonic() < deadline and (extra is None or time.monotonic() < extra):
            for msg in consumer.consume(500, 0.5):
                if msg.error():
                    continue
                headers = {k: (v or b"").decode() for k, v in msg.headers() or []}
                if h.COMMAND in headers:  # a live message: for us, only failures
                    if headers[h.COMMAND] == "failure":
                        found.failures.setdefault(headers.get(h.SUB_ID, ""), []).append(
                            (headers.get(h.REASON, ""), (msg.value() or b"").decode())
                        )
                    continue
                found.schema_headers[headers.get(h.SCHEMA, "")] += 1
                reply = fastavro.schemaless_reader(io.BytesIO(msg.value()), REPLY, None)
                assert isinstance(reply, dict)
                found.replies.setdefault(reply["command_id"], []).append(reply)
            if extra is None and done(found):
                extra = time.monotonic() + 3.0
    finally:
        consumer.close()
    return found


def read_topic(bootstrap: str, topic: str) -> list[Any]:
    """Every record of partition 0 of ``topic`` up to its end now."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex, "log_level": 3}
    )
    try:
        tp = TopicPartition(topic, 0)
        low, high = consumer.get_watermark_offsets(tp, timeout=30)
        consumer.assign([TopicPartition(topic, 0, low)])
        out: list[Any] = []
        deadline = time.monotonic() + 60
        while len(out) < high - low and time.monotonic() < deadline:
            out.extend(m for m in consumer.consume(500, 0.5) if not m.error())
        return out
    finally:
        consumer.close()


def fold(plan: Plan) -> dict[Any, dict[str, Any]]:
    """The SOW the valid log records make, in log order per partition (which is write order:
    one idempotent producer; the unkeyed ones have ids of their own)."""
    sow: dict[Any, dict[str, Any]] = {}
    for item in plan.log:
        if item.expect != "valid" or item.refused_by_kafka:
            continue
        command = item.headers.get(h.COMMAND) or h.PUBLISH
        if command == h.SOW_DELETE:
            assert item.key is not None
            sow = {k: v for k, v in sow.items() if sow_key(k) != item.key}
            continue
        body = orjson.loads(item.value or b"")
        if command == h.DELTA_PUBLISH and body["id"] in sow:
            sow[body["id"]] = {**sow[body["id"]], **body}
        else:
            sow[body["id"]] = body
    return sow


def history(plan: Plan, ident: Any) -> str:
    """What was written under ``ident``'s SowKey, in order, for a failure message."""
    key = sow_key(ident)
    lines = []
    for item in plan.log:
        if item.key == key or (item.value or b"").startswith(orjson.dumps({"id": ident})[:-1]):
            refused = f" refused by Kafka: {item.refused_by_kafka}" if item.refused_by_kafka else ""
            lines.append(
                f"  {item.partition}@{item.offset} {item.kind} ({item.expect}) "
                f"{item.headers} {(item.value or b'')[:80]!r}{refused}"
            )
    return "\n".join(lines)


def worker_logs(engine: EngineProcesses) -> str:
    return "\n".join(
        (engine.workdir / f"{name}.log").read_text(errors="replace") for name in WORKERS
    )


def test_bad_input_on_every_topic_the_engine_reads(engine: EngineProcesses) -> None:
    rng = random.Random(SEED)
    run = Run(engine)
    missing = engine.prefix + ".reply.never-created-" + uuid.uuid4().hex[:6]
    plan = make_plan(rng, run.reply_to, missing)
    try:
        checked(engine, run, plan)
    except Exception as exc:
        raise AssertionError(
            f"[bad input seed {SEED}: rerun with SOWSTREAM_BAD_INPUT_SEED={SEED}] {exc}"
        ) from exc
    finally:
        run.tidy(plan)


def checked(engine: EngineProcesses, run: Run, plan: Plan) -> None:
    with engine.client(
        timeout=120
    ) as client:  # valid publishes from sowstream's own client, around it all
        for i in range(5):
            client.publish("orders", {"id": 900 + i, "v": i}, ack=True)
        run.write(plan)
        for i in range(5):
            client.publish("orders", {"id": 905 + i, "v": i}, ack=True)
        expected = fold(plan)
        expected.update({900 + i: {"id": 900 + i, "v": i % 5} for i in range(10)})

        acks = {
            item.ack: item
            for item in plan.log
            if item.ack is not None and not item.refused_by_kafka
        }
        answered = {c.command_id: c for c in plan.commands if c.expect is not None}
        told = {r.sub_id: r for r in plan.registrations if r.expect}

        def done(found: Answers) -> bool:
            return (
                all(cid in found.replies for cid in acks)
                and all(
                    any(r["command"] == "part_end" for r in found.replies.get(cid, []))
                    for cid in answered
                )
                and all(sub in found.failures for sub in told)
            )

        found = read_answers(engine.bootstrap, run.reply_to, done, timeout=180)

        # -- nothing crashed ---------------------------------------------------------------
        for name in WORKERS:
            assert engine.alive(name), f"worker {name} died:\n{engine.log_tail(name)}"
        failures = [line for line in worker_logs(engine).splitlines() if FAILURES.search(line)]
        assert not failures, "\n".join(failures[:40])

        # -- every valid record as published -------------------------------------------------
        deadline = time.monotonic() + 60
        while True:
            got = {r["id"]: r for r in client.sow_records("orders")}
            if got == expected or time.monotonic() > deadline:
                break
            time.sleep(1)
        differ = {i for i in expected.keys() | got.keys() if got.get(i) != expected.get(i)}
        assert not differ, "\n".join(
            f"id {i}: SOW {got.get(i)!r:.200}, expected {expected.get(i)!r:.200}\n"
            + history(plan, i)
            for i in sorted(differ, key=str)
        )

    # -- a dead letter per bad log record, naming the problem ------------------------------
    log_topic = run.names.log("orders")
    letters: dict[tuple[int, int], dict[str, Any]] = {}
    letter_versions: Counter[str] = Counter()
    for msg in read_topic(engine.bootstrap, run.names.dead_letter):
        headers = {k: (v or b"").decode() for k, v in msg.headers() or []}
        letter = fastavro.schemaless_reader(io.BytesIO(msg.value()), DEAD_LETTER, None)
        assert isinstance(letter, dict)
        if letter["source_topic"] == log_topic:
            letters[(letter["source_partition"], letter["source_offset"])] = letter
            letter_versions[headers.get(h.SCHEMA, "")] += 1
    bad = [i for i in plan.log if i.expect != "valid" and not i.refused_by_kafka]
    for item in bad:
        letter = letters.get((item.partition, item.offset))
        assert letter is not None, (
            f"no dead letter for {item.kind} at {item.partition}@{item.offset}"
        )
        assert letter["reason"] == item.expect, (item.kind, letter["reason"], letter["error"])
        assert "orders" in letter["error"] and len(letter["error"]) > 20, letter["error"]
        if "sow.expiration" in item.kind:
            assert h.EXPIRATION in letter["error"], letter["error"]
    valid_at = {(i.partition, i.offset) for i in plan.log if i.expect == "valid"}
    assert not valid_at & letters.keys(), "a valid record was dead-lettered"
    assert letter_versions == {"1": len(letters)}, letter_versions

    # -- acks: failed with the reason for bad records, success for valid ones ---------------
    for cid, item in acks.items():
        replies = found.replies.get(cid)
        assert replies, f"no ack for {item.kind}"
        ack = replies[0]
        if item.expect == "valid":
            assert ack["status"] == "success", (item.kind, ack)
        else:
            assert (ack["status"], ack["reason"]) == ("failure", item.expect), (item.kind, ack)
            assert ack["message"], ack

    # -- commands: an answer with the reason where there is an address ---------------------
    for c in plan.commands:
        ends = [r for r in found.replies.get(c.command_id, []) if r["command"] == "part_end"]
        if c.expect is None:
            assert not ends, f"{c.kind} was answered: {ends}"
        elif c.expect == "":
            assert ends and all(e["status"] == "success" for e in ends), (c.kind, ends)
        else:
            assert ends, f"{c.kind} got no answer"
            assert (ends[0]["status"], ends[0]["reason"]) == ("failure", c.expect), (c.kind, ends)
            assert ends[0]["message"], (c.kind, ends)
    assert set(found.schema_headers) == {"1"}, found.schema_headers

    # -- registrations: a failure with the reason, none for the valid ones -----------------
    for r in plan.registrations:
        failed = found.failures.get(r.sub_id, [])
        if r.expect:
            assert failed, f"{r.kind} was not refused"
            assert failed[0][0] == r.expect and failed[0][1], (r.kind, failed)
        else:
            assert not failed, (r.kind, failed)

    # -- the unanswerable ones are the ones the workers logged ------------------------------
    logs = worker_logs(engine)
    undecodable = sum(
        1 for c in plan.commands if c.expect is None and "nothing to answer on" in c.why
    )
    assert logs.count("ignored undecodable command") >= undecodable
    unreadable = sum(1 for r in plan.registrations if r.expect == "bad_registration")
    assert logs.count("ignored unreadable registration") >= unreadable  # by every worker

    # -- the meta topic's definitions carry the schema version ------------------------------
    meta = read_topic(engine.bootstrap, run.names.meta)
    assert meta and all(dict(m.headers() or []).get(h.SCHEMA) == b"1" for m in meta)

    report(plan, found, letters)


def report(plan: Plan, found: Answers, letters: dict[tuple[int, int], dict[str, Any]]) -> None:
    """The counts of the run, as docs/reliability.md shows them."""
    print(f"\nbad input at the wire, seed {SEED}")
    valid = [i for i in plan.log if i.expect == "valid"]
    print(f"log: {len(valid)} valid records ({sum(1 for i in valid if i.ack)} asking for an ack)")
    for kind, n in sorted(Counter(i.kind for i in valid).items()):
        print(f"  {n:3d} {kind}: applied")
    kinds = Counter(
        (i.kind, i.expect, bool(i.refused_by_kafka)) for i in plan.log if i.expect != "valid"
    )
    for (kind, reason, refused), n in sorted(kinds.items()):
        where = "refused by Kafka" if refused else f"dead letter {reason}"
        print(f"  {n:3d} {kind}: {where}")
    failed_acks = sum(1 for i in plan.log if i.ack and i.expect != "valid")
    print(f"  dead letters {len(letters)}, failed acks {failed_acks}")
    print(f"control topic: {len(plan.commands)} commands")
    for (kind, expect, why), n in sorted(
        Counter((c.kind, c.expect, c.why) for c in plan.commands).items(), key=str
    ):
        answer = (
            f"unanswered: {why}"
            if expect is None
            else ("answered, success" if expect == "" else f"failure {expect}")
        )
        print(f"  {n:3d} {kind}: {answer}")
    print(f"registry: {len(plan.registrations)} registrations")
    for (kind, expect, why), n in sorted(
        Counter((r.kind, r.expect, r.why) for r in plan.registrations).items(), key=str
    ):
        answer = (
            f"untold: {why}"
            if expect is None
            else ("held" if expect == "" else f"failure {expect}")
        )
        print(f"  {n:3d} {kind}: {answer}")
