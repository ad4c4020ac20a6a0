"""Start partitions from a Spark seed instead of a changelog restore (see sowstream.pipeline.seed).

Before the runtime opens a table, every partition the seed covers and this worker has no local state
for gets a RocksDB made from the seed's SST file, with faust's changelog offset set to the one
the seed matches, so faust only restores what the changelog gained since.
"""

from __future__ import annotations

import logging
from pathlib import Path

from rocksdict import Options, Rdict

from sowstream.engine.ports import StateTable
from sowstream.errors import StateStoreError
from sowstream.sow.layout import FAUST_OFFSET_KEY, SeedManifest

log = logging.getLogger("sowstream.engine")


def ingest_seed(directory: Path, app_id: str, changelog: str, table: StateTable) -> list[int]:
    """Seed the partitions of ``table`` that have no local database; returns their numbers."""
    manifest = SeedManifest.load(directory)
    if manifest is None:
        return []
    if manifest.app_id != app_id or manifest.changelog_topic != changelog:
        raise StateStoreError(
            f"seed {directory} is for engine {manifest.app_id!r} (changelog "
            f"{manifest.changelog_topic!r}), not {app_id!r} ({changelog!r})"
        )
    seeded: list[int] = []
    for partition, info in sorted(manifest.partitions.items()):
        path = table.partition_path(partition)
        if path.exists() and any(path.iterdir()):
            continue  # local state is newer than any seed
        sst = directory / info["file"]
        if not sst.exists():
            if info.get("entries"):
                raise StateStoreError(f"seed file {sst} is missing")
            continue
        path.mkdir(parents=True, exist_ok=True)
        try:
            db = Rdict(str(path), Options(raw_mode=True))
            try:
                db.ingest_external_file([str(sst)])
                db[FAUST_OFFSET_KEY] = str(info["changelog_offset"]).encode()
            finally:
                db.close()
        except Exception as exc:  # rocksdict raises bare Exception
            raise StateStoreError(f"cannot ingest seed {sst} into {path}: {exc}") from exc
        log.info(
            "seeded %s partition %d from %s (log applied up to offset %d)",
            changelog,
            partition,
            sst,
            info["watermark"],
        )
        seeded.append(partition)
    return seeded
