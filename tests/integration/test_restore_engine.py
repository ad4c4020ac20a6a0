"""A worker that lost its RocksDB, restored by the batched copy and by faust, from one changelog.

Both restores must rebuild the very store the worker had (every RocksDB key and value of every
partition: records, tombstoned keys gone, History versions, hash- and memo-index entries and
their markers, watermarks) and answer every query alike.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rocksdict import AccessType, Options, Rdict

from sowstream.client import Client
from sowstream.sow.history import HISTORY_PREFIX
from sowstream.sow.layout import FAUST_OFFSET_KEY, INDEX_PREFIX, WATERMARK_KEY
from sowstream.sow.memo import MARKER_PREFIX, MEMO_PREFIX
from sowstream.sow.timestamps import format_timestamp
from tests.support.engine import EngineProcesses, write_config

pytestmark = pytest.mark.integration

TOPICS: list[dict[str, Any]] = [
    {
        "Name": "book",
        "Key": ["/id"],
        "History": {"Window": "1d", "Granularity": "0s"},
        "HashIndex": [["/customer"]],
        "Index": ["/qty"],
        "Partitions": 2,
    },
    # small enough that faust restores it in the same start (below the batched threshold)
    {"Name": "marks", "Key": ["/id"], "Partitions": 2},
]
NAMES = [t["Name"] for t in TOPICS]
RESTORED = re.compile(r"restored (\d+) changelog records of (\d+) partitions")
Stores = dict[str, dict[bytes, bytes]]


@pytest.fixture
def engine(kafka_bootstrap: str, tmp_path: Path) -> Iterator[EngineProcesses]:
    procs = EngineProcesses(kafka_bootstrap, tmp_path, TOPICS)
    try:
        yield procs
    finally:
        procs.stop_all()


def moment(client: Client) -> str:
    """A point in time after everything published so far was applied, before anything later."""
    list(client.sow("book", top_n=0))
    time.sleep(0.05)
    at = format_timestamp(int(time.time() * 1000))
    time.sleep(0.05)
    return at


def fill(client: Client) -> list[str]:
    """Upserts, deltas, deletes by key and by filter, on-demand memo indexes; two moments."""
    for i in range(800):
        client.publish("book", {"id": i, "customer": f"c{i % 13}", "qty": i % 100, "n": f"n{i}"})
    client.publish("marks", {"id": 1, "v": 1})
    first = moment(client)
    for i in range(0, 800, 2):
        client.publish("book", {"id": i, "customer": f"c{i % 7}", "qty": (i * 7) % 100})
    for i in range(1, 300, 2):
        client.delta_publish("book", {"id": i, "qty": 50, "extra": {"i": i}})
    for i in range(5, 800, 13):
        client.sow_delete("book", data={"id": i})
    client.sow_delete("book", filter="/qty > 95")
    client.sow_delete("marks", filter="1=1")
    client.publish("marks", {"id": 2, "v": 2})
    second = moment(client)
    client.publish("book", {"id": 3, "customer": "late", "qty": 1})
    # built on demand: its entries and ready markers are in the store and the changelog
    assert client.sow_records("book", "/n BEGINS WITH ('n1')")
    return [first, second]


def answers(client: Client, moments: list[str]) -> dict[str, Any]:
    """Every kind of query the restored store has to answer as before."""

    def rows(topic: str, flt: str | None = None, **options: Any) -> dict[str, Any]:
        found = client.sow(topic, flt, batch_size=500, **options)
        return {m.sow_key: m.json() for m in found if m.command == "sow"}

    out = {
        "all": rows("book"),
        "hash": rows("book", "/customer = 'c3'"),
        "memo": rows("book", "/qty BETWEEN 10 AND 40"),
        "memo-on-demand": rows("book", "/n BEGINS WITH ('n2')"),
        "marks": rows("marks"),
    }
    for n, at in enumerate(moments):
        out[f"history-{n}"] = rows("book", bookmark=at)
    assert out["all"] and out["hash"] and out["memo"] and out["history-0"]
    return out


def stores(engine: EngineProcesses, name: str) -> Stores:
    """Every key and value of every partition database of worker ``name`` (stopped)."""
    found: Stores = {}
    for path in sorted(engine.data_dir(name).rglob("*.db")):
        db = Rdict(str(path), Options(raw_mode=True), access_type=AccessType.read_only())
        try:
            found[path.name] = dict(db.items())
        finally:
            db.close()
    assert found
    return found


def without_faust_offsets(found: Stores) -> Stores:
    return {n: {k: v for k, v in s.items() if k != FAUST_OFFSET_KEY} for n, s in found.items()}


def restore(engine: EngineProcesses, mode: str, moments: list[str]) -> tuple[Stores, Any, int]:
    """Wipe w1's RocksDB, start it with ``engine.restore: mode``; its stores, answers and how
    many records the batched copy reported."""
    write_config(engine.config, TOPICS, prefix=engine.prefix, engine_extra={"restore": mode})
    shutil.rmtree(engine.data_dir("w1"))
    log = engine.workdir / "w1.log"
    seen = len(log.read_text(errors="replace"))
    engine.start("w1")
    engine.wait_ready(NAMES)
    with engine.client() as client:
        got = answers(client, moments)
    engine.stop("w1")
    copied = [int(m.group(1)) for m in RESTORED.finditer(log.read_text(errors="replace")[seen:])]
    return stores(engine, "w1"), got, sum(copied)


def test_batched_and_faust_restores_rebuild_the_same_store(engine: EngineProcesses) -> None:
    engine.start("w1")
    engine.wait_ready(NAMES)
    with engine.client() as client:
        moments = fill(client)
        before = answers(client, moments)
    engine.stop("w1")
    original = stores(engine, "w1")
    book = [s for name, s in original.items() if name.startswith("sow-book-")]
    assert len(book) == 2
    for store in book:  # every kind of entry the comparisons below have to cover
        for prefix in (HISTORY_PREFIX, MEMO_PREFIX, MARKER_PREFIX, INDEX_PREFIX, WATERMARK_KEY):
            assert any(k.startswith(prefix) for k in store), prefix

    batched, batched_answers, copied = restore(engine, "batched", moments)
    assert copied > 2_000  # the batched path did the work (the book's two partitions)
    assert batched_answers == before
    assert without_faust_offsets(batched) == without_faust_offsets(original)

    by_faust, faust_answers, copied = restore(engine, "faust", moments)
    assert copied == 0
    assert faust_answers == before
    assert by_faust == batched  # faust's offsets included: both end at the changelog's end
