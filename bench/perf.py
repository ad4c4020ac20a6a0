"""The performance table in one run: every target of issues 13 and 24 (issue 24's aims where
both set one), measured on this machine, with its ratio and aim. ``make bench`` runs it.

It runs three benchmarks one after another, each against its own engine and the same broker,
and reads the figures they write (``--json``):
* ``bench.sow_bench``: apply rate (and worker CPU per update) with no subscriptions, with every
  update a ``delta_publish`` and with 100 filtered subscriptions (10% of the updates match), two
  workers against one, the full-scan query, the relay baseline;
* ``bench.restore_bench``: restore of 1M keys with RocksDB lost, a bare consume of the same
  changelog, the worker's RSS and the RocksDB size for those keys;
* ``bench.subs_bench``: publish→subscriber latency at half the maximum rate next to a bare
  confluent-kafka producer→consumer at the same rate.
Ratios compare figures of the same run; the run takes 10 to 15 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console
from rich.table import Table

from bench.common import bench_bootstrap

console = Console(stderr=True)


def run_bench(module: str, out: Path, *args: str, bootstrap: str) -> Any:
    """Run ``python -m module args --json out`` on the shared broker; its figures."""
    console.rule(f"[bold]{module} {' '.join(args)}")
    command = [sys.executable, "-m", module, *args, "--json", str(out)]
    subprocess.run(command, check=True, env={**os.environ, "SOWSTREAM_BOOTSTRAP": bootstrap})
    return orjson.loads(out.read_bytes())


def verdict(ok: bool) -> str:
    return "[green]met" if ok else "[red]not met"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--updates", type=int, default=1_000_000, help="SOW bench updates")
    parser.add_argument("--keys", type=int, default=100_000, help="SOW bench keys")
    parser.add_argument("--restore-keys", type=int, default=1_000_000)
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args()
    started = time.perf_counter()
    with ExitStack() as stack:
        bootstrap = bench_bootstrap(stack)
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="perf-")))
        sow = run_bench(
            "bench.sow_bench",
            tmp / "sow.json",
            "--updates",
            str(args.updates),
            "--keys",
            str(args.keys),
            "--delta",
            bootstrap=bootstrap,
        )
        restore = run_bench(
            "bench.restore_bench",
            tmp / "restore.json",
            "--keys",
            str(args.restore_keys),
            "--modes",
            "batched",
            bootstrap=bootstrap,
        )
        latency = run_bench(
            "bench.subs_bench",
            tmp / "subs.json",
            "--fanouts",
            "1",
            "--latency-loads",
            "0.5",
            "--latency-seconds",
            str(args.latency_seconds),
            "--orders",
            "0",
            bootstrap=bootstrap,
        )
    figures = {"sow": sow, "restore": restore, "latency": latency}
    if args.json is not None:
        args.json.write_text(orjson.dumps(figures).decode())

    relay = sow["relay"]
    table = Table(
        title=f"sowstream performance (issues 13 and 24), one run, {time.strftime('%Y-%m-%d')}"
    )
    for column in ("measure", "value", "ratio", "aim", ""):
        table.add_column(column, justify="left" if column == "measure" else "right")
    apply_rate = sow["apply_rate"]
    table.add_row(
        "SOW updates applied/s, 1 worker, no subscriptions",
        f"{apply_rate:,.0f}/s",
        f"{apply_rate / relay:.2f}x relay ({relay:,.0f}/s)",
        "≥ 0.8x relay and ≥ 100k/s",
        verdict(apply_rate >= 0.8 * relay and apply_rate >= 100_000),
    )
    cpu = sow["worker_cpu_us"]
    table.add_row(
        "  worker CPU per update, all threads (main thread)",
        f"{cpu:.1f} µs ({sow['worker_main_cpu_us']:.1f})",
        "",
        "≤ 6 µs",
        verdict(cpu <= 6),
    )
    if "delta_rate" in sow:
        rate = sow["delta_rate"]
        table.add_row(
            "the same, every update a delta_publish",
            f"{rate:,.0f}/s ({sow['delta_cpu_us']:.1f} µs CPU)",
            f"{rate / relay:.2f}x relay",
            "≥ 0.7x relay",
            verdict(rate >= 0.7 * relay),
        )
    if "subs_rate" in sow:
        rate = sow["subs_rate"]
        table.add_row(
            f"with {sow['subscriptions']} filtered subscriptions "
            f"({sow['subs_matching'] / args.updates:.0%} of updates match)",
            f"{rate:,.0f}/s ({sow['subs_cpu_us']:.1f} µs CPU)",
            f"{rate / relay:.2f}x relay",
            "≥ 0.6x relay",
            verdict(rate >= 0.6 * relay),
        )
    if "two_workers_rate" in sow:
        two = sow["two_workers_rate"]
        table.add_row(
            f"two workers vs one, 4 partitions (broker: {sow['broker_cores_two']:.2f} cores "
            f"with two, {sow['broker_cores_one']:.2f} with one)",
            f"{two:,.0f}/s",
            f"{two / apply_rate:.2f}x one worker",
            "≥ 1.6x",
            verdict(two >= 1.6 * apply_rate),
        )
    ready, report, _keys = restore["batched"]
    bare = restore["bare_rate"]
    if ready is None:
        table.add_row("restore of 1M keys (RocksDB lost)", "gave up", "", "≤ 10 s", verdict(False))
    else:
        rate = restore["changelog"] / ready
        table.add_row(
            f"restore of {args.restore_keys:,} keys from the changelog, start to ready",
            f"{ready:.1f} s",
            f"{rate / bare:.2f}x bare consume"
            + (f" (the copy: {report[0] / report[1] / bare:.2f}x)" if report else ""),
            "≤ 10 s and ≥ 0.5x",
            verdict(ready <= 10 and rate >= 0.5 * bare),
        )
    scan = sow["full_scan_rate"]
    table.add_row(
        "full-scan sow streamed to the client (BatchSize 1000, decode included)",
        f"{scan:,.0f} rec/s",
        f"{scan / relay:.2f}x relay",
        "≥ 600k rec/s",
        verdict(scan >= 600_000),
    )
    for item in latency:
        ratio = item["p99_ms"] / item["kafka_p99_ms"]
        table.add_row(
            f"publish→subscriber p99 at {item['load']:.0%} of max ({item['rate']:,.0f}/s)",
            f"{item['p99_ms']:.1f} ms (p50 {item['p50_ms']:.1f})",
            f"{ratio:.1f}x bare Kafka p99 ({item['kafka_p99_ms']:.1f} ms)",
            "≤ 2x",
            verdict(ratio <= 2),
        )
    raw = restore["raw_bytes"]
    table.add_row(
        f"worker RSS, {args.restore_keys:,} keys",
        f"{restore['rss_bytes'] / 1e6:,.0f} MB",
        f"{restore['rss_bytes'] / raw:.1f}x raw ({raw / 1e6:,.0f} MB)",
        "report",
        "",
    )
    table.add_row(
        f"RocksDB on disk, {args.restore_keys:,} keys",
        f"{restore['rocksdb_bytes'] / 1e6:,.0f} MB",
        f"{restore['rocksdb_bytes'] / raw:.2f}x raw",
        "≤ 2x raw",
        verdict(restore["rocksdb_bytes"] <= 2 * raw),
    )
    Console(width=160).print(table)
    for item in latency:
        stages = item.get("batch_life_ms") or {}
        if stages:
            console.print(
                f"batch life at {item['load']:.0%} of max (ms since fetch, p50/p99/mean): "
                + "; ".join(f"{k} {v[0]:.1f}/{v[1]:.1f}/{v[2]:.1f}" for k, v in stages.items())
            )
    console.print(f"whole run: {time.perf_counter() - started:,.0f} s")


if __name__ == "__main__":
    main()
