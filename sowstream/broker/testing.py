"""A real Kafka broker for tests and benchmarks: a given cluster, a container, or local KRaft."""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sowstream.broker.bootstrap import BOOTSTRAP_ENV
from sowstream.broker.local import LocalBroker

log = logging.getLogger("sowstream.broker")


def _docker_answers() -> bool:
    try:
        import docker

        docker.from_env(timeout=3).ping()
    except Exception:  # no daemon, no socket, no permission: all mean "no Docker here"
        return False
    return True


@contextmanager
def _container() -> Iterator[str]:
    from testcontainers.community.kafka import KafkaContainer

    with KafkaContainer().with_kraft() as kafka:
        yield kafka.get_bootstrap_server()


@contextmanager
def kafka_for_tests() -> Iterator[str]:
    """Yield bootstrap servers: ``$SOWSTREAM_BOOTSTRAP``, else testcontainers' Kafka when a
    Docker engine answers, else a local KRaft broker in a temporary directory."""
    env = os.environ.get(BOOTSTRAP_ENV)
    if env:
        log.info("using the Kafka cluster at %s ($%s)", env, BOOTSTRAP_ENV)
        yield env
        return
    if _docker_answers():
        log.info("using a Kafka container (testcontainers)")
        with _container() as bootstrap:
            yield bootstrap
        return
    with tempfile.TemporaryDirectory(prefix="sowstream-kafka-") as home:
        broker = LocalBroker(Path(home))
        bootstrap = broker.start()
        log.info("using a local KRaft broker at %s", bootstrap)
        try:
            yield bootstrap
        finally:
            broker.stop()
