"""The chaos run: a whole engine under mixed load while a controller kills what it can.

Three workers and a broker of their own serve SOW topics of 8 partitions, a grouped view, a join
view and a queue. A load publishes, delta-publishes, deletes and publishes expiring records,
queries the SOW, and feeds the queue; 20 subscriptions with random options (delta, conflation,
pagination, filters) follow it, each one's application copy checked message by message (an
``oof`` only for a record held, carrying what was last received); three queue consumers
acknowledge, cancel or ignore what they lease. Meanwhile the controller SIGKILLs workers at
random and restarts them, restarts the broker once, SIGKILLs a client process and pauses another
past the client timeout. At the end:

- every SOW equals an independent fold of its log;
- every subscriber's copy (the paused process's too) equals a ``sow`` of its filter;
- every queue message was acknowledged, and none leased after its acknowledgement was confirmed;
- every view equals a recomputation from its underlying SOW.

Any difference is printed with the record's history from the log. ``make chaos`` runs it (a few
minutes a run); ``tests/integration/test_chaos.py`` runs one short variant in ``make test``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, TopicPartition

from sowstream.broker.local import LocalBroker
from sowstream.client import Client
from sowstream.errors import CommandTimeoutError, SowstreamError
from sowstream.filters import compile_filter
from tests.support.engine import EngineProcesses
from tests.support.subscriber import Cache, without_nulls
from tests.support.views import recomputed

PARTITIONS = 8
KEYS = 300  # ids 0..299 take publishes, deltas and deletes
EXPIRING = range(1_000, 1_060)  # ids that only ever take expiring publishes
EXPIRATION_S = 2
SYMBOLS = [f"S{i}" for i in range(12)]
DESKS = "abcde"
LEASE_MS = 3_000
CLIENT_TIMEOUT_S = 6
WORKERS = ("w1", "w2", "w3")
# Tries of a subscription placement that times out because a worker was killed just then.
PLACE_ATTEMPTS = 5
FILTERS = [None, "/qty > 500", "/desk = 'a'", "/desk IN ('b', 'c') AND /qty < 700"]

TOPICS: list[dict[str, Any]] = [
    {"Name": "orders", "Key": ["/id"], "Partitions": PARTITIONS, "Expiration": "enabled"},
    {"Name": "prices", "Key": ["/sym"], "Partitions": PARTITIONS},
]
PLAIN: list[dict[str, Any]] = [{"Name": "jobs", "Key": ["/n"], "Partitions": PARTITIONS}]
QUEUES: list[dict[str, Any]] = [
    {
        "Name": "JQ",
        "UnderlyingTopic": "jobs",
        "LeasePeriod": f"{LEASE_MS}ms",
        "MaxPerSubscriptionBacklog": 5,
    }
]
BY_DESK: dict[str, Any] = {
    "Name": "BY_DESK",
    "UnderlyingTopic": "orders",
    "Projection": ["/desk AS /desk", "SUM(/qty) AS /qty", "COUNT(/id) AS /n"],
    "Grouping": ["/desk"],
    "Partitions": 4,
}
VALUE_BY_SYM: dict[str, Any] = {
    "Name": "VALUE_BY_SYM",
    "UnderlyingTopic": {"Join": ["[orders]./sym = [prices]./sym"]},
    "Projection": [
        "[orders]./sym AS /sym",
        "[prices]./px AS /px",
        "SUM([orders]./qty) AS /qty",
    ],
    "Grouping": ["[orders]./sym"],
    "Partitions": 4,
}
VIEWS = [BY_DESK, VALUE_BY_SYM]


# One log record: (partition, offset, key, headers, value).
LogRecord = tuple[int, int, bytes | None, dict[str, bytes], bytes | None]


@dataclass
class Report:
    """What one run did and found."""

    seed: int
    seconds: float
    events: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    published: int = 0
    jobs: int = 0
    subscriptions: int = 0

    def note(self, started: float, what: str) -> None:
        self.events.append(f"{time.monotonic() - started:6.1f}s {what}")


# -- the load ------------------------------------------------------------------------------------


class Load:
    """Publishes to orders, prices and jobs, and queries, until stopped."""

    def __init__(self, engine: EngineProcesses, rng: random.Random) -> None:
        self.engine, self.rng = engine, rng
        self.published = 0
        self.jobs = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with self.engine.client(timeout=20) as client, self.engine.client(timeout=5) as asker:
                while not self.stop.is_set():
                    self._one(client, asker)
                client.flush()
        except BaseException as exc:  # reported at the end
            self.error = exc

    def _one(self, client: Client, asker: Client) -> None:
        rng = self.rng
        time.sleep(0.003)
        roll = rng.random()
        if roll < 0.45:
            i = rng.randrange(KEYS)
            body = {"id": i, "desk": rng.choice(DESKS), "sym": rng.choice(SYMBOLS)}
            client.publish("orders", {**body, "qty": rng.randrange(1000)})
        elif roll < 0.65:
            client.delta_publish("orders", {"id": rng.randrange(KEYS), "qty": rng.randrange(1000)})
        elif roll < 0.70:
            # answered once its partition has applied it; under chaos that may time out
            with contextlib.suppress(SowstreamError):
                client.sow_delete("orders", data={"id": rng.randrange(KEYS)})
        elif roll < 0.76:
            i = rng.choice(EXPIRING)
            body = {"id": i, "desk": rng.choice(DESKS), "sym": rng.choice(SYMBOLS), "qty": 1}
            client.publish("orders", body, expiration=EXPIRATION_S)
        elif roll < 0.82:
            client.publish("prices", {"sym": rng.choice(SYMBOLS), "px": rng.randrange(100, 200)})
        elif roll < 0.97:
            client.publish("jobs", {"n": self.jobs})
            self.jobs += 1
        else:
            # a query under chaos may time out while partitions move; it must not hang
            with contextlib.suppress(SowstreamError):
                asker.sow_records("orders", rng.choice(FILTERS))
        self.published += 1


# -- subscribers ---------------------------------------------------------------------------------


@dataclass
class SubscriberSpec:
    """One subscription's random options."""

    command: str
    filter: str | None
    conflation: bool
    top_n: int | None

    @property
    def options(self) -> str:
        return "oof,conflation=200ms" if self.conflation else "oof"

    def to_args(self) -> list[str]:
        return [self.command, self.filter or "", "1" if self.conflation else "0", str(self.top_n)]

    @classmethod
    def from_args(cls, args: list[str]) -> SubscriberSpec:
        return cls(
            args[0], args[1] or None, args[2] == "1", None if args[3] == "None" else int(args[3])
        )

    def place(self, client: Client) -> Any:
        """Subscribe, asking again as an application would while a worker is being killed (a
        partition's answer does not come in time; the client removed the failed attempt)."""
        place = getattr(client, self.command)
        for attempt in range(PLACE_ATTEMPTS):
            try:
                if self.top_n is not None:
                    return place(
                        "orders",
                        self.filter,
                        options=self.options,
                        top_n=self.top_n,
                        order_by="/id",
                    )
                return place("orders", self.filter, options=self.options)
            except CommandTimeoutError:
                if attempt == PLACE_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    def wanted(self, sow: dict[str, Any]) -> dict[str, Any]:
        """What the subscriber must hold when the topic holds ``sow`` (SowKey -> body)."""
        flt = compile_filter(self.filter) if self.filter else None
        rows = {k: v for k, v in sow.items() if flt is None or flt.matches(v)}
        if self.top_n is not None:
            kept = sorted(rows.items(), key=lambda kv: kv[1]["id"])[: self.top_n]
            rows = dict(kept)
        return {k: without_nulls(v) for k, v in rows.items()}


