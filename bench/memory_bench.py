"""Long-run memory check: 10M updates over 1M keys through one worker, RSS sampled throughout.

Run with ``make bench-memory`` (or ``python -m bench.memory_bench --updates 10000000 --keys
1000000``). The log is written by a bare producer (every key once, then random updates) while
the worker applies it; a client holds a filtered subscription (1% of the keys) and asks a small
``sow`` query every few seconds for the whole run, as a long-lived application would. Printed:
the worker's RSS once every key exists and at each further tenth of the run, the growth after
the working set was reached, the client's parked replies at the end, and the RocksDB size.
"""

from __future__ import annotations

import argparse
import subprocess
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import orjson
import psutil
import yaml
from rich.console import Console
from rich.table import Table

from bench.common import bench_bootstrap, stop_process, wait_queryable, worker_command, workspace
from bench.pipeline_bench import TOPIC, write_log
from bench.sow_bench import dir_size, free_port, scrape
from sowstream.client import Client

console = Console(stderr=True)
PARTITIONS = 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--updates", type=int, default=10_000_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--json", type=Path, help="also write the samples here")
    args = parser.parse_args()
    samples: list[tuple[float, float, int]] = []  # (seconds, applied, worker RSS)
    with ExitStack() as stack:
        bootstrap = bench_bootstrap(stack)
        work, prefix = workspace(stack, "membench")
        config = work / "bench.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "engine": {"app_id": prefix, "topic_prefix": prefix},
                    "sow": [{"Name": TOPIC, "Key": "/id", "Partitions": PARTITIONS}],
                }
            )
        )
        port = free_port()

        log = stack.enter_context(open(work / "worker.log", "ab"))
        worker = subprocess.Popen(
            worker_command(config, bootstrap, work, "--metrics-port", str(port)),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        stack.callback(stop_process, worker, 60)
        if wait_queryable(bootstrap, prefix, [TOPIC], 120) is None:
            raise SystemExit("the worker did not answer queries within 120 s")
        rss = psutil.Process(worker.pid)
        started = time.perf_counter()
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                try:
                    applied = scrape(port, "sowstream_updates_applied_total")
                except OSError:
                    applied = 0.0
                samples.append((time.perf_counter() - started, applied, rss.memory_info().rss))
                stop.wait(1.0)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        client = stack.enter_context(Client(bootstrap, prefix=prefix, timeout=60))
        sub = client.subscribe(TOPIC, "/id < " + str(args.keys // 100))
        writer = threading.Thread(
            target=write_log, args=(bootstrap, f"{prefix}.log.{TOPIC}", args.updates, args.keys)
        )
        console.print(f"[bold]writing {args.updates:,} updates over {args.keys:,} keys")
        writer.start()
        received = queries = 0
        last_query = 0.0
        while not samples or samples[-1][1] < args.updates:
            if worker.poll() is not None:
                raise SystemExit("the worker exited (see its log)")
            while sub.next(timeout=0.05) is not None:
                received += 1
            if time.perf_counter() - last_query > 5:
                last_query = time.perf_counter()
                list(client.sow(TOPIC, f"/id = {queries % args.keys}"))
                queries += 1
                done = samples[-1][1] if samples else 0
                console.print(
                    f"  {done:,.0f} applied, worker RSS {samples[-1][2] / 1e6:,.0f} MB"
                    if samples
                    else "  starting"
                )
        writer.join()
        stop.set()
        sampler.join()
        pending = client._connection.pending_replies()
        rocks = dir_size(work / "data" / prefix / "bench")
        sub.close()

    # RSS once every key exists (the working set), then at each tenth of the run
    def rss_at(applied: float) -> tuple[float, int]:
        for secs, done, value in samples:
            if done >= applied:
                return secs, value
        return samples[-1][0], samples[-1][2]

    marks = [args.keys] + [args.updates * i // 10 for i in range(2, 11)]
    _, base = rss_at(args.keys)
    peak_after = max(v for _, done, v in samples if done >= args.keys)
    table = Table(title=f"worker memory: {args.updates:,} updates over {args.keys:,} keys")
    table.add_column("updates applied", justify="right")
    table.add_column("seconds", justify="right")
    table.add_column("worker RSS", justify="right")
    table.add_column("vs working set", justify="right")
    for mark in marks:
        secs, value = rss_at(mark)
        table.add_row(f"{mark:,}", f"{secs:,.0f}", f"{value / 1e6:,.0f} MB", f"{value / base:.2f}x")
    table.add_row(
        "peak after the working set", "", f"{peak_after / 1e6:,.0f} MB", f"{peak_after / base:.2f}x"
    )
    Console().print(table)
    console.print(
        f"subscriber received {received:,} messages; {queries} queries; client replies parked at "
        f"the end: {pending}; RocksDB {rocks / 1e6:,.0f} MB"
    )
    if args.json is not None:
        args.json.write_text(
            orjson.dumps(
                {"samples": samples, "pending": pending, "rocksdb_bytes": rocks, "base": base}
            ).decode()
        )


if __name__ == "__main__":
    main()
