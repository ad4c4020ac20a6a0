"""The Spark rebuild's fold (``fold_log`` on a real session) and the engine's processor give the
same SOW for random logs of publishes, delta publishes and deletes on topics with Preprocessing
and Enrichment: a delta_publish is enriched as it came, then merged, on both sides.

Two topics: one whose Enrichment reads the record before it (every key folds its whole log) and
one whose Enrichment does not (each key folds from its last publish on, the anchored cut).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from sowstream.config import load_config_text
from sowstream.pipeline.rebuild import fold_log
from sowstream.sow.compiled import compile_topic
from sowstream.sow.fold import reads_previous
from sowstream.sow.ops import RawRecord
from tests.unit.test_enrichment_property import TOPIC, model, to_records
from tests.unit.test_processor_model import run

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.integration

# No OF PREVIOUS: the rebuild cuts each key's log at its last publish.
ANCHORED = load_config_text(
    """
engine: {app_id: prop}
sow:
  - Name: t
    Key: /key
    Durability: transient
    Preprocessing:
      - CONCAT('k', /id) AS /key
    Enrichment:
      - IF(/p IS NULL, 'delta', 'whole') AS /came
      - /v * 2 AS /w
      - IF(/v < 0, NULL, /v) AS /v HINT OPTIONAL
      - UNIX_TIMESTAMP() AS /at
"""
).topics[0]

LOG_SCHEMA = (
    "partition int, offset long, ts long, key binary, value binary, headers map<string,string>"
)

op = st.one_of(
    st.tuples(st.just("publish"), st.integers(0, 5), st.integers(0, 1), st.integers(-2, 9)),
    st.tuples(st.just("delta"), st.integers(0, 5), st.integers(0, 1), st.integers(-2, 9)),
    st.tuples(st.just("delta"), st.integers(0, 5), st.integers(0, 1), st.integers(-2, 9)),
    st.tuples(st.just("delete"), st.integers(0, 5), st.just(0), st.just(0)),
    st.tuples(st.just("filter"), st.just(0), st.integers(0, 1), st.just(0)),
    st.tuples(st.just("raw_key"), st.integers(0, 5), st.integers(0, 1), st.integers(0, 9)),
)


def spark_sow(spark: SparkSession, topic: Any, records: list[RawRecord]) -> dict[bytes, Any]:
    rows = [(r.partition, r.offset, r.timestamp, r.key, r.value, r.headers) for r in records]
    log = spark.createDataFrame(rows, LOG_SCHEMA)
    folded = fold_log(topic, log, 0, 2).collect()
    return {r.sow_key.encode(): orjson.loads(r.data) for r in folded}


def test_the_two_topics_take_both_paths_of_the_rebuild() -> None:
    assert reads_previous(compile_topic(TOPIC))
    assert not reads_previous(compile_topic(ANCHORED))


@settings(
    max_examples=6,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],  # shrinking would rerun Spark jobs
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(op, min_size=20, max_size=60),
    st.lists(st.integers(0, 60), max_size=3),
)
def test_spark_rebuild_and_engine_agree_on_enriched_delta_publishes(
    spark: SparkSession, sequence: list[tuple[str, int, int, int]], cuts: list[int]
) -> None:
    records = to_records(sequence)
    for topic in (TOPIC, ANCHORED):
        engine = run(records, cuts, None, topic)
        assert spark_sow(spark, topic, records) == engine
    # and both are the chapter's order spelled out by hand (enrich the delta, then merge)
    assert run(records, cuts, None, TOPIC) == model(sequence)
