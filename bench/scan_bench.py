"""Full-scan ``sow`` alone: one worker holding a SOW of distinct keys, the whole topic queried
again and again (BatchSize 1000, decode included); prints the best and the median rate, and the
CPU time per record of the client process and of the worker (steadier than a rate on a busy
machine).

Run with ``make bench-scan`` (``python -m bench.scan_bench --records 100000 --repeat 10``).
Quicker and steadier than the scan row of ``make bench``, which takes one best of three.

"Decode included": every message's SowKey and body are read, as an application reads them
(messages of raw batches decode their record on first use; ``--count-only`` leaves them unread).
``--form record`` asks for the older answer form, one Avro record per SOW record; ``--form
both`` alternates the two forms scan by scan and reports each.
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

import psutil
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


def scan_count(client: Client, topic: str, *, read: bool = True) -> int:
    """Records a full-scan ``sow`` of ``topic`` streams to the client; with ``read``, the
    SowKey and body of each are read too."""
    count = 0
    for m in client.sow(topic, None, batch_size=1000):
        if m.command == "sow":
            count += 1
            if read:
                _ = (m.sow_key, m.data)
    return count


class Cpu:
    """CPU seconds (user + system) of this process and of the worker since the last call."""

    def __init__(self, worker: int) -> None:
        self._worker = psutil.Process(worker)
        self._last = self._now()

    def _now(self) -> tuple[float, float]:
        mine = psutil.Process(os.getpid()).cpu_times()
        theirs = self._worker.cpu_times()
        return mine.user + mine.system, theirs.user + theirs.system

    def lap(self) -> tuple[float, float]:
        now = self._now()
        spent = (now[0] - self._last[0], now[1] - self._last[1])
        self._last = now
        return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=100_000, help="distinct keys in the SOW")
    parser.add_argument("--repeat", type=int, default=10, help="timed scans (per form)")
    parser.add_argument(
        "--form",
        choices=["raw", "record", "both"],
        default="raw",
        help="answers as raw batches (default), one Avro record per record, or both alternated",
    )
    parser.add_argument(
        "--count-only", action="store_true", help="count the messages without reading them"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="write py-spy profiles of the timed scans here (worker.txt: the worker's thread "
        "holding the GIL; client.txt: this process) and print their top leaf functions",
    )
    args = parser.parse_args()
    forms = ["raw", "record"] if args.form == "both" else [args.form]
    rates: dict[str, list[float]] = {form: [] for form in forms}
    cpu_us: dict[str, list[tuple[float, float]]] = {form: [] for form in forms}
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
        clients = {
            form: stack.enter_context(
                Client(bootstrap, prefix=prefix, timeout=600, raw_scans=form == "raw")
            )
            for form in forms
        }
        client = clients[forms[0]]
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
        for other in clients.values():
            scan_count(other, "orders")  # warm: topic metadata, the reply reader
        spies = []
        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
            spies = [
                profiled(worker.pid, args.profile / "worker.txt", gil=True),
                profiled(os.getpid(), args.profile / "client.txt", gil=True),
            ]
            time.sleep(2)  # py-spy attaches
        cpu = Cpu(worker.pid)
        time.sleep(3)  # what the worker spends doing nothing, to tell apart from the scans
        idle = cpu.lap()[1] / 3
        for _ in range(args.repeat):
            for form in forms:
                cpu.lap()
                t0 = time.perf_counter()
                n = scan_count(clients[form], "orders", read=not args.count_only)
                rates[form].append(n / (time.perf_counter() - t0))
                mine, theirs = cpu.lap()
                cpu_us[form].append((mine * 1e6 / n, theirs * 1e6 / n))
        for spy in spies:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
    for form in forms:
        console.print(
            f"full-scan sow of {args.records:,} records, {args.repeat} scans, {form} form"
            f"{' (count only)' if args.count_only else ''}: best {max(rates[form]):,.0f} rec/s, "
            f"median {statistics.median(rates[form]):,.0f} rec/s; CPU per record (median): "
            f"client {statistics.median(c for c, _ in cpu_us[form]):.2f} us, "
            f"worker {statistics.median(w for _, w in cpu_us[form]):.2f} us"
        )
    console.print(f"the worker idle: {100 * idle:.1f}% of a core (part of its CPU per record)")
    if args.profile is not None:
        for side in ("worker", "client"):
            console.print(f"{side}: top leaf functions")
            for frame, share in summarize_profile(args.profile / f"{side}.txt", 15):
                console.print(f"  {share:5.1f}%  {frame}")


if __name__ == "__main__":
    main()
