"""Views and conflated topics benchmark: what a maintained view costs against plain SOW ingest.

Run with ``make bench-views`` (``python -m bench.view_bench``; ``--records 20000`` is quicker).
It uses $SOWSTREAM_BOOTSTRAP or starts the embedded local broker, and one worker serving every
topic below. In one run, on that worker, each rate a *catch-up* of the same backlog: the worker
is stopped, ``--records`` new records are published, the worker is started again, and the clock
runs from the first of them the worker applies (its ``sowstream_updates_applied_total`` for the
topic moves) until the work is done, so plain ingest and each view do the same work from the
same start:

1. plain ingest: a topic without views, until the applied count covers the backlog;
2. the same backlog of a topic under a grouped SUM/COUNT view (``--groups`` groups), until the
   view's COUNT and SUM totals equal what was published;
3. the same of a topic joined with a limits topic (one limit per group), grouped by the join
   key; then 2 and 3 again over topics of their own with views set to ``Conflation: inline``;
4. publish→view-subscriber latency: one update per new record at ``--latency-rate`` (default
   half the rate of 2), the view's MAX(/sent) read on arrival;
5. a conflated topic (Interval 1 s) over ``--records`` price records updated at up to
   ``--px-rate``: messages and bytes per second on both logs, read back from Kafka.

The view rates are printed as a ratio to rate 1. Everything printed is measured in this run.
``--profile DIR`` records the worker with py-spy (raw format, ``--gil``) during each catch-up,
one file per row, and prints where each row's samples went (``bench.spy_split``).
"""

from __future__ import annotations

import argparse
import random
import signal
import subprocess
import time
import urllib.request
import uuid
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import orjson
import yaml
from confluent_kafka import Consumer, TopicPartition
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
from bench.spy_split import split_file
from sowstream.broker.local import free_port
from sowstream.client import Client, Message
from sowstream.wire.topics import TopicNames

console = Console(stderr=True)
PARTITIONS = 4
INTERVAL = 1.0


def grouped_view(name: str, topic: str, conflation: str = "none") -> dict[str, Any]:
    """SUM/COUNT of ``topic`` per /grp."""
    return {
        "Name": name,
        "UnderlyingTopic": topic,
        "Projection": ["/grp AS /grp", "SUM(/qty) AS /total", "COUNT(/id) AS /n"],
        "Grouping": ["/grp"],
        "Conflation": conflation,
        "Partitions": PARTITIONS,
    }


def joined_view(name: str, topic: str, conflation: str = "none") -> dict[str, Any]:
    """``topic`` joined with the limits per /grp, grouped by the join key."""
    return {
        "Name": name,
        "UnderlyingTopic": {"Join": [f"[{topic}]./grp = [lim]./grp"]},
        "Projection": [
            f"[{topic}]./grp AS /grp",
            f"SUM([{topic}]./qty) AS /total",
            f"COUNT([{topic}]./id) AS /n",
            "[lim]./limit AS /limit",
        ],
        "Grouping": [f"[{topic}]./grp"],
        "Conflation": conflation,
        "Partitions": PARTITIONS,
    }


