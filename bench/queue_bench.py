"""Queue benchmark: messages leased and acknowledged per second against Kafka share groups.

Run with ``make bench-queues`` (``python -m bench.queue_bench``; ``--messages 3000`` is
quicker). It uses $SOWSTREAM_BOOTSTRAP or starts the embedded local broker, and one worker. For
1, 4 and 16 subscribers at backlog 1, 10 and 100 it publishes the same number of messages, lets
the subscribers lease and acknowledge every one, and compares the rate with a bare
confluent-kafka consumer group of as many members reading (and committing) 20 times as many
records of the same size, and with a Kafka share group (KIP-932) of as many consumers acquiring
the same messages and acknowledging each ACCEPT (``bench.share_groups``); all are timed from
the first message received to the last, and every queue row prints its ratio to the share
group. Then, at half the best one-subscriber rate, it reports publish→delivery latency and the
ack round trip against bare Kafka's produce→consume and a share consumer's produce→delivery
latency in the same run. Everything printed is measured in this run.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import signal
import statistics
import subprocess
import threading
import time
import urllib.request
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import orjson
import psutil
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition
from rich.console import Console
from rich.table import Table

from bench.common import (
    bench_bootstrap,
    paced,
    pct,
    profiled,
    stop_process,
    wait_queryable,
    worker_command,
    workspace,
)
from bench.share_groups import share_group_latency, share_group_rate
from bench.spy_split import split_file
from sowstream.broker.local import free_port
from sowstream.client import Client, Message
from sowstream.wire import headers as h
from sowstream.wire.kafka import TopicSpec, ensure_topics, producer_config
from sowstream.wire.leases import PUBLISH_PACKED, LeaseBatch

console = Console(stderr=True)
PARTITIONS = 4


def write_config(work: Path, prefix: str, view: bool = False, backlog: int = 100) -> Path:
    """The run's configuration; ``backlog``: the queue's MaxPerSubscriptionBacklog, which caps
    every subscriber's max_backlog (the largest the run asks for)."""
    config: dict[str, Any] = {
        "engine": {"app_id": prefix, "topic_prefix": prefix},
        "topics": [{"Name": "jobs", "Key": "/n", "Partitions": PARTITIONS}],
        "queues": [{"Name": "BQ", "UnderlyingTopic": "jobs", "MaxPerSubscriptionBacklog": backlog}],
    }
    if view:
        # The worst case for the view: every lease and removal changes its one group.
        config["views"] = [
            {
                "Name": "BQ_waiting",
                "UnderlyingTopic": "BQ",
                "Projection": ["COUNT(/n) AS /waiting", "/kind AS /kind"],
                "Grouping": ["/kind"],
            }
        ]
    path = work / "queues.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def cpu_seconds(proc: psutil.Process) -> float:
    """User and system CPU ``proc`` has used so far (all its threads)."""
    times = proc.cpu_times()
    return float(times.user + times.system)


def all_cpu_seconds() -> float:
    """CPU used so far by this process (publisher and subscribers) and its children (the
    worker, and the broker when it is the embedded one)."""
    me = psutil.Process()
    total = cpu_seconds(me)
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += cpu_seconds(child)
    return total


