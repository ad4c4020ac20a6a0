"""One Spark session for the whole tests/spark run: starting one takes about ten seconds."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A local[2] session with the Kafka connector; stopped when the run ends."""
    from sowstream.pipeline.session import spark_session

    session = spark_session(
        "local[2]",
        app_name="sowstream-tests",
        extra_conf={
            # The test queries are small and many: interpreting their expressions is faster
            # than compiling each plan to Java (one test switches compilation back on).
            "spark.sql.codegen.wholeStage": "false",
            "spark.sql.codegen.factoryMode": "NO_CODEGEN",
        },
    )
    yield session
    session.stop()