def write_config(work: Path, prefix: str) -> Path:
    config: dict[str, Any] = {
        "engine": {"app_id": prefix, "topic_prefix": prefix},
        "sow": [
            {"Name": name, "Key": key, "Partitions": PARTITIONS}
            for name, key in (
                ("plain", "/id"),
                ("pos", "/id"),
                ("jpos", "/id"),
                ("ipos", "/id"),
                ("jipos", "/id"),
                ("lim", "/grp"),
                ("lat", "/id"),
                ("px", "/sym"),
            )
        ],
        "views": [
            grouped_view("by_grp", "pos"),
            joined_view("joined", "jpos"),
            grouped_view("by_grp_inline", "ipos", "inline"),
            joined_view("joined_inline", "jipos", "inline"),
            {
                "Name": "lat_v",
                "UnderlyingTopic": "lat",
                "Projection": ["/grp AS /grp", "MAX(/sent) AS /sent", "COUNT(/id) AS /n"],
                "Grouping": ["/grp"],
                "Partitions": PARTITIONS,
            },
        ],
        "conflated_topics": [
            {"Name": "px-C", "UnderlyingTopic": "px", "Interval": "1s", "Partitions": PARTITIONS}
        ],
    }
    path = work / "views.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def applied(port: int, topic: str) -> float:
    """The worker's ``sowstream_updates_applied_total`` for one topic (0 until it answers)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return 0.0
    label = f'topic="{topic}"'
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("sowstream_updates_applied_total{") and label in line
    )


def bodies(records: int, groups: int, seed: int) -> tuple[list[bytes], int]:
    """One new record per id, spread over ``groups``, and the SUM of their /qty."""
    rng = random.Random(seed)
    out = []
    total = 0
    for i in range(records):
        qty = rng.randrange(1, 1000)
        total += qty
        out.append(orjson.dumps({"id": i, "grp": f"g{i % groups}", "qty": qty, "pad": "x" * 32}))
    return out, total


def publish_all(client: Client, topic: str, batch: list[bytes]) -> float:
    """Publish every body; returns the perf_counter time of the first publish."""
    started = time.perf_counter()
    for body in batch:
        client.publish(topic, body)
    client.flush()
    return started


def view_totals(client: Client, view: str) -> tuple[int, int]:
    n = total = 0
    for m in client.sow(view, batch_size=1000):
        if m.command == "sow":
            record = m.json()
            n += int(record.get("n") or 0)
            total += int(record.get("total") or 0)
    return n, total


def wait_view(client: Client, view: str, expected: tuple[int, int], timeout: float) -> float:
    """perf_counter time at which ``view``'s COUNT/SUM totals were first seen equal to
    ``expected`` (polled every 0.25 s, so up to that much late)."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if view_totals(client, view) == expected:
            return time.perf_counter()
        time.sleep(0.25)
    raise SystemExit(f"view {view} did not reach {expected} in {timeout:.0f} s")


READY_TOPICS = ["plain", "pos", "jpos", "ipos", "jipos", "lim", "by_grp", "joined", "px-C"]