def leased_rate(
    bootstrap: str,
    prefix: str,
    run: int,
    messages: int,
    subs: int,
    backlog: int,
    worker: psutil.Process,
) -> tuple[float, float, float, float]:
    """Messages/s leased and acknowledged by ``subs`` subscribers until ``messages`` are done,
    and the CPU per message (µs) from the first publish to the last acknowledgement of the
    worker (applying the publishes, leasing, storing the removals) and of every process of
    the run (worker, clients, embedded broker), and of this process alone (the clients)."""
    clients = [Client(bootstrap, prefix=prefix, timeout=30) for _ in range(subs + 1)]
    for c in clients:
        c.connect()
    done = threading.Semaphore(0)
    counted = [0]
    times: list[float] = []
    lock = threading.Lock()
    first = run * messages
    try:
        batch = max(1, min(backlog // 2, 50))

        def handle(msg: Message) -> None:
            with lock:
                counted[0] += 1
                if counted[0] == 1:
                    times.append(time.perf_counter())
                if counted[0] >= messages:
                    times.append(time.perf_counter())
                    done.release()

        subscriptions = [
            c.subscribe(
                "BQ",
                options=f"max_backlog={backlog}",
                auto_ack=True,
                ack_batch_size=batch,
                on_message=handle,
            )
            for c in clients[:subs]
        ]
        time.sleep(1.0)  # registered on the worker before the messages come
        publisher = clients[subs]
        cpu_before, all_before = cpu_seconds(worker), all_cpu_seconds()
        clients_before = cpu_seconds(psutil.Process())
        for n in range(first, first + messages):
            publisher.publish("jobs", {"n": n, "pad": "x" * 64})
        publisher.flush()
        # Batched acks: flush what is left now and then, so the last messages free their units.
        while not done.acquire(timeout=0.2):
            for sub in subscriptions:
                sub.flush_acks()
        cpu = cpu_seconds(worker) - cpu_before
        everything = all_cpu_seconds() - all_before
        own = cpu_seconds(psutil.Process()) - clients_before
        for sub in subscriptions:
            sub.close()
        # From the first delivery to the last, as the consumer group is timed.
        per = 1e6 / messages
        rate = messages / max(times[-1] - times[0], 1e-3)
        return rate, cpu * per, own * per, everything * per
    finally:
        for c in clients:
            c.close()


def consumer_group_rate(bootstrap: str, topic: str, messages: int, members: int) -> float:
    """Records/s a bare consumer group of ``members`` reads (committing as it goes), timed from
    its first record to its last, on a topic of its own, once the group has settled."""
    ensure_topics(bootstrap, [TopicSpec(topic, PARTITIONS, {})], replication_factor=1)
    group = f"bench-{uuid.uuid4().hex[:8]}"
    count = [0]
    times: list[float] = []
    assigned: dict[int, int] = {}
    lock = threading.Lock()
    finished = threading.Event()

    def member(index: int) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": True,
                "fetch.wait.max.ms": 10,
            }
        )
        consumer.subscribe([topic])
        while not finished.is_set():
            batch = consumer.consume(500, 0.1)
            with lock:
                assigned[index] = len(consumer.assignment())
                for msg in batch:
                    if msg.error():
                        continue
                    count[0] += 1
                    if count[0] == 1:
                        times.append(time.perf_counter())
                    if count[0] >= messages:
                        times.append(time.perf_counter())
                        finished.set()
        consumer.close()

    threads = [threading.Thread(target=member, args=(i,)) for i in range(members)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # every partition assigned: the group has settled
        with lock:
            if sum(assigned.values()) == PARTITIONS and len(assigned) == members:
                break
        time.sleep(0.1)
    time.sleep(1.0)
    producer = Producer(producer_config(bootstrap, {}))
    for n in range(messages):
        value = orjson.dumps({"n": n, "pad": "x" * 64})
        while True:
            try:
                producer.produce(topic, value, key=str(n).encode())
                break
            except BufferError:  # the local queue is full: let it drain
                producer.poll(0.05)
        producer.poll(0)
    producer.flush()
    finished.wait(120)
    for t in threads:
        t.join()
    return messages / max(times[-1] - times[0], 1e-3)


def publish_paced(bootstrap: str, prefix: str, rate: float, seconds: float, out: Any) -> None:
    """The latency run's publisher, in a process of its own (``--latency-publisher-process``):
    puts the rate achieved on ``out``."""
    with Client(bootstrap, prefix=prefix, config={"linger.ms": "0"}) as pub:
        achieved = paced(
            lambda i: pub.publish("jobs", {"n": 10**9 + i, "sent": time.time(), "pad": "x" * 64}),
            rate,
            seconds,
        )
        pub.flush()
    out.put(achieved)


def worker_hop(reply_topic: str, bootstrap: str) -> list[float]:
    """Per lease of the latency run on ``reply_topic``: the lease record's Kafka timestamp
    minus the leased message's log timestamp (ms), i.e. the worker's part of the latency."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"peek-{uuid.uuid4().hex}"})
    out: list[float] = []
    try:
        tp = TopicPartition(reply_topic, 0, 0)
        _, end = consumer.get_watermark_offsets(tp, timeout=10)
        consumer.assign([tp])
        seen, deadline = 0, time.monotonic() + 30
        while seen < end and time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.5):
                if msg.error():
                    continue
                seen = (msg.offset() or 0) + 1
                if h.header_map(msg.headers() or []).get(h.COMMAND) != PUBLISH_PACKED:
                    continue
                produced_ms = msg.timestamp()[1]
                batch = LeaseBatch(msg.value() or b"")
                for i in range(batch.count):
                    lease = batch.lease(i)
                    if b'"warm-up"' not in lease.data:
                        out.append(produced_ms - lease.timestamp)
    finally:
        consumer.close()
    return out


def stage_buckets(port: int) -> dict[str, dict[float, float]]:
    """The worker's ``sowstream_batch_stage_seconds`` buckets per stage (cumulative counts)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return {}
    out: dict[str, dict[float, float]] = {}
    for line in text.splitlines():
        if not line.startswith("sowstream_batch_stage_seconds_bucket{"):
            continue
        labels, value = line.rsplit(" ", 1)
        stage = labels.split('stage="', 1)[1].split('"', 1)[0]
        bound = labels.split('le="', 1)[1].split('"', 1)[0]
        out.setdefault(stage, {})[float(bound)] = float(value)
    return out


def stage_quantiles(
    before: dict[str, dict[float, float]], after: dict[str, dict[float, float]]
) -> dict[str, tuple[float, float, int]]:
    """Per stage, the p50 and p99 bucket bounds (s) and the count of the batches between two
    scrapes."""
    out: dict[str, tuple[float, float, int]] = {}
    for stage, buckets in after.items():
        old = before.get(stage, {})
        counts = sorted((bound, n - old.get(bound, 0.0)) for bound, n in buckets.items())
        total = counts[-1][1] if counts else 0.0
        if total <= 0:
            continue
        p50 = next(bound for bound, n in counts if n >= total * 0.5)
        p99 = next(bound for bound, n in counts if n >= total * 0.99)
        out[stage] = (p50, p99, int(total))
    return out


def timed_hops(msg: Message, latencies: list[float], hops: dict[str, list[float]]) -> None:
    """Publish→delivery of a lease (ms), and its two hops: to the log (the log record's Kafka
    timestamp, in the lease) and from there to the subscriber."""
    now = time.time()
    sent = msg.json()["sent"]
    latencies.append((now - sent) * 1000)
    hops["publish → log"].append(msg.timestamp - sent * 1000)
    hops["log → lease delivered"].append(now * 1000 - msg.timestamp)


def queue_latency(
    bootstrap: str,
    prefix: str,
    rate: float,
    seconds: float,
    worker: psutil.Process,
    profile: Path | None = None,
    backlog: int = 100,
    publisher_process: bool = False,
    metrics_port: int | None = None,
) -> tuple[list[float], list[float], float, dict[str, float]]:
    """Publish→delivery latencies (ms) at ``rate``, ack round trips (ms), the publish rate
    achieved, one subscriber; and the share of one core the worker and this process (the
    publisher and the subscriber) used while publishing, to tell which one could not keep up.
    With ``profile``, the worker is recorded (py-spy) while publishing."""
    latencies: list[float] = []
    acks: list[float] = []
    busy: dict[str, float] = {}
    hops: dict[str, list[float]] = {"publish → log": [], "log → lease delivered": []}
    # Without linger, as the bare producer below: each publish leaves at once, unflushed (a
    # flush per message would cap the rate at one broker round trip per message).
    with (
        Client(bootstrap, prefix=prefix) as sub_client,
        Client(bootstrap, prefix=prefix, config={"linger.ms": "0"}) as pub,
    ):
        # Consumed as the best one-subscriber row was: a handler, acknowledgements in batches
        # (at least every 50 ms), without waiting, as applications do.
        timed = sub_client.subscribe(
            "BQ",
            options=f"max_backlog={backlog}",
            auto_ack=True,
            ack_batch_size=50,
            ack_interval=0.05,
            on_message=lambda msg: timed_hops(msg, latencies, hops),
        )
        # Until a first lease comes back: the subscription's placement and the first lease of
        # a new subscriber take a few seconds, and messages published meanwhile would wait for
        # it (the whole run then measures the drain of that start-up backlog).
        deadline = time.monotonic() + 60
        while not latencies and time.monotonic() < deadline:
            pub.publish("jobs", {"n": 10**9 - 1, "sent": time.time(), "pad": "warm-up"})
            pub.flush()
            time.sleep(0.5)
        time.sleep(1.0)
        latencies.clear()
        for values in hops.values():
            values.clear()
        spy = profiled(worker.pid, profile, gil=True) if profile is not None else None
        me = psutil.Process()
        stages_before = stage_buckets(metrics_port) if metrics_port else {}
        started = time.perf_counter()
        worker_before, me_before = cpu_seconds(worker), cpu_seconds(me)
        if publisher_process:
            ctx = multiprocessing.get_context("spawn")
            out = ctx.Queue()
            child = ctx.Process(target=publish_paced, args=(bootstrap, prefix, rate, seconds, out))
            child.start()
            achieved = float(out.get(timeout=seconds + 120))
            child.join(60)
        else:
            achieved = paced(
                lambda i: pub.publish(
                    "jobs", {"n": 10**9 + i, "sent": time.time(), "pad": "x" * 64}
                ),
                rate,
                seconds,
            )
        span = time.perf_counter() - started
        if metrics_port:
            stages = stage_quantiles(stages_before, stage_buckets(metrics_port))
            console.print(
                "the log batches of the latency run, seconds since their fetch at the end of "
                "each stage (bucket bounds, p50 / p99): "
                + "; ".join(f"{k} {a:g} / {b:g} ({n})" for k, (a, b, n) in stages.items())
            )
        busy["worker"] = (cpu_seconds(worker) - worker_before) / span
        busy["clients"] = (cpu_seconds(me) - me_before) / span
        for hop, values in hops.items():
            busy[f"{hop} p50"] = pct(values, 0.5)
            busy[f"{hop} p99"] = pct(values, 0.99)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
        pub.flush()
        time.sleep(2.0)
        timed.close()
        # Where the worker stood: each lease record's Kafka timestamp (set when the worker
        # produced it) against the log time of the leases in it.
        produced = worker_hop(sub_client.reply_topic, bootstrap)
        busy["log → lease produced p50"] = pct(produced, 0.5)
        busy["log → lease produced p99"] = pct(produced, 0.99)
        n = 2 * 10**9  # numbers the paced run did not use
        # The ack round trip on its own: one message at a time, each ack waiting for its answer.
        sub = sub_client.subscribe("BQ")
        for _ in range(200):
            pub.publish("jobs", {"n": n, "sent": time.time()})
            pub.flush()
            n += 1
            msg = sub.next(timeout=10)
            if msg is None:
                break
            t0 = time.perf_counter()
            sub_client.ack("BQ", msg.bookmark)
            acks.append((time.perf_counter() - t0) * 1000)
        sub.close()
    return latencies, acks, achieved, busy


def kafka_latency(
    bootstrap: str, topic: str, rate: float, seconds: float
) -> tuple[list[float], float]:
    """Bare produce→consume latencies (ms) at ``rate``, and the produce rate achieved."""
    latencies: list[float] = []
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "auto.offset.reset": "latest",
            "fetch.wait.max.ms": 10,  # as the sowstream client's reply reader
        }
    )
    consumer.subscribe([topic])
    consumer.consume(1, 3.0)  # joined
    producer = Producer(producer_config(bootstrap, {"linger.ms": "0"}))
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set():
            for msg in consumer.consume(100, 0.2):
                if not msg.error():
                    sent = orjson.loads(msg.value() or b"{}")["sent"]
                    latencies.append((time.time() - sent) * 1000)

    reader = threading.Thread(target=consume)
    reader.start()

    def send(_: int) -> None:
        producer.produce(topic, orjson.dumps({"sent": time.time(), "pad": "x" * 64}))
        producer.poll(0)

    achieved = paced(send, rate, seconds)
    producer.flush()
    time.sleep(2.0)
    stop.set()
    reader.join()
    consumer.close()
    return latencies, achieved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=10_000, help="messages per measurement")
    parser.add_argument("--subscribers", default="1,4,16")
    parser.add_argument("--backlogs", default="1,10,100")
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument(
        "--latency-publisher-process",
        action="store_true",
        help="publish the latency run from a process of its own (not beside the subscriber)",
    )
    parser.add_argument(
        "--latency-backlog",
        type=int,
        default=100,
        help="the latency run's subscriber max_backlog (its unacknowledged leases at most)",
    )
    parser.add_argument(
        "--view", action="store_true", help="a view counts the queue's available messages"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="py-spy (raw format, --gil) of the worker during the leasing rows, written here",
    )
    args = parser.parse_args()
    subscribers = [int(s) for s in args.subscribers.split(",")]
    backlogs = [int(b) for b in args.backlogs.split(",")]
    rows: list[tuple[int, int, float, float, float, float, float, float]] = []
    with ExitStack() as stack:
        bootstrap = bench_bootstrap(stack)
        work, prefix = workspace(stack, "queuebench")
        config = write_config(
            work, prefix, args.view, backlog=max([*backlogs, args.latency_backlog])
        )
        log = open(work / "worker.log", "ab")  # noqa: SIM115 - closed with the stack
        stack.callback(log.close)
        port = free_port()
        worker = subprocess.Popen(
            worker_command(config, bootstrap, work, "--metrics-port", str(port)),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        stack.callback(stop_process, worker)
        ready = wait_queryable(bootstrap, prefix, ["BQ"], 120)
        if ready is None:
            raise SystemExit(f"worker did not start; see {work / 'worker.log'}")
        bare_topic = f"{prefix}.bare"
        ensure_topics(bootstrap, [TopicSpec(bare_topic, PARTITIONS, {})], replication_factor=1)
        run = 0
        spy = profiled(worker.pid, args.profile, gil=True) if args.profile is not None else None
        for subs in subscribers:
            # More records for the baseline (3,000 take a few milliseconds): the rate is per record.
            group = consumer_group_rate(bootstrap, f"{bare_topic}{subs}", args.messages * 20, subs)
            share = share_group_rate(
                bootstrap, f"{prefix}.share{subs}", args.messages, subs, PARTITIONS
            )
            console.print(f"share group of {subs}: {share:,.0f} msg/s")
            for backlog in backlogs:
                rate, cpu, own, everything = leased_rate(
                    bootstrap, prefix, run, args.messages, subs, backlog, psutil.Process(worker.pid)
                )
                run += 1
                rows.append((subs, backlog, rate, group, share, cpu, own, everything))
                console.print(
                    f"{subs} subscribers, backlog {backlog}: {rate:,.0f} msg/s "
                    f"({rate / share:.2f}x share groups, consumer group {group:,.0f}/s), "
                    f"CPU per message: worker {cpu:,.0f} µs, "
                    f"clients {own:,.0f} µs, all processes {everything:,.0f} µs"
                )
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
        # The latency run has one subscriber: half of the best one-subscriber rate.
        best = max(r[2] for r in rows if r[0] == min(subscribers))
        half = best / 2
        latency_profile = (
            args.profile.with_name(args.profile.name + ".latency") if args.profile else None
        )
        latencies, acks, queue_rate, busy = queue_latency(
            bootstrap,
            prefix,
            half,
            args.latency_seconds,
            psutil.Process(worker.pid),
            latency_profile,
            args.latency_backlog,
            args.latency_publisher_process,
            port,
        )
        bare, bare_rate = kafka_latency(bootstrap, bare_topic, half, args.latency_seconds)
        shared, share_rate = share_group_latency(
            bootstrap, f"{prefix}.sharelat", half, args.latency_seconds, PARTITIONS
        )

    viewed = ", a view over the queue" if args.view else ""
    table = Table(
        title=f"sowstream queue benchmark: {args.messages:,} messages per row, 1 worker{viewed}"
    )
    table.add_column("subscribers", justify="right")
    table.add_column("backlog", justify="right")
    table.add_column("leased+acked", justify="right")
    table.add_column("share group (ACCEPT each)", justify="right")
    table.add_column("vs share groups", justify="right")
    table.add_column("bare consumer group", justify="right")
    table.add_column("vs bare", justify="right")
    table.add_column("worker CPU/msg", justify="right")
    table.add_column("clients CPU/msg", justify="right")
    table.add_column("all CPU/msg", justify="right")
    for subs, backlog, rate, group, share, cpu, own, everything in rows:
        table.add_row(
            str(subs),
            str(backlog),
            f"{rate:,.0f}/s",
            f"{share:,.0f}/s",
            f"{rate / share:.2f}x share groups",
            f"{group:,.0f}/s",
            f"{rate / group:.2f}x",
            f"{cpu:,.0f} µs",
            f"{own:,.0f} µs",
            f"{everything:,.0f} µs",
        )
    Console(width=200).print(table)  # a narrow terminal must not cut figures
    lat = Table(
        title=f"latency at half the best rate ({half:,.0f} msg/s), same run; the queue's "
        f"subscriber max_backlog={args.latency_backlog}"
    )
    lat.add_column("measure")
    lat.add_column("p50", justify="right")
    lat.add_column("p99", justify="right")
    lat.add_column("p99 vs bare", justify="right")
    lat.add_column("p99 vs share group", justify="right")
    lat.add_row(
        "bare Kafka produce→consume",
        f"{pct(bare, 0.5):.1f} ms",
        f"{pct(bare, 0.99):.1f} ms",
        "1.00x",
        "",
    )
    lat.add_row(
        "share group produce→delivery (1 consumer)",
        f"{pct(shared, 0.5):.1f} ms",
        f"{pct(shared, 0.99):.1f} ms",
        f"{pct(shared, 0.99) / pct(bare, 0.99):.2f}x",
        "1.00x",
    )
    lat.add_row(
        "queue publish→lease delivered",
        f"{pct(latencies, 0.5):.1f} ms",
        f"{pct(latencies, 0.99):.1f} ms",
        f"{pct(latencies, 0.99) / pct(bare, 0.99):.2f}x",
        f"{pct(latencies, 0.99) / pct(shared, 0.99):.2f}x share groups",
    )
    lat.add_row(
        "ack round trip (one ack waiting for the engine's answer)",
        f"{pct(acks, 0.5):.1f} ms",
        f"{pct(acks, 0.99):.1f} ms",
        "",
        "",
    )
    Console(width=200).print(lat)
    middle = statistics.median(latencies or [0])
    console.print(
        f"samples: queue {len(latencies)}, bare {len(bare)}, share group {len(shared)}; queue "
        f"median {middle:.1f} ms; published at {queue_rate:,.0f}/s to the queue, "
        f"{bare_rate:,.0f}/s to bare Kafka, {share_rate:,.0f}/s to the share group"
    )
    console.print(
        f"while publishing at {queue_rate:,.0f}/s to the queue: the worker used "
        f"{busy['worker']:.0%} of a core, the publisher and subscriber (this process) "
        f"{busy['clients']:.0%}"
    )
    console.print(
        "the queue's hops: "
        + "; ".join(
            f"{hop} p50 / p99 {busy[f'{hop} p50']:.1f} / {busy[f'{hop} p99']:.1f} ms"
            for hop in ("publish → log", "log → lease produced", "log → lease delivered")
        )
    )
    if args.profile is not None:
        for path in (args.profile, latency_profile):
            if path is not None and path.exists():
                console.print(f"where the worker's samples went ({path})")
                Console(width=160).print(split_file(path))


if __name__ == "__main__":
    main()
