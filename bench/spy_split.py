"""Where a py-spy recording of a worker went, by the engine's stages.

``python -m bench.spy_split FILE`` reads py-spy's raw format (one line per distinct stack:
frames joined by ``;``, then a sample count) and counts each sample once, for the first stage in
``STAGES`` that any of its frames belongs to: the store and Kafka sends first (wherever they are
called from), then the view maintainer before the fold code it calls, and so on. Stages are named
by the source files of their frames; a sample in none counts as "other" under the outermost
sowstream frame's file (or "outside sowstream").
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from rich.table import Table

# (stage, path fragments of the frames that belong to it), in priority order: a sample counts
# for the first stage any of whose frames it holds.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("RocksDB reads and writes", ("rocksdict", "sowstream/engine/store.py")),
    ("Kafka produce (confluent/aiokafka send)", ("aiokafka/producer", "confluent_kafka")),
    ("queues: leases, acks, delivery", ("sowstream/engine/queues.py", "sowstream/queues/")),
    ("change events for views: routing", ("sowstream/views/routing.py",)),
    ("view maintainer: groups and joins", ("sowstream/views/",)),
    ("view maintainer: batches, view records", ("sowstream/engine/views.py",)),
    ("change events and subscription messages out", ("sowstream/engine/outbox.py",)),
    ("view/conflated input pump", ("sowstream/engine/inputs.py", "sowstream/engine/derived.py")),
    ("conflated topics", ("sowstream/engine/conflated.py",)),
    ("subscription matching", ("sowstream/subscriptions/",)),
    ("fold (compiled core)", ("sowstream/engine/native.py",)),
    ("fold and apply (Python)", ("sowstream/sow/", "sowstream/engine/apply.py")),
    ("topic processor: batches", ("sowstream/engine/processor.py", "sowstream/engine/table.py")),
    ("log pump", ("sowstream/engine/pump.py",)),
    ("faust and aiokafka", ("faust/", "aiokafka/", "mode/")),
    ("asyncio loop", ("asyncio/",)),
)


def stage_of(frames: list[str]) -> str:
    """The stage a sample counts for (``frames`` outermost first)."""
    for stage, parts in STAGES:
        if any(part in frame for frame in frames for part in parts):
            return stage
    outer = next((f for f in frames if "sowstream/" in f), None)
    if outer is None:
        return "outside sowstream"
    where = outer.split("sowstream/", 1)[1].split(":", 1)[0].rstrip(")")
    return f"other: sowstream/{where}"


def split(lines: list[str]) -> tuple[Counter[str], int]:
    """Samples per stage, and the total."""
    counts: Counter[str] = Counter()
    total = 0
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not count.isdigit() or not stack:
            continue
        n = int(count)
        counts[stage_of(stack.split(";"))] += n
        total += n
    return counts, total


def split_file(path: Path) -> Table:
    """A table of where ``path``'s samples went."""
    counts, total = split(path.read_text().splitlines())
    table = Table(title=f"{total:,} samples (100 Hz, GIL held)")
    table.add_column("stage")
    table.add_column("samples", justify="right")
    table.add_column("share", justify="right")
    for stage, n in counts.most_common():
        table.add_row(stage, f"{n:,}", f"{100 * n / max(total, 1):.1f}%")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args()
    from rich.console import Console

    for path in args.files:
        Console(width=160).print(path, split_file(path))


if __name__ == "__main__":
    main()