def random_spec(rng: random.Random) -> SubscriberSpec:
    command = rng.choice(["sow_and_subscribe", "sow_and_delta_subscribe"])
    top_n = rng.choice([None, None, None, 10])
    conflation = rng.random() < 0.4 and top_n is None
    return SubscriberSpec(command, rng.choice(FILTERS), conflation, top_n)


class Follower:
    """An application's copy of one subscription, checked message by message."""

    def __init__(self, spec: SubscriberSpec, sub: Any) -> None:
        self.spec, self.sub = spec, sub
        self.cache = Cache(held_only=True, oof_last=spec.conflation)
        self.error: str | None = None
        self.lock = threading.Lock()
        self.seen: dict[str, list[str]] = {}  # per record, the messages it had (for the report)

    def pump(self) -> None:
        while (msg := self.sub.next(timeout=0)) is not None:
            if msg.command not in ("sow", "publish", "oof"):
                continue
            with self.lock:
                story = self.seen.setdefault(msg.sow_key, [])
                story.append(
                    f"{msg.command}{'/' + msg.reason if msg.reason else ''}@{msg.bookmark}"
                )
                try:
                    self.cache.apply(msg)
                except AssertionError as exc:
                    self.error = self.error or (
                        f"{msg.command} {msg.sow_key}: {exc} (its messages: {story[-8:]}; "
                        f"interruptions: {getattr(self.sub, 'interruptions', [])})"
                    )

    def view(self) -> dict[str, Any]:
        with self.lock:
            return self.cache.view()


