"""SOW engine benchmark: apply rate vs a bare confluent-kafka relay, query rates, storage size.

Run with ``make bench`` (or ``python -m bench.sow_bench --updates 1000000 --keys 100000``). It
uses $SOWSTREAM_BOOTSTRAP or starts the embedded local broker. Everything printed is measured in
this one run; ratios compare figures taken on the same machine minutes apart.
"""

from __future__ import annotations

import argparse
import random
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from contextlib import ExitStack, suppress
from pathlib import Path

import orjson
import psutil
import yaml
from confluent_kafka import Consumer, Producer
from rich.console import Console
from rich.table import Table

from bench.common import bench_bootstrap, profiled, wait_queryable, worker_command, workspace
from sowstream.client import Client
from sowstream.wire.kafka import TopicSpec, ensure_topics, producer_config

console = Console(stderr=True)
PARTITIONS = 4


def make_updates(n: int, keys: int, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    sides = ["buy", "sell"]
    out = []
    for i in range(n):
        k = rng.randrange(keys)
        out.append(
            orjson.dumps(
                {
                    "id": k,
                    "customer": f"c{k % 1000}",
                    "region": f"r{k % 1000}",
                    "qty": rng.randrange(1000),
                    "px": round(100 + rng.random() * 10, 2),
                    "side": sides[k % 2],
                    "seq": i,
                }
            )
        )
    return out


def make_deltas(n: int, keys: int, seed: int = 5) -> list[bytes]:
    """``delta_publish`` bodies: a record's key and two of its fields, changed."""
    rng = random.Random(seed)
    return [
        orjson.dumps({"id": rng.randrange(keys), "qty": rng.randrange(1000), "seq": i})
        for i in range(n)
    ]


def relay_rate(bootstrap: str, source: str, n: int) -> float:
    """Bare confluent-kafka consume -> produce of the same n log records."""
    return relay_log(bootstrap, source, f"{source}.relay", n)


def relay_log(
    bootstrap: str, source: str, target: str, n: int, *, same_partition: bool = False
) -> float:
    """Consume ``n`` records of ``source`` and produce them to ``target`` (to the partition they
    came from with ``same_partition``); records/s from the first one read."""
    ensure_topics(bootstrap, [TopicSpec(target, PARTITIONS)])
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([source])
    producer = Producer(producer_config(bootstrap))
    done = 0
    started = None
    while done < n:
        msgs = consumer.consume(5000, 1.0)
        if msgs and started is None:
            started = time.perf_counter()
        for msg in msgs:
            if msg.error():
                continue
            where = {"partition": msg.partition() or 0} if same_partition else {}
            while True:
                try:
                    producer.produce(
                        target, key=msg.key(), value=msg.value(), headers=msg.headers(), **where
                    )
                    break
                except BufferError:
                    producer.poll(0.01)
            done += 1
        producer.poll(0)
    producer.flush(60)
    assert started is not None
    elapsed = time.perf_counter() - started
    consumer.close()
    return n / elapsed


def faust_floor(bootstrap: str, app_id: str, topic: str, n: int) -> float:
    """Events/s a faust agent that does nothing but count reaches on the same log."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.faust_floor", bootstrap, app_id, topic, str(n)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    found = re.search(r"RATE (\d+)", out.stdout)  # faust's terminal codes may precede it
    if found:
        return float(found.group(1))
    raise RuntimeError(f"faust baseline failed:\n{out.stderr[-2000:]}")


def scrape(port: int, metric: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(metric + "{")
    )


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def consecutive_free_ports(n: int) -> int:
    """The first of ``n`` consecutive free ports (``--processes`` gives child i PORT + i)."""
    import socket

    while True:
        first = free_port()
        try:
            for port in range(first + 1, first + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def timed_query(client: Client, topic: str, flt: str | None, repeat: int = 3) -> tuple[int, float]:
    best = float("inf")
    count = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        count = 0
        for m in client.sow(topic, flt, batch_size=1000):
            if m.command == "sow":
                count += 1
                # Decode included: a raw batch's message reads its record only when used.
                _ = (m.sow_key, m.data)
        best = min(best, time.perf_counter() - t0)
    return count, best


def catch_up_rate(
    ports: list[int],
    target: float,
    timeout: float = 1800,
    cpu: WorkerCpu | None = None,
) -> float:
    """Updates/s the workers behind ``ports`` apply together, from their own counters: from the
    first applied update until ``target`` are applied in all; ``cpu`` (one worker) is read
    over the same span."""
    first = last = None
    applied = 0.0
    started = time.perf_counter()
    while applied < target:
        if time.perf_counter() - started > timeout:
            raise SystemExit(f"only {applied:,.0f} of {target:,.0f} updates applied in {timeout} s")
        applied = 0.0
        for port in ports:
            with suppress(OSError):
                applied += scrape(port, "sowstream_updates_applied_total")
        now = time.perf_counter()
        if applied > 0 and first is None:
            first = (now, applied)
            if cpu is not None:
                cpu.start(applied)
        last = now
        time.sleep(0.05)
    assert first is not None and last is not None
    if cpu is not None:
        cpu.stop(applied)
    return (applied - first[1]) / max(1e-9, last - first[0])


class WorkerCpu:
    """CPU a worker spends per applied update, all threads and its main (event-loop) thread.

    CPU time, unlike a rate, hardly depends on what else the machine runs: the figure to
    compare across runs on a shared machine.
    """

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self._at: tuple[float, float, float] = (0.0, 0.0, 0.0)
        self.us_per_update = self.main_us_per_update = 0.0

    def _read(self) -> tuple[float, float]:
        total = main = 0.0
        for t in self.proc.threads():
            total += t.user_time + t.system_time
            if t.id == self.proc.pid:
                main = t.user_time + t.system_time
        return total, main

    def start(self, applied: float) -> None:
        self._at = (*self._read(), applied)

    def stop(self, applied: float) -> None:
        total, main = self._read()
        n = max(1.0, applied - self._at[2])
        self.us_per_update = (total - self._at[0]) / n * 1e6
        self.main_us_per_update = (main - self._at[1]) / n * 1e6


def broker_process(bootstrap: str) -> psutil.Process | None:
    """The process listening on the bootstrap's port (the broker), if it runs on this machine."""
    port = int(bootstrap.split(",")[0].rsplit(":", 1)[1])
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return psutil.Process(conn.pid)
    return None


class CpuMeter:
    """Cores a process used between ``start`` and ``stop`` (CPU seconds per wall second)."""

    def __init__(self, proc: psutil.Process | None) -> None:
        self.proc = proc
        self._cpu = self._wall = 0.0

    def _read(self) -> float:
        if self.proc is None:
            return 0.0
        times = self.proc.cpu_times()
        return float(times.user + times.system + times.children_user + times.children_system)

    def start(self) -> None:
        self._cpu, self._wall = self._read(), time.perf_counter()

    def stop(self) -> float:
        return (self._read() - self._cpu) / max(1e-9, time.perf_counter() - self._wall)


# Where a py-spy sample of the worker went: the first step whose mark is on its stack, in this
# order (index upkeep runs inside the batch write, so it is tested first). py-spy names frames
# ``Class.function (path relative to site-packages or the project:line)``.
PROFILE_STEPS = [
    ("start-up (imports)", ("_find_and_load (",)),
    ("changelog sends", (".replicate (sowstream/engine/store.py", ".send_many (")),
    ("index upkeep", ("PartitionTable.index_changes (",)),
    ("decode and key the log record", ("decode_log_record (",)),
    ("read the stored record", ("PartitionTable.load_record (",)),
    ("apply_keyed", ("apply_keyed (",)),
    ("encode the stored record", ("SowRecord.to_bytes (",)),
    ("RocksDB write", ("RocksPartition.write (",)),
    ("rest of the fold and batch write", ("Applier._fold (", "PartitionTable.write (")),
    ("subscriptions", (".dispatch (sowstream/subscriptions",)),
    ("Kafka message to RawRecord", ("_record (sowstream/engine/pump.py",)),
    ("log fetch (confluent-kafka, its own thread)", ("_fetch (sowstream/engine/pump.py",)),
    ("/metrics scrapes", ("(prometheus_client/",)),
    ("aiokafka (sender, fetcher, protocol)", ("(aiokafka/",)),
    ("faust and mode", ("(faust/", "(mode/")),
    ("asyncio event loop", ("(asyncio/",)),
]


def profile_steps(path: Path) -> list[tuple[str, float]]:
    """A py-spy ``raw`` profile's samples by step of the apply path, as shares of the samples
    after start-up (imports)."""
    shares: dict[str, int] = {}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        label = next(
            (step for step, marks in PROFILE_STEPS if any(m in stack for m in marks)), "other"
        )
        shares[label] = shares.get(label, 0) + int(count)
    started = sum(n for label, n in shares.items() if not label.startswith("start-up"))
    ranked = sorted(shares.items(), key=lambda item: -item[1])
    return [(label, 100 * n / started) for label, n in ranked if not label.startswith("start-up")]


def write_bench_config(path: Path, prefix: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "engine": {"app_id": prefix, "topic_prefix": prefix},
                "sow": [
                    {
                        "Name": "orders",
                        "Key": "/id",
                        "Partitions": PARTITIONS,
                        "HashIndex": [["/customer"]],
                    }
                ],
            }
        )
    )
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--updates", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--subscriptions", type=int, default=100, help="filtered, 10%% match")
    parser.add_argument("--skip-scaling", action="store_true", help="no two-worker run")
    parser.add_argument(
        "--delta", action="store_true", help="also time a catch-up of all-delta_publish updates"
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=0,
        help="also time N workers run by one `sowstream worker --processes N` (0: not)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--profile",
        type=Path,
        help="py-spy (raw format, --gil) of the worker's first catch-up, written here",
    )
    parser.add_argument(
        "--profile-subscriptions",
        type=Path,
        help="py-spy (raw format, --gil) of the catch-up with subscriptions, written here",
    )
    args = parser.parse_args()
    if args.subscriptions > 1000:
        parser.error("at most 1,000 subscriptions (one per customer)")
    result: dict[str, float] = {}

    with ExitStack() as stack:
        bootstrap = bench_bootstrap(stack)
        broker = CpuMeter(broker_process(bootstrap))
        work, prefix = workspace(stack, "sowbench")
        config = write_bench_config(work / "bench.yaml", prefix)
        port = free_port()

        def start_worker(
            config: Path, port: int, name: str = "bench", *extra: str
        ) -> subprocess.Popen[bytes]:
            cmd = worker_command(config, bootstrap, work, "--metrics-port", str(port), *extra)
            cmd[cmd.index("--name") + 1] = name
            log = open(work / f"{name}-{config.stem}.log", "ab")  # noqa: SIM115
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            stack.callback(lambda: proc.poll() is None and (proc.terminate(), proc.wait(30)))
            return proc

        console.print(f"[bold]generating {args.updates:,} updates over {args.keys:,} keys")
        updates = make_updates(args.updates, args.keys)

        # 1. start a worker once so topics exist, then stop it: the log fills while it is down
        worker = start_worker(config, port)
        if wait_queryable(bootstrap, prefix, ["orders"], 120) is None:
            raise SystemExit("the worker did not answer queries within 120 s")
        worker.terminate()
        worker.wait(60)

        with Client(bootstrap, prefix=prefix, timeout=600) as client:
            t0 = time.perf_counter()
            for body in updates:
                client.publish("orders", body)
            client.flush()
            publish_rate = len(updates) / (time.perf_counter() - t0)
            console.print(f"published at {publish_rate:,.0f}/s through the client")

            relay = relay_rate(bootstrap, f"{prefix}.log.orders", len(updates))
            console.print(f"bare confluent-kafka relay: {relay:,.0f}/s")
            floor = faust_floor(bootstrap, f"{prefix}floor", f"{prefix}.log.orders", len(updates))
            console.print(f"bare faust agent (count only): {floor:,.0f}/s")

            # 2. the worker catches up on the whole log; time it from its own counter
            worker = start_worker(config, port)
            spy = profiled(worker.pid, args.profile, gil=True) if args.profile is not None else None
            broker.start()
            worker_cpu = WorkerCpu(worker.pid)
            apply_rate = catch_up_rate([port], len(updates), cpu=worker_cpu)
            broker_one = broker.stop()
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(60)
            rss = psutil.Process(worker.pid).memory_info().rss
            console.print(
                f"worker applied at {apply_rate:,.0f}/s (broker {broker_one:.2f} cores), "
                f"{worker_cpu.us_per_update:.1f} us CPU per update, "
                f"{worker_cpu.main_us_per_update:.1f} us of it in the main thread"
            )

            # 3. more updates with filtered subscriptions, 10% of updates matching. Before the
            # queries: a range query builds a memo index the worker keeps current from then on,
            # which would be measured here too.
            subs = []
            matching = 0
            again: list[bytes] = []
            if args.subscriptions:
                wanted = {f"c{i}" for i in range(args.subscriptions)}
                subs = [
                    client.subscribe("orders", f"/customer = '{c}'", options="oof")
                    for c in sorted(wanted)
                ]
                time.sleep(2.0)  # placed on every partition
                worker.terminate()
                worker.wait(60)
                again = make_updates(args.updates, args.keys, seed=2)
                matching = sum(1 for u in again if orjson.loads(u)["customer"] in wanted)
                for body in again:
                    client.publish("orders", body)
                client.flush()
                received = 0
                worker = start_worker(config, port)
                spy = (
                    profiled(worker.pid, args.profile_subscriptions, gil=True)
                    if args.profile_subscriptions is not None
                    else None
                )
                subs_cpu = WorkerCpu(worker.pid)
                subs_rate = catch_up_rate([port], len(again), cpu=subs_cpu)
                if spy is not None:
                    spy.send_signal(signal.SIGINT)
                    spy.wait(60)
                result["subs_cpu_us"] = subs_cpu.us_per_update
                result["subs_main_cpu_us"] = subs_cpu.main_us_per_update
                deadline = time.monotonic() + 300
                while received < matching and time.monotonic() < deadline:
                    for sub in subs:
                        while (msg := sub.next(timeout=0)) is not None:
                            received += msg.command == "publish"
                    time.sleep(0.05)
                result["subs_received"] = received
                console.print(
                    f"with {len(subs)} subscriptions: applied at {subs_rate:,.0f}/s, "
                    f"{received:,} of {matching:,} messages received, "
                    f"{subs_cpu.us_per_update:.1f} us CPU per update, "
                    f"{subs_cpu.main_us_per_update:.1f} us of it in the main thread"
                )
                result["subs_rate"] = subs_rate
                for sub in subs:
                    sub.close()

            # 3b. the same number of updates, every one a delta_publish of a few fields (its
            # merge with the stored record is the worker's work), caught up with no subscriptions
            if args.delta:
                worker.terminate()
                worker.wait(60)
                deltas = make_deltas(args.updates, args.keys)
                for body in deltas:
                    client.delta_publish("orders", body)
                client.flush()
                worker = start_worker(config, port)
                delta_cpu = WorkerCpu(worker.pid)
                result["delta_rate"] = catch_up_rate([port], len(deltas), cpu=delta_cpu)
                result["delta_cpu_us"] = delta_cpu.us_per_update
                result["delta_main_cpu_us"] = delta_cpu.main_us_per_update
                console.print(
                    f"every update a delta_publish: applied at {result['delta_rate']:,.0f}/s, "
                    f"{delta_cpu.us_per_update:.1f} us CPU per update"
                )

            full_n, full_t = timed_query(client, "orders", None)
            range_n, range_t = timed_query(client, "orders", "/qty > 900")
            hash_n, hash_t = timed_query(client, "orders", "/customer = 'c42'")
            scan_n, scan_t = timed_query(client, "orders", "/region = 'r42'")
            key_n, key_t = timed_query(client, "orders", "/id = 4242")
            final = {orjson.loads(u)["id"]: len(u) for u in (*updates, *again)}
            raw_bytes = sum(final.values())
            rocks = dir_size(work / "data" / prefix / "bench")
            worker.terminate()
            worker.wait(60)

        # 4. scaling: the first pass's messages, copied to a second engine's log, applied by
        # two workers of that engine together
        if not args.skip_scaling:
            prefix2 = prefix + "x2"
            config2 = write_bench_config(work / "bench2.yaml", prefix2)
            # the first pass's messages, partition for partition, as the second engine's log
            source, target = f"{prefix}.log.orders", f"{prefix2}.log.orders"
            relay_log(bootstrap, source, target, len(updates), same_partition=True)
            ports = [free_port(), free_port()]
            broker.start()
            pair = [start_worker(config2, p2, f"w{i}") for i, p2 in enumerate(ports)]
            two_rate = catch_up_rate(ports, len(updates))
            result["broker_cores_two"] = broker.stop()
            result["two_workers_rate"] = two_rate
            console.print(f"two workers applied at {two_rate:,.0f}/s")
            for proc in pair:  # idle now, but not to be measured alongside what follows
                proc.terminate()
                proc.wait(60)

        # 5. the same with N workers under one parent (sowstream worker --processes N)
        if args.processes > 1:
            prefix3 = f"{prefix}p{args.processes}"
            config3 = write_bench_config(work / "bench3.yaml", prefix3)
            relay_log(
                bootstrap,
                f"{prefix}.log.orders",
                f"{prefix3}.log.orders",
                len(updates),
                same_partition=True,
            )
            first = consecutive_free_ports(args.processes)
            broker.start()
            parent = start_worker(config3, first, "pool", "--processes", str(args.processes))
            rate = catch_up_rate(list(range(first, first + args.processes)), len(updates))
            result["processes_broker_cores"] = broker.stop()
            result["processes"] = args.processes
            result["processes_rate"] = rate
            parent.terminate()
            parent.wait(90)
            console.print(f"{args.processes} processes applied at {rate:,.0f}/s")

    result.update(
        relay=relay,
        faust_floor=floor,
        apply_rate=apply_rate,
        broker_cores_one=broker_one,
        worker_cpu_us=worker_cpu.us_per_update,
        worker_main_cpu_us=worker_cpu.main_us_per_update,
        publish_rate=publish_rate,
        full_scan_rate=full_n / full_t,
        range_ms=range_t * 1000,
        raw_bytes=raw_bytes,
        rocksdb_bytes=rocks,
        rss_bytes=rss,
        subscriptions=len(subs),
        subs_matching=matching,
    )
    if args.json is not None:
        args.json.write_text(orjson.dumps(result).decode())

    table = Table(
        title=f"sowstream SOW benchmark: {args.updates:,} updates, {args.keys:,} keys, "
        f"{PARTITIONS} partitions, 1 worker"
    )
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("ratio", justify="right")
    table.add_row("bare confluent-kafka relay (consume→produce)", f"{relay:,.0f} msg/s", "1.00")
    table.add_row(
        "bare faust agent, counting only", f"{floor:,.0f} ev/s", f"{floor / relay:.2f}x relay"
    )
    table.add_row(
        "SOW updates applied (1 worker)",
        f"{apply_rate:,.0f} upd/s",
        f"{apply_rate / relay:.2f}x relay, {apply_rate / floor:.2f}x faust",
    )
    if "subs_rate" in result:
        table.add_row(
            f"  the same with {len(subs)} filtered subscriptions ({matching:,} matches)",
            f"{result['subs_rate']:,.0f} upd/s",
            f"{result['subs_rate'] / relay:.2f}x relay",
        )
    if "processes_rate" in result:
        table.add_row(
            f"  {args.processes} processes of one `worker --processes {args.processes}` "
            f"(broker {result['processes_broker_cores']:.2f} cores)",
            f"{result['processes_rate']:,.0f} upd/s",
            f"{result['processes_rate'] / apply_rate:.2f}x one worker",
        )
    if "two_workers_rate" in result:
        table.add_row(
            "  two workers together (same messages, broker "
            f"{result['broker_cores_two']:.2f} cores; with one: {broker_one:.2f})",
            f"{result['two_workers_rate']:,.0f} upd/s",
            f"{result['two_workers_rate'] / apply_rate:.2f}x one worker",
        )
    table.add_row(
        "  worker CPU per update (all threads / main thread)",
        f"{worker_cpu.us_per_update:.1f} / {worker_cpu.main_us_per_update:.1f} µs",
        "",
    )
    table.add_row("client publish", f"{publish_rate:,.0f} msg/s", f"{publish_rate / relay:.2f}x")
    table.add_row(f"query full scan ({full_n:,} records)", f"{full_n / full_t:,.0f} rec/s", "")
    table.add_row(
        f"query range /qty > 900 ({range_n:,})",
        f"{range_t * 1000:,.0f} ms",
        f"{range_n / range_t:,.0f} rec/s",
    )
    table.add_row(
        f"query hash index /customer = 'c42' ({hash_n})",
        f"{hash_t * 1000:,.1f} ms",
        f"{scan_t / hash_t:.1f}x faster than scan",
    )
    table.add_row(
        f"query same equality, no index /region = 'r42' ({scan_n})",
        f"{scan_t * 1000:,.1f} ms",
        "1.0",
    )
    table.add_row(
        f"query Key lookup /id = 4242 ({key_n})",
        f"{key_t * 1000:,.1f} ms",
        f"{scan_t / key_t:.1f}x faster than scan",
    )
    table.add_row("raw SOW data (latest value per key)", f"{raw_bytes / 1e6:,.1f} MB", "1.00")
    table.add_row("RocksDB directory", f"{rocks / 1e6:,.1f} MB", f"{rocks / raw_bytes:.2f}x raw")
    table.add_row("worker RSS", f"{rss / 1e6:,.0f} MB", f"{rss / raw_bytes:.2f}x raw")
    Console().print(table)
    for what, path in (("", args.profile), (" with subscriptions", args.profile_subscriptions)):
        if path is not None and path.exists():
            console.print(
                f"[bold]worker catch-up{what} under py-spy: share of the samples after imports"
            )
            for label, share in profile_steps(path):
                console.print(f"  {share:5.1f}%  {label}")


if __name__ == "__main__":
    main()