class Worker:
    """The one worker of the run, stopped and started again around each backlog (same data
    directory, same metrics port)."""

    def __init__(
        self,
        stack: ExitStack,
        bootstrap: str,
        prefix: str,
        work: Path,
        profile: Path | None = None,
    ) -> None:
        self.bootstrap, self.prefix, self.work = bootstrap, prefix, work
        self.profile = profile
        self._spy: subprocess.Popen[bytes] | None = None
        self.profiles: dict[str, Path] = {}
        self.port = free_port()
        self.config = write_config(work, prefix)
        self._log = open(work / "worker.log", "ab")  # noqa: SIM115 - closed with the stack
        stack.callback(self._log.close)
        self.proc: subprocess.Popen[bytes] | None = None
        stack.callback(self.stop)

    def start(self, wait: bool = True) -> float:
        """Start the worker; seconds until every topic answers a query (0 without ``wait``)."""
        self.proc = subprocess.Popen(
            worker_command(
                self.config, self.bootstrap, self.work, "--metrics-port", str(self.port)
            ),
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        if not wait:
            return 0.0
        ready = wait_queryable(self.bootstrap, self.prefix, READY_TOPICS, 300)
        if ready is None:
            raise SystemExit(f"worker did not start; see {self.work / 'worker.log'}")
        return ready

    def spy(self, row: str) -> None:
        """With ``--profile``: record the worker from now until :meth:`unspy`, as ``row``."""
        if self.profile is None or self.proc is None:
            return
        out = self.profile / f"{row}.txt"
        self.profiles[row] = out
        self._spy = profiled(self.proc.pid, out, gil=True)

    def unspy(self) -> None:
        if self._spy is not None:
            self._spy.send_signal(signal.SIGINT)
            self._spy.wait(60)
            self._spy = None

    def stop(self) -> None:
        self.unspy()
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None


def catch_up(worker: Worker, client: Client, topic: str, batch: list[bytes], row: str) -> float:
    """Publish ``batch`` to ``topic`` with the worker stopped, start it, and return the
    perf_counter time at which it applied the first of them (polled every 10 ms); with
    ``--profile`` the worker is recorded from then on as ``row``."""
    worker.stop()
    publish_all(client, topic, batch)
    worker.start(wait=False)  # the metrics answer (0) as soon as it runs; watched from now
    deadline = time.perf_counter() + 900
    while applied(worker.port, topic) <= 0:
        if time.perf_counter() > deadline:
            raise SystemExit(f"the worker applied nothing of {topic} in 900 s")
        time.sleep(0.01)
    started = time.perf_counter()
    worker.spy(row)
    if wait_queryable(worker.bootstrap, worker.prefix, READY_TOPICS, 300) is None:
        raise SystemExit(f"worker did not start; see {worker.work / 'worker.log'}")
    return started


def plain_rate(worker: Worker, client: Client, records: int, groups: int) -> float:
    batch, _ = bodies(records, groups, seed=1)
    started = catch_up(worker, client, "plain", batch, "plain")
    deadline = time.perf_counter() + 900
    while applied(worker.port, "plain") < records:
        if time.perf_counter() > deadline:
            raise SystemExit("plain ingest did not finish in 900 s")
        time.sleep(0.05)
    done = time.perf_counter()
    worker.unspy()
    return records / (done - started)


def grouped_rate(
    worker: Worker, client: Client, records: int, groups: int, inline: bool = False
) -> float:
    batch, total = bodies(records, groups, seed=2)
    row = "grouped_inline" if inline else "grouped"
    started = catch_up(worker, client, "ipos" if inline else "pos", batch, row)
    done = wait_view(client, "by_grp_inline" if inline else "by_grp", (records, total), 900)
    worker.unspy()
    return records / (done - started)


def publish_limits(client: Client, port: int, groups: int) -> None:
    for g in range(groups):
        client.publish("lim", {"grp": f"g{g}", "limit": 1_000_000})
    client.flush()
    while applied(port, "lim") < groups:
        time.sleep(0.1)


def join_rate(
    worker: Worker, client: Client, records: int, groups: int, inline: bool = False
) -> float:
    batch, total = bodies(records, groups, seed=3)
    row = "join_inline" if inline else "join"
    started = catch_up(worker, client, "jipos" if inline else "jpos", batch, row)
    done = wait_view(client, "joined_inline" if inline else "joined", (records, total), 900)
    worker.unspy()
    return records / (done - started)


def view_latency(
    bootstrap: str, prefix: str, groups: int, rate: float, seconds: float
) -> tuple[list[float], float]:
    """Publish→view-message latencies (ms) at ``rate``, and the publish rate achieved."""
    latencies: list[float] = []

    def handle(msg: Message) -> None:
        if msg.command == "publish":
            latencies.append((time.time() - float(msg.json()["sent"])) * 1000)

    with (
        Client(bootstrap, prefix=prefix) as sub_client,
        Client(bootstrap, prefix=prefix, config={"linger.ms": "0"}) as pub,
    ):
        sub = sub_client.subscribe("lat_v", on_message=handle)
        time.sleep(1.0)  # registered on the worker before the updates come
        achieved = paced(
            lambda n: pub.publish("lat", {"id": n, "grp": f"g{n % groups}", "sent": time.time()}),
            rate,
            seconds,
        )
        pub.flush()
        time.sleep(3.0)
        sub.close()
    return latencies, achieved


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex})
    try:
        out = {}
        for p in range(PARTITIONS):
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            out[p] = high
        return out
    finally:
        consumer.close()


