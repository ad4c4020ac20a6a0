"""The key layout of a partition store, shared by the engine and the Spark seed writer.

One RocksDB (or in-memory) store per topic partition holds, in key order: reserved entries
(``0x00``: the applied watermark, History versions, memo indexes and their markers, see
``sowstream.sow.memo``), hash-index entries (``0x01``), then the SOW records under their SowKey.
faust keeps its own changelog offset under ``FAUST_OFFSET_KEY``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sowstream.filters.values import canonical_text, is_null
from sowstream.sow.keys import field_values
from sowstream.sow.memo import READY, marker_key, memo_entries
from sowstream.sow.record import SowRecord

if TYPE_CHECKING:
    from sowstream.messagetypes import MessageType

RESERVED_PREFIX = b"\x00"
WATERMARK_KEY = b"\x00sowstream.applied"
# Fingerprint of the log record at the watermark (sow.logcheck), written with the watermark.
APPLIED_RECORD_KEY = b"\x00sowstream.applied.record"
# The partition's status warnings (JSON list), e.g. a recreated log (sow.logcheck).
WARNINGS_KEY = b"\x00sowstream.warnings"
INDEX_PREFIX = b"\x01"
FAUST_OFFSET_KEY = b"__faust\x00offset__"
RECORDS_START = b"\x02"
# A Spark seed of a partition store: a directory with this manifest and one SST per partition.
SEED_MANIFEST = "seed.json"


@dataclass
class SeedManifest:
    """What a seed holds, written last (by the Spark job) and read by workers.

    A directory without it is not a seed. Per log partition: the SST ``file``, its number of
    ``entries``, the ``watermark`` applied and the ``changelog_offset`` the store matches.
    """

    topic: str
    app_id: str
    log_topic: str
    changelog_topic: str
    until_ms: int
    created_ms: int
    partitions: dict[int, dict[str, Any]] = field(default_factory=dict)

    def save(self, directory: Path) -> None:
        (directory / SEED_MANIFEST).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, directory: Path) -> SeedManifest | None:
        """The seed in ``directory``, or None when there is none."""
        path = directory / SEED_MANIFEST
        if not path.exists():
            return None
        raw = json.loads(path.read_text())
        raw["partitions"] = {int(p): v for p, v in raw["partitions"].items()}
        return cls(**raw)


def is_record_key(key: bytes) -> bool:
    """Whether a store key holds a SOW record (not a watermark, index entry or faust's offset)."""
    return key[:1] > INDEX_PREFIX and key != FAUST_OFFSET_KEY


def index_entry_prefix(index: int, values: Sequence[str]) -> bytes:
    """Key prefix of hash index ``index`` for one combination of canonical values."""
    h = hashlib.blake2b(digest_size=12)
    for value in values:
        raw = value.encode()
        h.update(len(raw).to_bytes(4, "big"))
        h.update(raw)
    return INDEX_PREFIX + index.to_bytes(2, "big") + h.digest()


def index_entries(
    indexes: Sequence[Sequence[str]], key: bytes, body: dict[str, Any] | None
) -> set[bytes]:
    """The hash-index entries (prefix + record key) a record with ``body`` has."""
    if body is None:
        return set()
    entries: set[bytes] = set()
    for number, fields in enumerate(indexes):
        per_field: list[list[str]] = []
        for path in fields:
            values = [canonical_text(v) for v in field_values(body, path) if not is_null(v)]
            if not values:
                break
            per_field.append(values)
        else:
            for combo in itertools.product(*per_field):
                entries.add(index_entry_prefix(number, combo) + key)
    return entries


def store_entries(
    indexes: Sequence[Sequence[str]],
    records: Iterable[SowRecord],
    watermark: int,
    mtype: MessageType,
    memo: Sequence[str] = (),
) -> list[tuple[bytes, bytes]]:
    """Everything a partition store holds for ``records`` applied up to ``watermark``, sorted.

    This is what the engine would have written itself (records, hash-index entries, the memo
    indexes on ``memo`` with their ready markers, watermark), so a store built from it (a Spark
    seed) is indistinguishable from one the engine filled.
    """
    out: list[tuple[bytes, bytes]] = [(WATERMARK_KEY, str(watermark).encode())]
    out.extend((marker_key(path), READY) for path in dict.fromkeys(memo))
    for rec in records:
        key = rec.sow_key.encode()
        body = rec.parsed(mtype)
        out.append((key, rec.to_bytes()))
        out.extend((entry, b"") for entry in index_entries(indexes, key, body))
        out.extend((entry, b"") for entry in memo_entries(dict.fromkeys(memo), key, body))
    out.sort()
    return out