def follow(followers: list[Follower], stop: threading.Event) -> None:
    while not stop.is_set():
        for f in followers:
            try:
                f.pump()
            except SowstreamError as exc:  # a dropped subscription: reported at the end
                f.error = f.error or f"subscription failed: {exc}"
        time.sleep(0.02)


def subscriber_process(args: argparse.Namespace) -> None:
    """A subscriber in a process of its own (to be killed or paused); its copy goes to a file."""
    spec = SubscriberSpec.from_args(args.spec)
    out = Path(args.out)
    # What the client held, dropped and let through, to the process's log: a wrong copy at the
    # end can be followed message by message.
    logging.basicConfig(stream=sys.stdout, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("sowstream.client").setLevel(logging.DEBUG)
    with Client(args.bootstrap, prefix=args.prefix, timeout=30, name=args.name) as client:
        follower = Follower(spec, spec.place(client))
        if args.queue:
            client.subscribe("JQ", options="max_backlog=5")  # leases it never acknowledges
        while True:
            follower.pump()
            tmp = out.with_suffix(".tmp")
            tmp.write_bytes(orjson.dumps({"cache": follower.view(), "error": follower.error}))
            tmp.replace(out)
            time.sleep(0.2)


# -- the queue -----------------------------------------------------------------------------------


class Ledger:
    """What the queue consumers leased and had confirmed."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.confirmed: Counter[int] = Counter()
        self.first_confirmed: dict[int, int] = {}
        self.leased_at: dict[int, list[int]] = {}
        self.events: dict[int, list[str]] = {}

    def after_ack(self) -> list[int]:
        return sorted(
            n
            for n, first in self.first_confirmed.items()
            if any(at > first for at in self.leased_at.get(n, ()))
        )


def consume(client: Client, ledger: Ledger, rng: random.Random, stop: threading.Event) -> None:
    sub = client.subscribe("JQ", options="max_backlog=5")
    while not stop.is_set():
        try:
            msg = sub.next(timeout=0.5)
        except SowstreamError:
            sub = client.subscribe("JQ", options="max_backlog=5")
            continue
        if msg is None:
            continue
        n = msg.json()["n"]
        with ledger.lock:
            assert msg.lease_expires is not None
            ledger.leased_at.setdefault(n, []).append(msg.lease_expires - LEASE_MS)
            ledger.events.setdefault(n, []).append(
                f"{time.strftime('%H:%M:%S')} leased #{msg.deliveries} ({msg.bookmark})"
            )
        roll = rng.random()
        if roll < 0.08:
            continue  # ignored: its lease ends and it comes back
        if roll < 0.16:
            with contextlib.suppress(SowstreamError):
                client.ack("JQ", msg.bookmark, action="cancel", wait=False)
            continue
        for attempt in range(6):  # until it is answered: workers may be killed again meanwhile
            try:
                removed = client.ack("JQ", msg.bookmark)
            except SowstreamError as exc:
                # Its partition is changing hands: the ack may still be applied (so the message
                # is gone) or not (it comes again); an application asks again to know which.
                with ledger.lock:
                    ledger.events[n].append(
                        f"{time.strftime('%H:%M:%S')} ack #{attempt + 1} failed: {exc}"
                    )
                continue
            with ledger.lock:
                ledger.events[n].append(
                    f"{time.strftime('%H:%M:%S')} ack #{attempt + 1} answered {removed}"
                )
                if removed:
                    ledger.confirmed[n] += 1
                    ledger.first_confirmed.setdefault(n, int(time.time() * 1000))
            break
    sub.close()


# -- the reference -------------------------------------------------------------------------------


def read_log(bootstrap: str, topic: str) -> list[LogRecord]:
    """Every record of ``topic``, partition by partition."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex, "enable.auto.commit": False}
    )
    out = []
    for p in range(PARTITIONS):
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        if high <= 0:
            continue
        consumer.assign([TopicPartition(topic, p, 0)])
        last = -1
        while last < high - 1:
            # no more than are left: consume() returns once it has them (it waits out its
            # timeout for a batch it cannot fill)
            for msg in consumer.consume(min(1000, high - 1 - last), 2.0):
                if msg.error():
                    continue
                last = msg.offset()
                out.append((p, last, msg.key(), dict(msg.headers() or []), msg.value()))
    consumer.close()
    return out


