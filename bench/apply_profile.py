"""Per-record cost of a SOW worker's apply path, in process: no broker, a real RocksDB store.

Run with ``make bench-apply`` (or ``python -m bench.apply_profile``). It applies the SOW bench's
workload (``bench.sow_bench.make_updates``: JSON records over 100,000 keys, a hash index on
``/customer``, ``--memo /qty`` adds a memo index) through the real ``TopicProcessor.process``
on four RocksDB partition stores, in chunks of 500 records as the log pump hands them over,
after one untimed pass that stores every key once (so every timed update replaces a record).
Changelog sends go to a sender that returns at once: aiokafka's share is measured on a real
worker (py-spy), not here.

It prints the end-to-end µs per record, then each step of the path timed on its own over the
same records (the sum can differ from the total: the rest is the loop around the steps), and
with ``--cprofile`` the functions with the most own time.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import inspect
import pstats
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rocksdict import Options, Rdict, WriteBatch

from bench.sow_bench import make_updates
from sowstream.config import load_config_text
from sowstream.config.models import NativeMode
from sowstream.engine.ports import Sender
from sowstream.engine.processor import TopicProcessor
from sowstream.engine.runtime import FaustTable
from sowstream.engine.store import RocksPartition
from sowstream.sow.compiled import compile_topic
from sowstream.sow.keys import generated_sow_key
from sowstream.sow.ops import RawRecord, apply_keyed, decode_log_record
from sowstream.sow.record import SowRecord
from sowstream.subscriptions.model import SubscriptionSpec
from sowstream.subscriptions.options import parse_options
from sowstream.wire import headers as h
from sowstream.wire.topics import TopicNames

PARTITIONS = 4
CHUNK = 500  # bench.sow_bench's worker folds at most APPLY_CHUNK records per process() call
TOPIC = compile_topic(
    load_config_text(
        "sow:\n  - Name: orders\n    Key: /id\n    Partitions: 4\n    HashIndex: [[/customer]]\n"
    ).topics[0]
)


class NullSender(Sender):
    """Every record is 'sent' at once, without a delivery future."""

    async def send(self, topic: str, value: bytes | None, **kwargs: Any) -> None:
        return None

    async def send_reply(
        self, topic: str, value: bytes, headers: list[tuple[str, bytes]] | None = None
    ) -> None:
        return None


class _Changelog:
    def get_topic_name(self) -> str:
        return "orders-changelog"


class _Data:
    def __init__(self, dbs: dict[int, Rdict]) -> None:
        self._dbs = dbs

    def _db_for_partition(self, partition: int) -> Rdict:
        return self._dbs[partition]


class BenchTable:
    """What ``RocksPartition`` reads of a faust table: its databases and changelog name."""

    name = "orders"
    changelog_topic = _Changelog()

    def __init__(self, root: Path) -> None:
        options = Options(raw_mode=True)
        self.root = root
        self.dbs = {p: Rdict(str(root / str(p)), options) for p in range(PARTITIONS)}
        self.data = _Data(self.dbs)

    def close(self) -> None:
        for db in self.dbs.values():
            db.close()


def log_records(
    bodies: Sequence[bytes], first_offset: list[int], headers: dict[str, str] | None = None
) -> list[RawRecord]:
    """The bodies as log records, keyed and partitioned as the client publishes them."""
    out = []
    for body in bodies:
        ident = int(body.split(b'"id":', 1)[1].split(b",", 1)[0])
        key = generated_sow_key("orders", "orders", ["/id"], {"id": ident}).encode()
        p = ident % PARTITIONS
        out.append(RawRecord(p, first_offset[p], 1_764_000_000_000, key, body, dict(headers or {})))
        first_offset[p] += 1
    return out


def processor(table: BenchTable, memo: Sequence[str], native: NativeMode = "off") -> TopicProcessor:
    proc = TopicProcessor(
        TOPIC,
        TopicNames("bench"),
        NullSender(),
        new_store=lambda p: RocksPartition(FaustTable(table), p),
        native=native,
    )
    for p in range(PARTITIONS):
        ps = proc.table.open(p)  # not loaded: nothing to read back from an empty store
        ps.ready = True
        ps.memo.update(memo)
    return proc


async def apply_all(proc: TopicProcessor, records: Sequence[RawRecord]) -> None:
    for start in range(0, len(records), CHUNK):
        await proc.process(records[start : start + CHUNK])
        await asyncio.sleep(0)
    await proc.drain()


def per_record(fn: Callable[[], object], n: int) -> float:
    """µs per record of ``fn`` (which handles ``n`` records), best of 3."""
    best = float("inf")
    for _ in range(3):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best / n * 1e6


def steps(proc: TopicProcessor, table: BenchTable, records: Sequence[RawRecord]) -> None:
    """Each step of the per-record path timed alone over ``records``, not applied yet (they are
    not written to the partition stores)."""
    n = len(records)
    ops = [
        decode_log_record(TOPIC, r.key, r.value, r.headers, r.offset, r.timestamp) for r in records
    ]
    keys = [op.sow_key.encode() for op in ops if op.sow_key is not None]
    stores = [proc.table.open(r.partition).store for r in records]
    raws = [s.get(k) for s, k in zip(stores, keys, strict=True)]
    olds = [SowRecord.from_bytes(raw) if raw is not None else None for raw in raws]
    news = [apply_keyed(TOPIC, old, op) for old, op in zip(olds, ops, strict=True)]
    memo = sorted(proc.table.open(0).memo)
    encoded = [new.to_bytes() for new in news if new is not None]
    headers = [[("sow.command", b"publish")] if i % 1000 == 0 else None for i in range(n)]
    trio = list(zip(keys, olds, news, strict=True))

    def decode() -> None:
        for r in records:
            decode_log_record(TOPIC, r.key, r.value, r.headers, r.offset, r.timestamp)

    rows: list[tuple[str, Callable[[], object]]] = [
        ("Kafka headers to a dict (RawRecord)", lambda: [h.header_map(x) for x in headers]),
        ("decode_log_record (JSON parse, SowKey hash)", decode),
        (
            "RocksDB get of the stored record",
            lambda: [s.get(k) for s, k in zip(stores, keys, strict=True)],
        ),
        (
            "decode the stored record (SowRecord.from_bytes)",
            lambda: [SowRecord.from_bytes(r) for r in raws if r is not None],
        ),
        (
            "apply_keyed (the new SowRecord)",
            lambda: [apply_keyed(TOPIC, o, op) for o, op in zip(olds, ops, strict=True)],
        ),
        (
            "index maintenance (PartitionTable.index_changes)",
            lambda: [proc.table.index_changes({}, k, o, nw, memo) for k, o, nw in trio],
        ),
    ]
    if "new_body" in inspect.signature(proc.table.index_changes).parameters:
        rows.append(
            (
                "  the same, given the body the fold parsed",
                lambda: [
                    proc.table.index_changes({}, k, o, nw, memo, op.body)  # type: ignore[call-arg]
                    for (k, o, nw), op in zip(trio, ops, strict=True)
                ],
            )
        )
    rows.append(
        (
            "encode the new record (SowRecord.to_bytes)",
            lambda: [nw.to_bytes() for nw in news if nw is not None],
        )
    )
    scratch = Rdict(str(table.root / "scratch"), Options(raw_mode=True))

    def write_batches() -> None:
        for start in range(0, n, 125):
            batch = WriteBatch(raw_mode=True)
            for k, v in zip(keys[start : start + 125], encoded[start : start + 125], strict=True):
                batch.put(k, v)
            scratch.write(batch)

    rows.append(("RocksDB WriteBatch put + write (125 per batch)", write_batches))
    total = 0.0
    for label, fn in rows:
        us = per_record(fn, n)
        if not label.startswith(" "):
            total += us
        print(f"  {us:6.2f} µs  {label}")
    scratch.close()
    print(f"  {total:6.2f} µs  sum of the steps (the first index line)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--updates", type=int, default=100_000, help="per timed pass")
    parser.add_argument("--passes", type=int, default=3, help="timed passes (the best counts)")
    parser.add_argument("--memo", action="append", default=[], help="memo index path, e.g. /qty")
    parser.add_argument("--cprofile", type=int, default=0, help="print the top N functions")
    parser.add_argument(
        "--native",
        choices=["off", "on", "both"],
        default="both",
        help="the compiled fold (engine.native); both: off, then on, each on its own stores",
    )
    parser.add_argument("--delta", action="store_true", help="every timed update a delta_publish")
    parser.add_argument("--no-steps", action="store_true", help="skip the step-by-step timings")
    parser.add_argument(
        "--subscriptions",
        type=int,
        default=0,
        help="filtered subscriptions (/customer = 'cN', oof; 10%% of updates match at 100)",
    )
    parser.add_argument(
        "--parse-bodies",
        action="store_true",
        help="match subscriptions on parsed bodies, not on the values the compiled fold reads",
    )
    args = parser.parse_args()
    gc.set_threshold(50_000, 20, 100)  # as the worker sets it (sowstream.engine.app)
    modes: list[NativeMode] = ["off", "on"] if args.native == "both" else [args.native]
    for number, mode in enumerate(modes):
        run(args, mode, steps_too=number == 0 and not args.no_steps)


def run(args: argparse.Namespace, mode: NativeMode, *, steps_too: bool) -> None:
    """Load every key once, then time the passes, with the compiled fold ``mode``."""
    root = Path(tempfile.mkdtemp(prefix="apply-profile-"))
    table = BenchTable(root)
    try:
        offsets = [0] * PARTITIONS
        # One record per key first (untimed), so each timed update replaces a stored record.
        first = log_records(make_updates(args.keys, args.keys, seed=3), offsets)
        seen: set[bytes] = set()
        load = [r for r in first if r.key not in seen and not seen.add(r.key)]  # type: ignore[func-returns-value]
        proc = processor(table, args.memo, mode)
        if mode == "on" and proc.applier._native is None:
            raise SystemExit("--native on: the compiled fold is not installed (make native)")
        asyncio.run(apply_all(proc, load))
        for n in range(args.subscriptions):
            flt = f"/customer = 'c{n}'"
            spec = SubscriptionSpec(f"s{n}", "r", "orders", "subscribe", flt, parse_options("oof"))
            proc.subs.upsert(spec)
        if args.parse_bodies:
            proc.subs.watched_paths = lambda: ()  # type: ignore[method-assign]
        headers = {h.COMMAND: h.DELTA_PUBLISH} if args.delta else None
        passes = [
            log_records(make_updates(args.updates, args.keys, seed=10 + i), offsets, headers)
            for i in range(args.passes)
        ]
        if steps_too:
            steps(proc, table, passes[0][:50_000])
        timings = []
        for updates in passes:
            wall, cpu = time.perf_counter(), time.thread_time()
            asyncio.run(apply_all(proc, updates))
            timings.append((time.thread_time() - cpu, time.perf_counter() - wall))
        cpu, wall = min(timings)
        print(
            f"apply path, native {mode}, {args.updates:,} "
            f"{'delta_publish ' if args.delta else ''}updates over {args.keys:,} keys"
            f"{' memo ' + ','.join(args.memo) if args.memo else ''}"
            f"{f', {args.subscriptions} subscriptions' if args.subscriptions else ''}"
            f"{' (bodies parsed)' if args.parse_bodies else ''}, best of {args.passes}: "
            f"{cpu / args.updates * 1e6:.2f} µs/record of main-thread CPU "
            f"({args.updates / cpu:,.0f}/s; wall clock {wall / args.updates * 1e6:.2f} µs; "
            "all passes: " + ", ".join(f"{c / args.updates * 1e6:.2f}" for c, _ in timings) + ")"
        )
        if args.cprofile:
            more = log_records(make_updates(args.updates, args.keys, seed=4), offsets, headers)
            prof = cProfile.Profile()
            prof.enable()
            asyncio.run(apply_all(proc, more))
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(args.cprofile)
    finally:
        table.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
