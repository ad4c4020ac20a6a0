"""SOW engine benchmark: apply rate vs a bare confluent-kafka relay, query rates, storage size.

Run with ``make bench`` (or ``python -m bench.sow_bench --updates 1000000 --keys 100000``). It
uses $SOWSTREAM_BOOTSTRAP or starts the embedded local broker. Everything printed is measured in
this one run; ratios compare figures taken on the same machine minutes apart.
"""

from __future__ import annotations

import argparse
import random
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from contextlib import ExitStack
from pathlib import Path

import orjson
import psutil
import yaml
from confluent_kafka import Consumer, Producer
from rich.console import Console
from rich.table import Table

from bench.common import bench_bootstrap, wait_queryable, worker_command, workspace
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


def relay_rate(bootstrap: str, source: str, n: int) -> float:
    """Bare confluent-kafka consume -> produce of the same n log records."""
    target = f"{source}.relay"
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
            while True:
                try:
                    producer.produce(
                        target, key=msg.key(), value=msg.value(), headers=msg.headers()
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


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def timed_query(client: Client, topic: str, flt: str | None, repeat: int = 3) -> tuple[int, float]:
    best = float("inf")
    count = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        count = sum(1 for m in client.sow(topic, flt, batch_size=1000) if m.command == "sow")
        best = min(best, time.perf_counter() - t0)
    return count, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--updates", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    args = parser.parse_args()

    with ExitStack() as stack:
        bootstrap = bench_bootstrap(stack)
        work, prefix = workspace(stack, "sowbench")
        config = work / "bench.yaml"
        config.write_text(
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
        port = free_port()
        cmd = worker_command(config, bootstrap, work, "--metrics-port", str(port))

        def start_worker() -> subprocess.Popen[bytes]:
            log = open(work / "worker.log", "ab")  # noqa: SIM115
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            stack.callback(lambda: proc.poll() is None and (proc.terminate(), proc.wait(30)))
            return proc

        console.print(f"[bold]generating {args.updates:,} updates over {args.keys:,} keys")
        updates = make_updates(args.updates, args.keys)

        # 1. start a worker once so topics exist, then stop it: the log fills while it is down
        worker = start_worker()
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
            worker = start_worker()
            first = last = None
            applied = 0.0
            while applied < len(updates):
                try:
                    applied = scrape(port, "sowstream_updates_applied_total")
                except OSError:
                    applied = 0.0
                now = time.perf_counter()
                if applied > 0 and first is None:
                    first = (now, applied)
                last = now
                time.sleep(0.05)
            assert first is not None and last is not None
            apply_rate = (applied - first[1]) / (last - first[0])
            rss = psutil.Process(worker.pid).memory_info().rss
            console.print(f"worker applied at {apply_rate:,.0f}/s")

            full_n, full_t = timed_query(client, "orders", None)
            range_n, range_t = timed_query(client, "orders", "/qty > 900")
            hash_n, hash_t = timed_query(client, "orders", "/customer = 'c42'")
            scan_n, scan_t = timed_query(client, "orders", "/region = 'r42'")
            key_n, key_t = timed_query(client, "orders", "/id = 4242")
            final = {orjson.loads(u)["id"]: len(u) for u in updates}
            raw_bytes = sum(final.values())
            rocks = dir_size(work / "data" / prefix / "bench")

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


if __name__ == "__main__":
    main()