def fold(
    records: list[LogRecord],
) -> dict[bytes, Any]:
    """An independent fold: publish replaces, delta merges, delete removes; expiring records
    (all of them expired by the end) are left out."""

    def merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
        out = dict(old)
        for k, v in new.items():
            out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out

    state: dict[bytes, Any] = {}
    for _, _, key, headers, value in records:
        if key is None:
            continue
        cmd = (headers.get("sow.cmd") or b"publish").decode()
        if cmd in ("sow_delete", "sow_expire"):  # only expiring ids are ever removed on expiry
            state.pop(key, None)
        elif cmd == "delta_publish":
            if key in state:
                state[key] = merge(state[key], orjson.loads(value or b"{}"))
            else:
                state[key] = orjson.loads(value or b"{}")
        else:
            state[key] = orjson.loads(value or b"{}")
    return {k: v for k, v in state.items() if v.get("id") not in EXPIRING}


def history(records: list[LogRecord], key: str) -> str:
    lines = [
        f"    p{p}@{o} {(h.get('sow.cmd') or b'publish').decode()} {value!r}"
        for p, o, k, h, value in records
        if k is not None and k.decode() == key
    ]
    return "\n".join(lines[-8:]) or "    (not in the log)"


def snapshot(client: Client, topic: str) -> dict[str, Any]:
    return {m.sow_key: m.json() for m in client.sow(topic, batch_size=500) if m.command == "sow"}


