"""A SparkSession set up for sowstream: the Kafka connector on the class path, small and quiet.

``spark_session()`` is for local runs and tests. On a cluster, submit the job with the same jars
instead, since the driver's ``spark.jars`` is not how a cluster manager ships code::

    spark-submit $(python -c "from sowstream.pipeline.session import spark_submit_args; \\
        print(' '.join(spark_submit_args()))") my_job.py

which expands to ``--jars <the connector jars, comma-separated> --conf ...``. With network access
to Maven Central on the cluster, ``--packages <connector_coordinates()>`` works too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

from sowstream.pipeline.connector import connector_jars

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["SESSION_CONF", "spark_session", "spark_submit_args"]

# Settings every sowstream job relies on, whether it runs locally or on a cluster.
SESSION_CONF: dict[str, str] = {
    # Timestamps (Kafka's, expirations) are instants: never let the machine's zone shift them.
    "spark.sql.session.timeZone": "UTC",
    # orjson keeps the last of duplicate keys; without this, parse_json rejects such a record.
    "spark.sql.variant.allowDuplicateKeys": "true",
    # A log record's repeated header names: the last one wins, as the engine reads them.
    "spark.sql.mapKeyDedupPolicy": "LAST_WIN",
}

# Settings for a small local session: few shuffle partitions, no UI, modest memory.
_LOCAL_CONF: dict[str, str] = {
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "1g",
    "spark.sql.adaptive.enabled": "true",
    # Tests and small jobs start many short sessions; skip the Hive catalog's start-up cost.
    "spark.sql.catalogImplementation": "in-memory",
}


def spark_session(
    master: str = "local[2]",
    app_name: str = "sowstream",
    extra_conf: Mapping[str, str] | None = None,
    *,
    log_level: str = "WARN",
) -> SparkSession:
    """Get or create a session on ``master`` with the Kafka connector jars (fetched if needed).

    ``extra_conf`` overrides any default here. Settings such as ``spark.jars`` and memory only
    take effect when this call creates the session (and its JVM), not when one already runs.
    """
    from pyspark.sql import SparkSession

    # Python tasks (the log fold, aggregates) must run in an interpreter that has sowstream.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf = {
        **_LOCAL_CONF,
        **SESSION_CONF,
        "spark.jars": ",".join(str(p) for p in connector_jars()),
        "spark.log.level": log_level,
        **(extra_conf or {}),
    }
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    return spark


def spark_submit_args() -> list[str]:
    """The ``spark-submit`` arguments that give a cluster job what ``spark_session`` sets up."""
    args = ["--jars", ",".join(str(p) for p in connector_jars())]
    for key, value in SESSION_CONF.items():
        args += ["--conf", f"{key}={value}"]
    return args
