"""Full-scan ``sow`` alone: one worker holding a SOW of distinct keys, the whole topic queried
again and again (BatchSize 1000, decode included); prints the best and the median rate.

Run with ``make bench-scan`` (``python -m bench.scan_bench --records 100000 --repeat 10``).
Quicker and steadier than the scan row of ``make bench``, which takes one best of three.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import time
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console

from bench.common import (
    bench_bootstrap,
    profiled,
    stop_process,
    wait_queryable,
    worker_command,
    workspace,
)
from bench.restore_bench import summarize_profile
from bench.sow_bench import free_port, write_bench_config
from sowstream.client import Client

console = Console(stderr=True)


def scan_count(client: Client, topic: str) -> int:
    """Records a full-scan ``sow`` of ``topic`` streams to the client."""
    return sum(1 for m in client.sow(topic, None, batch_size=1000) if m.command == "sow")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=100_000, help="distinct keys in the SOW")
    parser.add_argument("--repeat", type=int, default=10, help="timed scans")
    parser.add_argument(
        "--profile",
        type=Path,
        help="write py-spy profiles of the timed scans here (worker.txt: the worker's thread "
        "holding the GIL; client.txt: this process) and print their top leaf functions",
    )
    args = parser.parse_args()
    with ExitStack() as stack:
        bootstrap = bench_bootstrap(stack)
        work, prefix = workspace(stack, "scanbench")
        config = write_bench_config(work / "bench.yaml", prefix)
        cmd = worker_command(config, bootstrap, work, "--metrics-port", str(free_port()))
        log = open(work / "worker.log", "ab")  # noqa: SIM115
        worker = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        stack.callback(stop_process, worker)
        if wait_queryable(bootstrap, prefix, ["orders"], 120) is None:
            raise SystemExit("the worker did not answer queries within 120 s")
        with Client(bootstrap, prefix=prefix, timeout=600) as client:
            for i in range(args.records):
                client.publish(
                    "orders",
                    b'{"id":%d,"customer":"c%d","region":"r%d","qty":%d,"px":101.25,'
                    b'"side":"buy","seq":%d}' % (i, i % 1000, i % 1000, i % 1000, i),
                )
            client.flush()
            deadline = time.monotonic() + 300
            while scan_count(client, "orders") < args.records:
                if time.monotonic() > deadline:
                    raise SystemExit("the worker did not hold every record within 300 s")
                time.sleep(1)
            spies = []
            if args.profile is not None:
                args.profile.mkdir(parents=True, exist_ok=True)
                spies = [
                    profiled(worker.pid, args.profile / "worker.txt", gil=True),
                    profiled(os.getpid(), args.profile / "client.txt"),
                ]
                time.sleep(2)  # py-spy attaches
            rates = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                n = scan_count(client, "orders")
                rates.append(n / (time.perf_counter() - t0))
            for spy in spies:
                spy.send_signal(signal.SIGINT)
                spy.wait(60)
    console.print(
        f"full-scan sow of {args.records:,} records, {args.repeat} scans: "
        f"best {max(rates):,.0f} rec/s, median {statistics.median(rates):,.0f} rec/s"
    )
    if args.profile is not None:
        for side in ("worker", "client"):
            console.print(f"{side}: top leaf functions")
            for frame, share in summarize_profile(args.profile / f"{side}.txt", 15):
                console.print(f"  {share:5.1f}%  {frame}")


if __name__ == "__main__":
    main()
