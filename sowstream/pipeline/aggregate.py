"""Aggregated queries over a SOW DataFrame (a rebuild or an as-of state) on Spark.

Each Spark task computes the partial aggregates of its share of the records with the very code
the engine's workers run (``sowstream.sow.aggregate``); the driver merges the partials and
finishes them. So Spark and the engine give the same answer by construction, and the work that
grows with the data (reading and folding records) is spread over the cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import orjson

from sowstream.sow.aggregate import Aggregation, merge_partials, parse_aggregation

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame


def aggregate_state(state: DataFrame, aggregation: Aggregation) -> list[dict[str, Any]]:
    """One output record per group over ``state``'s ``data`` column (JSON text)."""
    grouping, projection = aggregation.grouping_text, aggregation.projection_text

    def partials(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        # Compiled expressions are closures: rebuild the aggregation inside the task.
        local = parse_aggregation(grouping, projection)
        records = (
            orjson.loads(text)
            for batch in batches
            for text in batch.column("data").to_pylist()
            if text is not None
        )
        result = orjson.dumps(local.partial(records)).decode()
        yield pa.RecordBatch.from_pylist([{"partials": result}])

    rows = state.select("data").mapInArrow(partials, "partials string").collect()
    merged = merge_partials(aggregation, [orjson.loads(r.partials) for r in rows])
    return aggregation.finish(merged)