def settled(probe: Callable[[], tuple[bool, str]], timeout: float) -> str | None:
    """None once ``probe`` says yes within ``timeout``; else what it last said."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            ok, detail = probe()
        except SowstreamError as exc:
            ok, detail = False, f"no answer: {exc}"
        if ok:
            return None
        if time.monotonic() > deadline:
            return detail
        time.sleep(0.5)


def differences(got: dict[str, Any], wanted: dict[str, Any]) -> str:
    missing = sorted(wanted.keys() - got.keys())
    extra = sorted(got.keys() - wanted.keys())
    wrong = sorted(k for k in wanted.keys() & got.keys() if wanted[k] != got[k])
    return f"missing {missing[:5]}, extra {extra[:5]}, wrong {wrong[:5]}"


# -- one run -------------------------------------------------------------------------------------


def run(workdir: Path, seconds: float, seed: int, *, restart_broker: bool = True) -> Report:
    """One chaos run of ``seconds`` of load; the report lists what happened and what was wrong."""
    rng = random.Random(seed)
    report = Report(seed, seconds)
    started = time.monotonic()
    broker = LocalBroker(workdir / "kafka")
    bootstrap = broker.start()
    engine = EngineProcesses(
        bootstrap,
        workdir,
        TOPICS,
        plain_topics=PLAIN,
        queues=QUEUES,
        views=VIEWS,
        engine_extra={"slow_consumer": {"client_timeout": f"{CLIENT_TIMEOUT_S}s"}},
    )
    stop = threading.Event()
    clients: list[Client] = []
    procs: dict[str, subprocess.Popen[bytes]] = {}
    threads: list[threading.Thread] = []
    try:
        for name in WORKERS:
            engine.start(name)
        engine.wait_ready(["orders", "prices", *(v["Name"] for v in VIEWS)], timeout=180)
        report.note(started, "engine ready: 3 workers")
        load = Load(engine, random.Random(seed + 1))
        load.thread.start()
        # subscribers: 20 in this process over 4 clients, placed before and during the load
        followers: list[Follower] = []
        clients.extend(engine.client(timeout=30) for _ in range(4))
        for i in range(20):
            spec = random_spec(rng)
            followers.append(Follower(spec, spec.place(clients[i % 4])))
            if i == 9:
                time.sleep(1.0)
        report.subscriptions = len(followers)
        threads.append(threading.Thread(target=follow, args=(followers, stop), daemon=True))
        # queue consumers
        ledger = Ledger()
        for i in range(3):
            consumer_client = engine.client(timeout=15)
            clients.append(consumer_client)
            threads.append(
                threading.Thread(
                    target=consume,
                    args=(consumer_client, ledger, random.Random(seed + 10 + i), stop),
                    daemon=True,
                )
            )
        for t in threads:
            t.start()
        # two client processes: one to kill, one to pause
        specs = {
            "victim": random_spec(rng),
            "sleeper": SubscriberSpec("sow_and_subscribe", None, False, None),
        }
        for name, spec in specs.items():
            procs[name] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.support.chaos",
                    "subscriber",
                    "--bootstrap",
                    bootstrap,
                    "--prefix",
                    engine.prefix,
                    "--out",
                    str(workdir / f"{name}.json"),
                    "--name",
                    f"{name}-{seed}",
                    *(["--queue"] if name == "victim" else []),
                    "--spec",
                    *spec.to_args(),
                ],
                stdout=open(workdir / f"{name}.log", "ab"),  # noqa: SIM115
                stderr=subprocess.STDOUT,
            )
        chaos(engine, broker, procs, rng, seconds, report, started, restart_broker)
        load.stop.set()
        load.thread.join(60)
        if load.error is not None:
            report.problems.append(f"the load failed: {load.error!r}")
        report.published, report.jobs = load.published, load.jobs
        report.note(started, f"load stopped: {load.published} operations, {load.jobs} jobs")
        for name in WORKERS:
            if not engine.alive(name):
                engine.start(name)
        engine.wait_ready(["orders"], timeout=180)
        report.note(started, "workers ready again")
        check(engine, report, followers, ledger, load.jobs, workdir, started)
    except Exception as exc:
        report.problems.append(f"the run failed: {str(exc)[:3000]!r}")
    finally:
        report.note(started, "stopping")
        stop.set()
        for t in threads:
            t.join(30)
        report.note(started, "threads stopped")
        for proc in procs.values():
            with contextlib.suppress(Exception):
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
        for client in clients:
            with contextlib.suppress(Exception):
                client.close()
        report.note(started, "clients closed")
        engine.stop_all()
        report.note(started, "workers stopped")
        broker.stop()
    report.note(started, f"done: {len(report.problems)} problems")
    return report


def chaos(
    engine: EngineProcesses,
    broker: LocalBroker,
    procs: dict[str, subprocess.Popen[bytes]],
    rng: random.Random,
    seconds: float,
    report: Report,
    started: float,
    restart_broker: bool,
) -> None:
    """Kill and restart things at random for ``seconds``."""
    end = time.monotonic() + seconds
    broker_at = time.monotonic() + seconds * rng.uniform(0.3, 0.6) if restart_broker else None
    victim_at = time.monotonic() + seconds * rng.uniform(0.2, 0.5)
    sleeper_at = time.monotonic() + seconds * rng.uniform(0.1, 0.4)
    while time.monotonic() < end:
        time.sleep(rng.uniform(2.0, 5.0))
        now = time.monotonic()
        if broker_at is not None and now >= broker_at:
            broker.stop()
            report.note(started, "broker stopped")
            time.sleep(3.0)
            broker.start()
            report.note(started, "broker started again")
            broker_at = None
            continue
        if now >= victim_at and procs["victim"].poll() is None:
            procs["victim"].kill()
            report.note(started, "client process 'victim' SIGKILLed")
        if now >= sleeper_at and procs["sleeper"].poll() is None:
            os.kill(procs["sleeper"].pid, signal.SIGSTOP)
            report.note(started, f"client process 'sleeper' paused for {CLIENT_TIMEOUT_S + 4}s")
            time.sleep(CLIENT_TIMEOUT_S + 4)
            os.kill(procs["sleeper"].pid, signal.SIGCONT)
            report.note(started, "client process 'sleeper' resumed")
            sleeper_at = float("inf")
        name = rng.choice(WORKERS)
        if engine.alive(name):
            engine.stop(name, kill=True)
            report.note(started, f"{name} SIGKILLed")
            time.sleep(rng.uniform(1.0, 4.0))
            engine.start(name)
            report.note(started, f"{name} started again")


def check(
    engine: EngineProcesses,
    report: Report,
    followers: list[Follower],
    ledger: Ledger,
    jobs: int,
    workdir: Path,
    started: float,
) -> None:
    """The end state against its references; every difference goes into the report."""
    problems = report.problems
    with engine.client(timeout=30) as client:
        log_topic = client.topic_info("orders").log_topic
        records = read_log(engine.bootstrap, log_topic)
        expected = {k.decode(): v for k, v in fold(records).items()}

        def sow_is_fold() -> tuple[bool, str]:
            got = snapshot(client, "orders")
            return got == expected, differences(got, expected)

        if (detail := settled(sow_is_fold, 120)) is not None:
            got = snapshot(client, "orders")
            keys = sorted(
                {
                    *(expected.keys() ^ got.keys()),
                    *(k for k in expected if got.get(k) != expected[k]),
                }
            )
            stories = "\n".join(f"  {k}:\n{history(records, k)}" for k in keys[:3])
            problems.append(f"orders SOW != fold of its log: {detail}\n{stories}")
        report.note(started, "SOW checked")
        sow = snapshot(client, "orders")
        wanted = [f.spec.wanted(sow) for f in followers]

        def subscribers_hold_sow() -> tuple[bool, str]:
            wrong = [n for n, f in enumerate(followers) if f.view() != wanted[n]]
            return not wrong, f"subscribers {wrong} differ from the SOW"

        settled(subscribers_hold_sow, 90)  # one deadline for all of them
        for n, f in enumerate(followers):
            if f.view() != wanted[n]:
                problems.append(f"subscriber {n} ({f.spec}): {differences(f.view(), wanted[n])}")
            if f.error is not None:
                problems.append(f"subscriber {n} ({f.spec}): {f.error}")
        report.note(started, "subscribers checked")
        sleeper = SubscriberSpec("sow_and_subscribe", None, False, None).wanted(sow)

        def sleeper_holds() -> tuple[bool, str]:
            state = orjson.loads((workdir / "sleeper.json").read_bytes())
            if state["error"]:
                return False, state["error"]
            return state["cache"] == sleeper, differences(state["cache"], sleeper)

        if (detail := settled(sleeper_holds, 60)) is not None:
            keys = list(dict.fromkeys(re.findall(r"\b[A-Za-z0-9_-]{16}\b", detail)))[:2]
            stories = "".join(f"\n  {k} in the log:\n{history(records, k)}" for k in keys)
            problems.append(f"the paused client process: {detail}{stories}")

        report.note(started, "paused client checked")

        def all_acked() -> tuple[bool, str]:
            with ledger.lock:
                missing = sorted(set(range(jobs)) - set(ledger.confirmed))
                stories = "; ".join(f"{n}: {ledger.events.get(n)}" for n in missing[:3])
            return not missing, f"never acknowledged: {missing[:10]} of {len(missing)} ({stories})"

        if (detail := settled(all_acked, 120)) is not None:
            problems.append(f"queue JQ: {detail}")
        report.note(started, "queue checked")
        if after := ledger.after_ack():
            stories = "; ".join(f"{n}: {ledger.events.get(n)}" for n in after[:3])
            problems.append(
                f"queue JQ: leased again after a confirmed ack: {after[:10]} ({stories})"
            )
        for view in VIEWS:
            name = view["Name"]

            def view_is_recomputed(
                name: str = name, view: dict[str, Any] = view
            ) -> tuple[bool, str]:
                got, want = snapshot(client, name), recomputed(client, view)
                return got == want, differences(got, want)

            if (detail := settled(view_is_recomputed, 120)) is not None:
                problems.append(f"view {name} != a recomputation from its underlying SOW: {detail}")
        report.note(started, "views checked")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="what", required=True)
    runs = sub.add_parser("run", help="chaos runs, one after another")
    runs.add_argument("--runs", type=int, default=1)
    runs.add_argument("--seconds", type=float, default=90.0)
    runs.add_argument("--seed", type=int, default=None)
    runs.add_argument("--workdir", type=Path, default=Path(".sowstream/chaos"))
    follower = sub.add_parser("subscriber", help="(internal) a subscriber process")
    follower.add_argument("--bootstrap", required=True)
    follower.add_argument("--prefix", required=True)
    follower.add_argument("--out", required=True)
    follower.add_argument("--name", required=True)
    follower.add_argument("--queue", action="store_true")
    follower.add_argument("--spec", nargs=4, required=True)
    args = parser.parse_args()
    if args.what == "subscriber":
        subscriber_process(args)
        return
    failed = 0
    for i in range(args.runs):
        seed = args.seed if args.seed is not None else random.randrange(1 << 30)
        workdir = args.workdir / f"run-{i}-{seed}"
        workdir.mkdir(parents=True, exist_ok=True)
        report = run(workdir, args.seconds, seed)
        failed += bool(report.problems)
        print(
            f"=== run {i + 1}/{args.runs}, seed {seed}: {report.published} operations, "
            f"{report.jobs} jobs, {report.subscriptions} subscriptions"
        )
        for line in report.events:
            print(f"  {line}")
        for problem in report.problems:
            print(f"  PROBLEM: {problem}")
        print("  OK" if not report.problems else f"  {len(report.problems)} problems", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
