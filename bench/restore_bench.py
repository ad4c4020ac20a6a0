"""Restore benchmark: a worker that lost its RocksDB, restarted, against a bare changelog consume.

Run with ``make bench-restore`` (or ``python -m bench.restore_bench --keys 1000000``). It uses
$SOWSTREAM_BOOTSTRAP or starts the embedded local broker. In one run it:

1. writes one publish per key to a 4-partition topic's log and lets one worker apply them (its
   changelog then holds every record, plus the watermark entries of each stored batch);
2. kills the worker (SIGKILL) once the changelog stops growing;
3. reads the whole changelog with a bare confluent-kafka consumer (the 1.00 of the ratios);
4. per restore mode (``--modes``): wipes the worker's RocksDB, starts it with ``engine.restore``
   set to that mode and times until every partition answers a query, then checks it serves every
   key (optionally under py-spy, ``--profile DIR``);
5. restarts the worker once more with its RocksDB intact: the fixed cost of a start.
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import orjson
import psutil
import yaml
from confluent_kafka import Consumer, TopicPartition
from rich.console import Console
from rich.table import Table

from bench.common import (
    bench_bootstrap,
    profiled,
    stop_process,
    wait_queryable,
    worker_command,
    workspace,
)
from bench.pipeline_bench import wait_group_empty, write_log
from bench.sow_bench import dir_size, free_port, scrape
from sowstream.client import Client
from sowstream.config import load_config
from sowstream.engine.app import Engine

console = Console(stderr=True)
PARTITIONS = 4
TOPIC = "orders"
RESTORED = re.compile(r"restored (\d+) changelog records of (\d+) partitions in ([\d.]+) s")


def changelog_ends(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
            for p in range(PARTITIONS)
        }
    finally:
        consumer.close()


def wait_changelog_settled(bootstrap: str, topic: str, quiet: float = 3.0) -> dict[int, int]:
    """The changelog's end offsets once they have not moved for ``quiet`` seconds."""
    last = changelog_ends(bootstrap, topic)
    still_since = time.monotonic()
    while time.monotonic() - still_since < quiet:
        time.sleep(0.5)
        now = changelog_ends(bootstrap, topic)
        if now != last:
            last, still_since = now, time.monotonic()
    return last


def bare_consume(bootstrap: str, topic: str, ends: dict[int, int]) -> tuple[int, float]:
    """Read every changelog partition to its end, touching each record; (records, seconds)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "enable.auto.commit": False,
            # the fetch sizes of the batched restore (sowstream.engine.restore)
            "max.partition.fetch.bytes": 8 * 1024 * 1024,
        }
    )
    todo = {p for p, end in ends.items() if end > 0}
    consumer.assign([TopicPartition(topic, p, 0) for p in sorted(todo)])
    seen = 0
    started = time.perf_counter()
    while todo:
        # the fastest simple loop: wait for one record, then take what is already fetched
        # (consume(n, t) would wait for n records at each step)
        first = consumer.poll(1.0)
        if first is None:
            continue
        for msg in [first, *consumer.consume(9_999, 0)]:
            if msg.error():
                continue
            msg.key(), msg.value()  # what any reader of the records pays
            seen += 1
            if msg.offset() >= ends[msg.partition()] - 1:
                todo.discard(msg.partition())
    elapsed = time.perf_counter() - started
    consumer.close()
    return seen, elapsed


def latest_value_bytes(bootstrap: str, topic: str, expected: int) -> int:
    """Bytes of the latest value of each key in the log (the SOW's raw data)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    latest: dict[bytes | None, int] = {}
    idle = 0
    while idle < 5:
        msgs = consumer.consume(10_000, 1.0)
        idle = 0 if msgs else idle + 1
        for msg in msgs:
            if not msg.error():
                latest[msg.key()] = len(msg.value() or b"")
        if len(latest) >= expected and not msgs:
            break
    consumer.close()
    return sum(latest.values())


def summarize_profile(path: Path, top: int = 12) -> list[tuple[str, float]]:
    """The leaf functions of a py-spy ``raw`` profile with their share of the samples."""
    leaves: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frame = stack.split(";")[-1]
        leaves[re.sub(r" \(.*?/site-packages/", " (", frame)] += int(count)
        total += int(count)
    return [(frame, 100 * n / total) for frame, n in leaves.most_common(top)] if total else []


class Worker:
    """The one worker process, started and stopped around the measurements."""

    def __init__(self, bootstrap: str, work: Path, prefix: str) -> None:
        self.bootstrap = bootstrap
        self.work = work
        self.prefix = prefix
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log: Path | None = None

    @property
    def data_dir(self) -> Path:
        return self.work / "data" / self.prefix / "bench"

    def start(self, config: Path, log_name: str) -> None:
        self.log = self.work / f"{log_name}.log"
        out = open(self.log, "ab")  # noqa: SIM115 - owned by the process
        command = worker_command(
            config, self.bootstrap, self.work, "--metrics-port", str(self.port)
        )
        command[command.index("--log-level") + 1] = "info"  # the restore's own report
        self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, 120)
        self.proc = None

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"the worker exited (see {self.log})")

    def wait_ready(self, timeout: float) -> float | None:
        return wait_queryable(self.bootstrap, self.prefix, [TOPIC], timeout, self.check_alive)

    def applied(self) -> float:
        try:
            return scrape(self.port, "sowstream_updates_applied_total")
        except OSError:
            return 0.0

    def restore_report(self) -> tuple[int, float] | None:
        """(records, seconds) of the batched restore, from the worker's log."""
        assert self.log is not None
        found = RESTORED.findall(self.log.read_text(errors="replace"))
        return (int(found[-1][0]), float(found[-1][2])) if found else None


