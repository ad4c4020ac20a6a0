"""Shared fixtures: one real Kafka broker for the whole session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap servers of a real broker: $SOWSTREAM_BOOTSTRAP, testcontainers, or local KRaft."""
    from sowstream.broker.testing import kafka_for_tests

    with kafka_for_tests() as bootstrap:
        yield bootstrap
