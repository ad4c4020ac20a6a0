"""A Kafka cluster that requires SASL: the engine and the client take the same settings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from sowstream.broker.local import LocalBroker
from sowstream.client import Client
from sowstream.errors import SowstreamError
from tests.support.engine import EngineProcesses

pytestmark = pytest.mark.integration

USERS = {"alice": "alice-secret"}
SASL = {
    "security.protocol": "SASL_PLAINTEXT",
    "sasl.mechanism": "PLAIN",
    "sasl.username": "alice",
    "sasl.password": "alice-secret",
}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    broker = LocalBroker(tmp_path_factory.mktemp("sasl-kafka"), sasl_users=USERS)
    broker.start()
    try:
        assert broker.sasl_bootstrap is not None
        yield broker.sasl_bootstrap
    finally:
        broker.stop()


def test_engine_and_client_work_over_sasl(
    secured: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = EngineProcesses(secured, tmp_path, [{"Name": "orders", "Key": "/id"}], kafka=SASL)
    # The worker reads its password from the environment, as a pod gets it from a Secret.
    config = yaml.safe_load(engine.config.read_text())
    config["engine"]["kafka"]["sasl.password"] = "${SOWSTREAM_TEST_SASL_PASSWORD}"
    engine.config.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("SOWSTREAM_TEST_SASL_PASSWORD", SASL["sasl.password"])
    engine.start("w1")
    try:
        engine.wait_ready(["orders"])
        with engine.client() as client:
            client.publish("orders", {"id": 1, "qty": 5})
            client.delta_publish("orders", {"id": 1, "qty": 6}, ack=True)
            assert client.sow_records("orders") == [{"id": 1, "qty": 6}]
    finally:
        engine.stop_all()


def test_wrong_credentials_are_a_clear_error(secured: str) -> None:
    bad = {**SASL, "sasl.password": "wrong"}
    with pytest.raises(SowstreamError, match="cannot reach Kafka"):
        Client(secured, config=bad, timeout=10).connect()
