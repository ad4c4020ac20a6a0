"""Memo-index benchmark: range, LIKE and BEGINS WITH queries answered by a scan and by the index.

Run with ``make bench-index`` (or ``python -m bench.index_bench --records 100000``). It uses
$SOWSTREAM_BOOTSTRAP or starts the embedded local broker, publishes the records to a 4-partition
topic, starts one worker and, once it has applied them, times each query twice in the same run:

* as a scan: the same test written so that no index can serve it (``/qty + 0 > 900``,
  ``CONCAT(/customer) LIKE ...``), which reads and tests every record as before memo indexes;
* through the memo index: the first query builds the index (timed on its own), then the best of
  three.

Both forms must return the same records, and the worker's ``sowstream_query_plans_total``
counter must show which plan each used. Records/s is matched records per second of query time.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import time
import urllib.request
from contextlib import ExitStack

import orjson
import yaml
from rich.console import Console
from rich.table import Table

from bench.common import bench_bootstrap, stop_process, wait_queryable, worker_command, workspace
from bench.sow_bench import free_port, scrape, timed_query
from sowstream.client import Client

console = Console(stderr=True)
PARTITIONS = 4
# (label, indexed filter, the same test written so that no index serves it)
QUERIES = [
    ("range /qty > 900 (10%)", "/qty > 900", "/qty + 0 > 900"),
    ("range /qty > 990 (1%)", "/qty > 990", "/qty + 0 > 990"),
    ("LIKE /customer LIKE 'c9.9$'", "/customer LIKE 'c9.9$'", "CONCAT(/customer) LIKE 'c9.9$'"),
    (
        "BEGINS WITH /customer ('c42')",
        "/customer BEGINS WITH ('c42')",
        "CONCAT(/customer) BEGINS WITH ('c42')",
    ),
]


def make_records(n: int, seed: int = 1) -> list[bytes]:
    """The shape of bench.sow_bench's records, one per key: qty uniform in 0..999."""
    rng = random.Random(seed)
    return [
        orjson.dumps(
            {
                "id": k,
                "customer": f"c{k % 1000}",
                "region": f"r{k % 1000}",
                "qty": rng.randrange(1000),
                "px": round(100 + rng.random() * 10, 2),
                "side": "buy" if k % 2 else "sell",
            }
        )
        for k in range(n)
    ]


def plans(port: int, name: str) -> float:
    """How many partition queries on ``orders`` the worker answered with plan ``name``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        lines = resp.read().decode().splitlines()
    wanted = ("sowstream_query_plans_total{", 'topic="orders"', f'plan="{name}"')
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in lines
        if line.startswith(wanted[0]) and wanted[1] in line and wanted[2] in line
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=100_000)
    args = parser.parse_args()

    with ExitStack() as stack:
        bootstrap = bench_bootstrap(stack)
        work, prefix = workspace(stack, "indexbench")
        config = work / "bench.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "engine": {"app_id": prefix, "topic_prefix": prefix},
                    "sow": [{"Name": "orders", "Key": "/id", "Partitions": PARTITIONS}],
                }
            )
        )
        port = free_port()
        proc = subprocess.Popen(
            worker_command(config, bootstrap, work, "--metrics-port", str(port)),
            stdout=open(work / "worker.log", "ab"),  # noqa: SIM115 - owned by the process
            stderr=subprocess.STDOUT,
        )
        stack.callback(stop_process, proc)
        if wait_queryable(bootstrap, prefix, ["orders"], 120) is None:
            raise SystemExit("the worker did not answer queries within 120 s")

        records = make_records(args.records)
        with Client(bootstrap, prefix=prefix, timeout=600) as client:
            for body in records:
                client.publish("orders", body)
            client.flush()
            while scrape(port, "sowstream_updates_applied_total") < len(records):
                time.sleep(0.2)
            console.print(f"[bold]{len(records):,} records applied; timing queries")

            rows = []
            for label, indexed, unindexed in QUERIES:
                scans_before = plans(port, "scan")
                scan_n, scan_t = timed_query(client, "orders", unindexed)
                assert plans(port, "scan") - scans_before == 3 * PARTITIONS, unindexed
                memo_before = plans(port, "memo")
                t0 = time.perf_counter()
                first_n = sum(
                    1 for m in client.sow("orders", indexed, batch_size=1000) if m.command == "sow"
                )
                first_t = time.perf_counter() - t0
                memo_n, memo_t = timed_query(client, "orders", indexed)
                assert plans(port, "memo") - memo_before == 4 * PARTITIONS, indexed
                assert scan_n == first_n == memo_n, (label, scan_n, first_n, memo_n)
                rows.append((label, memo_n, scan_t, first_t, memo_t))
                console.print(f"{label}: scan {scan_t * 1000:.0f} ms, index {memo_t * 1000:.0f} ms")

    table = Table(
        title=f"sowstream memo indexes: {args.records:,} records, {PARTITIONS} partitions, "
        "1 worker, BatchSize 1000, best of 3"
    )
    for column in ("query", "matched", "scan", "first (builds)", "memo index", "speed-up"):
        table.add_column(column, justify="left" if column == "query" else "right")
    for label, n, scan_t, first_t, memo_t in rows:
        table.add_row(
            label,
            f"{n:,}",
            f"{scan_t * 1000:,.0f} ms = {n / scan_t:,.0f} rec/s",
            f"{first_t * 1000:,.0f} ms",
            f"{memo_t * 1000:,.0f} ms = {n / memo_t:,.0f} rec/s",
            f"{scan_t / memo_t:.1f}x",
        )
    Console(width=150).print(table)


if __name__ == "__main__":
    main()