def read_log(
    bootstrap: str, topic: str, start: dict[int, int], stop: dict[int, int]
) -> list[tuple[int, bytes, int]]:
    """(timestamp ms, key, size) of each record of ``topic`` between the offsets."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex, "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, start[p]) for p in start if stop[p] > start[p]])
    left = {p: stop[p] - start[p] for p in start if stop[p] > start[p]}
    out: list[tuple[int, bytes, int]] = []
    try:
        while any(v > 0 for v in left.values()):
            for msg in consumer.consume(5000, 1.0):
                partition = msg.partition()
                if msg.error() or partition is None or left.get(partition, 0) <= 0:
                    continue
                left[partition] -= 1
                key = bytes(msg.key() or b"")
                size = len(key) + len(msg.value() or b"")
                for header in msg.headers() or []:
                    size += len(header[0]) + len(header[1] or b"")
                out.append((msg.timestamp()[1], key, size))
    finally:
        consumer.close()
    return out


def settle(bootstrap: str, topic: str, quiet: float, timeout: float) -> dict[int, int]:
    """The end offsets of ``topic`` once they have not moved for ``quiet`` seconds."""
    deadline = time.monotonic() + timeout
    last = end_offsets(bootstrap, topic)
    still_since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = end_offsets(bootstrap, topic)
        if now != last:
            last, still_since = now, time.monotonic()
        elif time.monotonic() - still_since >= quiet:
            break
    return last


def conflation(
    bootstrap: str, prefix: str, records: int, rate: float, seconds: float
) -> dict[str, float]:
    """Input and conflated log traffic while ``records`` price records are updated at ``rate``."""
    names = TopicNames(prefix)
    src, out = names.log("px"), names.log("px-C")
    rng = random.Random(4)
    with Client(bootstrap, prefix=prefix, timeout=600) as client:
        for i in range(records):  # every record exists before the timed updates
            client.publish("px", orjson.dumps({"sym": f"S{i}", "px": 100.0, "seq": 0}))
        client.flush()
        before_src = settle(bootstrap, src, 1.0, 60)
        before_out = settle(bootstrap, out, 3 * INTERVAL, 900)
        updates = [
            orjson.dumps({"sym": f"S{rng.randrange(records)}", "px": 100 + n % 997 / 100, "seq": n})
            for n in range(int(rate * seconds))
        ]
        chunk = max(1, int(rate / 100))  # paced in 10 ms slices
        started = time.perf_counter()
        for i in range(0, len(updates), chunk):
            for body in updates[i : i + chunk]:
                client.publish("px", body)
            wait = started + (i + chunk) / rate - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
        client.flush()
        elapsed = time.perf_counter() - started
    after_src = end_offsets(bootstrap, src)
    after_out = settle(bootstrap, out, 3 * INTERVAL, 900)
    inp = read_log(bootstrap, src, before_src, after_src)
    conf = read_log(bootstrap, out, before_out, after_out)
    in_span = max(1e-3, (max(t for t, _, _ in inp) - min(t for t, _, _ in inp)) / 1000)
    out_span = max(INTERVAL, (max(t for t, _, _ in conf) - min(t for t, _, _ in conf)) / 1000)
    per_key = Counter(k for _, k, _ in conf)
    return {
        "achieved": len(updates) / elapsed,
        "in_msgs": len(inp),
        "in_bytes": sum(s for _, _, s in inp),
        "in_span": in_span,
        "out_msgs": len(conf),
        "out_bytes": sum(s for _, _, s in conf),
        "out_span": out_span,
        "max_per_key": max(per_key.values()),
        "distinct_updated": len({k for _, k, _ in inp}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=100_000, help="records per measurement")
    parser.add_argument("--groups", type=int, default=1_000)
    parser.add_argument(
        "--latency-rate",
        type=float,
        default=None,
        help="updates/s for the latency run (default: half the grouped view's rate, at most 2,000)",
    )
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--px-rate", type=float, default=50_000.0, help="price updates/s aimed at")
    parser.add_argument("--px-seconds", type=float, default=6.0)
    parser.add_argument(
        "--profile",
        type=Path,
        help="a directory: py-spy (raw, --gil) of the worker during each catch-up row",
    )
    parser.add_argument(
        "--rows",
        default="plain,grouped,join,grouped_inline,join_inline,latency,conflation",
        help="which rows to run (plain always runs: the others are ratios to it)",
    )
    args = parser.parse_args()
    rows = set(args.rows.split(","))
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    rates: dict[str, float] = {}
    latencies: list[float] = []
    lat_rate = 0.0
    conf: dict[str, float] | None = None
    with ExitStack() as stack:
        bootstrap = bench_bootstrap(stack)
        work, prefix = workspace(stack, "viewbench")
        worker = Worker(stack, bootstrap, prefix, work, args.profile)
        ready = worker.start()
        console.print(f"worker ready in {ready:.1f} s; log {work / 'worker.log'}")
        with Client(bootstrap, prefix=prefix, timeout=600) as client:
            for topic in READY_TOPICS:  # what publishing needs, known while the worker runs
                list(client.sow(topic, top_n=0))
            publish_limits(client, worker.port, args.groups)
            measures = {
                "plain": lambda: plain_rate(worker, client, args.records, args.groups),
                "grouped": lambda: grouped_rate(worker, client, args.records, args.groups),
                "join": lambda: join_rate(worker, client, args.records, args.groups),
                "grouped_inline": lambda: grouped_rate(
                    worker, client, args.records, args.groups, inline=True
                ),
                "join_inline": lambda: join_rate(
                    worker, client, args.records, args.groups, inline=True
                ),
            }
            for row, measure in measures.items():
                if row == "plain" or row in rows:
                    rates[row] = measure()
                    console.print(f"{LABELS[row]}: {rates[row]:,.0f} upd/s")
        if "latency" in rows:
            # Below what the view absorbs, so the figure is a delay and not a growing backlog.
            target = args.latency_rate or min(2_000.0, rates.get("grouped", 4_000.0) / 2)
            latencies, lat_rate = view_latency(
                bootstrap, prefix, args.groups, target, args.latency_seconds
            )
            console.print(f"latency: {len(latencies)} view messages at {lat_rate:,.0f} upd/s")
        if "conflation" in rows:
            conf = conflation(bootstrap, prefix, args.records, args.px_rate, args.px_seconds)
            console.print(f"conflation: {conf}")

    table = Table(
        title=f"sowstream views benchmark: {args.records:,} records in {args.groups:,} groups, "
        f"{PARTITIONS} partitions, 1 worker"
    )
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("ratio", justify="right")
    table.add_column("aim", justify="right")
    plain = rates["plain"]
    for row, rate in rates.items():
        ratio = "1.00" if row == "plain" else f"{rate / plain:.2f}x"
        table.add_row(LABELS[row], f"{rate:,.0f} upd/s", ratio, AIMS.get(row, ""))
    if latencies:
        table.add_row(
            f"update → view subscriber p50 (at {lat_rate:,.0f} upd/s)",
            f"{pct(latencies, 0.5):.1f} ms",
            "",
            "",
        )
        table.add_row(
            f"update → view subscriber p99 ({len(latencies):,} messages)",
            f"{pct(latencies, 0.99):.1f} ms",
            "",
            "≤50 ms",
        )
    if conf is not None:
        add_conflation_rows(table, conf, args.records, args.px_rate)
    Console(width=160).print(table)
    for row, path in worker.profiles.items():
        console.print(f"\n[bold]{LABELS[row]}[/bold]: where the worker's samples went ({path})")
        Console(width=160).print(split_file(path))


LABELS = {
    "plain": "plain SOW ingest (catch-up: first applied → all applied)",
    "grouped": "grouped SUM/COUNT view (catch-up: first applied → view totals right)",
    "join": "two-topic join view, grouped (catch-up: first applied → view totals right)",
    "grouped_inline": "grouped view, Conflation inline (catch-up)",
    "join_inline": "join view, Conflation inline (catch-up)",
}
AIMS = {"grouped": "≥0.6x", "join": "≥0.4x", "grouped_inline": "≥0.6x", "join_inline": "≥0.4x"}


def add_conflation_rows(table: Table, conf: dict[str, float], records: int, px_rate: float) -> None:
    """The conflated topic's rows: both logs' rates and the reduction."""
    in_rate = conf["in_msgs"] / conf["in_span"]
    out_rate = conf["out_msgs"] / conf["out_span"]
    in_bps = conf["in_bytes"] / conf["in_span"]
    out_bps = conf["out_bytes"] / conf["out_span"]
    table.add_row(
        f"price updates published (aim {px_rate:,.0f}/s, {records:,} records)",
        f"{conf['achieved']:,.0f} upd/s",
        "",
        "",
    )
    table.add_row(
        f"input log px ({conf['in_span']:.1f} s)",
        f"{in_rate:,.0f} msg/s, {in_bps / 1e6:.2f} MB/s",
        f"{conf['in_msgs']:,.0f} msgs, {conf['in_bytes'] / 1e6:.1f} MB",
        "",
    )
    table.add_row(
        f"conflated log px-C, Interval 1 s ({conf['out_span']:.1f} s until the worker caught up)",
        f"{out_rate:,.0f} msg/s, {out_bps / 1e6:.2f} MB/s",
        f"{conf['out_msgs']:,.0f} msgs, {conf['out_bytes'] / 1e6:.1f} MB",
        "",
    )
    table.add_row(
        "reduction, whole run (input / conflated)",
        f"{conf['in_msgs'] / conf['out_msgs']:.2f}x msgs, "
        f"{conf['in_bytes'] / conf['out_bytes']:.2f}x bytes",
        f"{conf['distinct_updated']:,.0f} records changed; at most {conf['max_per_key']:.0f} "
        "updates of one record",
        "",
    )


if __name__ == "__main__":
    main()