def served_keys(bootstrap: str, prefix: str) -> int:
    with Client(bootstrap, prefix=prefix, timeout=120) as client:
        return sum(1 for m in client.sow(TOPIC, batch_size=1000, top_n=None) if m.command == "sow")


def write_config(path: Path, prefix: str, mode: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "engine": {"app_id": prefix, "topic_prefix": prefix, "restore": mode},
                "sow": [{"Name": TOPIC, "Key": "/id", "Partitions": PARTITIONS}],
            }
        )
    )
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--modes", default="batched,faust", help="restore modes, in run order")
    parser.add_argument("--restart-cap", type=float, default=900, help="give up waiting (s)")
    parser.add_argument("--profile", type=Path, help="record py-spy profiles of each restore here")
    parser.add_argument("--logs", type=Path, help="keep the worker logs here")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    results: dict[str, Any] = {}
    with ExitStack() as stack:
        bootstrap = bench_bootstrap(stack)
        work, prefix = workspace(stack, "restorebench")
        if args.logs is not None:
            args.logs.mkdir(parents=True, exist_ok=True)
            stack.callback(lambda: [shutil.copy(f, args.logs) for f in work.glob("*.log")])
        configs = {m: write_config(work / f"{m}.yaml", prefix, m) for m in {"batched", *modes}}
        Engine(load_config(configs["batched"]), bootstrap=bootstrap).prepare()
        log_topic = f"{prefix}.log.{TOPIC}"
        changelog = f"{prefix}-sow-{TOPIC}-changelog"

        console.print(f"[bold]filling {args.keys:,} keys")
        write_log(bootstrap, log_topic, args.keys, args.keys)
        worker = Worker(bootstrap, work, prefix)
        stack.callback(worker.stop)
        worker.start(configs["batched"], "fill")
        while worker.applied() < args.keys:
            worker.check_alive()
            time.sleep(0.2)
        worker.wait_ready(args.restart_cap)
        ends = wait_changelog_settled(bootstrap, changelog)
        assert worker.proc is not None
        results["rss_bytes"] = psutil.Process(worker.proc.pid).memory_info().rss
        results["rocksdb_bytes"] = dir_size(worker.data_dir)
        results["raw_bytes"] = latest_value_bytes(bootstrap, log_topic, args.keys)
        console.print(
            f"{args.keys:,} keys: RSS {results['rss_bytes'] / 1e6:,.0f} MB, RocksDB "
            f"{results['rocksdb_bytes'] / 1e6:,.1f} MB, raw {results['raw_bytes'] / 1e6:,.1f} MB"
        )
        worker.kill()
        # A replacement started at once would first wait out the dead worker's session (10 s)
        # in the group join: the restore is timed from a group without it.
        wait_group_empty(bootstrap, prefix)
        results["changelog"] = sum(ends.values())
        console.print(f"changelog: {results['changelog']:,} records, worker killed")

        seen, elapsed = bare_consume(bootstrap, changelog, ends)
        results["bare_rate"] = seen / elapsed
        results["bare_s"] = elapsed
        console.print(f"bare consume: {seen:,} records in {elapsed:.2f} s")

        for mode in modes:
            shutil.rmtree(worker.data_dir, ignore_errors=True)
            worker.start(configs[mode], f"restore-{mode}")
            assert worker.proc is not None
            spy = None
            if args.profile is not None:
                args.profile.mkdir(parents=True, exist_ok=True)
                spy = profiled(worker.proc.pid, args.profile / f"restore-{mode}.txt")
            ready = worker.wait_ready(args.restart_cap)
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(60)
            report = worker.restore_report() if mode == "batched" else None
            keys = served_keys(bootstrap, prefix) if ready is not None else 0
            results[mode] = (ready, report, keys)
            console.print(
                f"restore ({mode}): ready after {ready} s, report {report}, {keys:,} keys"
            )
            worker.stop()
            wait_group_empty(bootstrap, prefix)

        worker.start(configs["batched"], "intact")
        results["intact_s"] = worker.wait_ready(args.restart_cap)
        worker.stop()

    if args.json is not None:
        args.json.write_text(orjson.dumps(results).decode())
    bare = results["bare_rate"]
    table = Table(
        title=f"sowstream restore benchmark: {args.keys:,} keys, {PARTITIONS} partitions, "
        f"changelog of {results['changelog']:,} records"
    )
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("ratio", justify="right")
    table.add_row(
        "bare confluent-kafka consume of the changelog",
        f"{results['bare_s']:.2f} s = {bare:,.0f} rec/s",
        "1.00",
    )
    for mode in modes:
        ready, report, keys = results[mode]
        if ready is None:
            table.add_row(f"restart without RocksDB, restore {mode}", "gave up", "")
            continue
        rate = results["changelog"] / ready
        table.add_row(
            f"restart without RocksDB, restore {mode}: start to ready",
            f"{ready:.2f} s = {rate:,.0f} rec/s",
            f"{rate / bare:.2f}x bare",
        )
        if report is not None:
            n, secs = report
            table.add_row(
                "  of which the batched restore itself",
                f"{secs:.2f} s = {n / secs:,.0f} rec/s",
                f"{n / secs / bare:.2f}x bare",
            )
        table.add_row(f"  keys served after restore {mode}", f"{keys:,}", "")
    intact = results["intact_s"]
    table.add_row("restart with RocksDB intact (no restore)", f"{intact:.2f} s", "")
    raw = results["raw_bytes"]
    table.add_row("raw SOW data (latest value per key)", f"{raw / 1e6:,.1f} MB", "1.00")
    table.add_row(
        "RocksDB directory",
        f"{results['rocksdb_bytes'] / 1e6:,.1f} MB",
        f"{results['rocksdb_bytes'] / raw:.2f}x raw",
    )
    table.add_row(
        "worker RSS",
        f"{results['rss_bytes'] / 1e6:,.0f} MB",
        f"{results['rss_bytes'] / raw:.2f}x raw",
    )
    Console().print(table)
    if args.profile is not None:
        for mode in modes:
            path = args.profile / f"restore-{mode}.txt"
            if path.exists():
                console.print(f"[bold]profile of restore {mode} (leaf functions, % of samples)")
                for frame, share in summarize_profile(path):
                    console.print(f"  {share:5.1f}%  {frame}")


if __name__ == "__main__":
    main()
