"""Shared fixtures: one real Kafka broker for the whole session; the slow files first."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

# The files that take longest (seconds summed over their tests, setup and teardown included, in a
# `make test` run on two cores), longest first. `make test` runs the suite with
# `-n 2 --dist loadfile --no-loadscope-reorder`: each xdist process takes the next whole file
# when it is nearly out of work, in collection order, so the wall time is bounded by whichever
# process draws the long files last. Starting them first (longest-processing-time first) leaves
# the many short files to even out the two processes at the end. (Without
# --no-loadscope-reorder, xdist orders files by their number of tests, which puts one-test
# files such as test_chaos.py last, and this order only breaks its ties.) A file missing here
# only runs later; a stale figure only changes the order.
SLOW_FILES: dict[str, int] = {
    "tests/spark/test_pipeline.py": 222,
    "tests/integration/test_queues.py": 154,
    "tests/integration/test_chaos.py": 135,
    "tests/integration/test_reply_delivery.py": 131,
    "tests/integration/test_queue_failover.py": 121,
    "tests/integration/test_subscriptions.py": 108,
    "tests/integration/test_history.py": 99,
    "tests/integration/test_recovery.py": 96,
    "tests/integration/test_conflated_topics.py": 84,
    "tests/integration/test_queue_details.py": 82,
    "tests/integration/test_queue_workers.py": 81,
    "tests/integration/test_broker_faults.py": 78,
    "tests/integration/test_sow_engine.py": 76,
    "tests/integration/test_subscription_failover.py": 76,
    "tests/integration/test_log_recovery.py": 70,
    "tests/integration/test_message_types.py": 60,
    "tests/integration/test_fleet.py": 59,
    "tests/integration/test_conflation.py": 56,
    "tests/spark/test_columns.py": 48,
    "tests/integration/test_broker.py": 47,
    "tests/integration/test_cluster_status.py": 47,
    "tests/integration/test_secured_cluster.py": 45,
    "tests/integration/test_queue_recovery.py": 44,
    "tests/integration/test_rebalance_commands.py": 43,
    "tests/integration/test_queue_views.py": 42,
    "tests/integration/test_conflated_sources.py": 41,
    "tests/integration/test_undeclared_topics.py": 40,
    "tests/integration/test_pattern_topics.py": 38,
    "tests/integration/test_worker_processes.py": 38,
    "tests/integration/test_views.py": 33,
    "tests/integration/test_queue_cli.py": 32,
    "tests/integration/test_status_restore.py": 31,
    "tests/integration/test_enrichment.py": 29,
    "tests/integration/test_memo_indexes.py": 27,
    "tests/integration/test_view_joins.py": 26,
    "tests/integration/test_authentication.py": 25,
    "tests/spark/test_enrichment_fold.py": 24,
    "tests/integration/test_console.py": 24,
    "tests/integration/test_restore_engine.py": 23,
    "tests/unit/test_kafka_logs.py": 22,
    "tests/integration/test_bad_input_engine.py": 21,
    "tests/integration/test_aggregated_subscriptions.py": 20,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order whole files by their cost in SLOW_FILES, longest first, the others after them in
    collection order; the tests of a file keep their order (and stay together)."""

    def cost(item: pytest.Item) -> int:
        return -SLOW_FILES.get(item.nodeid.split("::", 1)[0], 0)

    items.sort(key=cost)  # stable: equal costs keep their collection order


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap servers of a real broker: $SOWSTREAM_BOOTSTRAP, testcontainers, or local KRaft."""
    from sowstream.broker.testing import kafka_for_tests

    with kafka_for_tests() as bootstrap:
        yield bootstrap
