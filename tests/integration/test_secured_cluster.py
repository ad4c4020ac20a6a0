"""A Kafka cluster that requires SASL: the engine and the client take the same settings."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Consumer, KafkaError
from confluent_kafka.admin import AdminClient

from sowstream.broker.acls import client_acls
from sowstream.broker.local import LocalBroker
from sowstream.client import Client
from sowstream.errors import SowstreamError
from sowstream.wire.topics import TopicNames
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


# -- the ACL layout of docs/deploy.md: clients kept apart on a shared cluster -------------------

PRINCIPALS = {"alice": "alice-secret", "bob": "bob-secret"}


def sasl(user: str) -> dict[str, str]:
    return {**SASL, "sasl.username": user, "sasl.password": PRINCIPALS[user]}


@pytest.fixture(scope="module")
def acl_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    broker = LocalBroker(tmp_path_factory.mktemp("acl-kafka"), sasl_users=PRINCIPALS, acls=True)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def read_denied(bootstrap: str, user: str, topic: str) -> str:
    """What Kafka answers principal ``user`` trying to read ``topic`` (its error's name)."""
    consumer = Consumer(
        {
            **sasl(user),
            "bootstrap.servers": bootstrap,
            "group.id": f"{user}-spy",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            error = msg.error()
            if error is not None and error.code() != KafkaError._PARTITION_EOF:
                return str(error.name())
            if error is None:
                return f"read a record of {topic}"
        return "nothing"
    finally:
        consumer.close()


def test_clients_cannot_read_each_others_replies_or_the_commands_they_send(
    acl_cluster: LocalBroker, tmp_path: Path
) -> None:
    """The engine runs as a super user; alice and bob only have client_acls. Each works through
    the engine; neither can read the other's reply topic, nor the control and registry topics
    where the other's commands, registrations and credentials travel."""
    admin_bootstrap = acl_cluster.bootstrap
    secured = acl_cluster.sasl_bootstrap
    assert admin_bootstrap is not None and secured is not None
    engine = EngineProcesses(admin_bootstrap, tmp_path, [{"Name": "orders", "Key": "/id"}])
    admin = AdminClient({"bootstrap.servers": admin_bootstrap})
    for user in PRINCIPALS:
        for result in admin.create_acls(client_acls(engine.prefix, user)).values():
            result.result(30)
    engine.start("w1")
    try:
        engine.wait_ready(["orders"])
        opts = {"prefix": engine.prefix, "timeout": 20.0}
        with (
            Client(secured, name="alice-app", config=sasl("alice"), **opts) as alice,
            Client(secured, name="bob-app", config=sasl("bob"), **opts) as bob,
        ):
            alice.publish("orders", {"id": 1, "owner": "alice"}, ack=True)
            sub = alice.sow_and_subscribe("orders")
            assert [r["id"] for r in bob.sow_records("orders")] == [1]
            bob.publish("orders", {"id": 2, "owner": "bob"}, ack=True)
            messages = list(iter(lambda: sub.next(timeout=10), None))
            seen = [m.json()["id"] for m in messages if m.command in ("sow", "publish")]
            assert 2 in seen  # alice's subscription works through her own reply topic
            info = alice.topic_info("orders")
            names = TopicNames(engine.prefix)
            for topic in (alice._connection.reply_topic, info.control_topic, names.subscriptions):
                assert read_denied(secured, "bob", topic) == "TOPIC_AUTHORIZATION_FAILED", topic
            assert read_denied(secured, "alice", names.subscriptions) == (
                "TOPIC_AUTHORIZATION_FAILED"
            )
            # a client cannot create a reply topic in another principal's name either
            with pytest.raises(SowstreamError):
                Client(secured, name="alice-fake", config=sasl("bob"), **opts).connect()
    finally:
        engine.stop_all()
