"""Verified identities against a real engine: entitlements follow the identity a credential
proves, never the one a client claims; unsigned, expired, tampered and replayed credentials are
refused with the reason."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import jwt
import orjson
import pytest
from confluent_kafka import Consumer, Producer
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from sowstream.auth import BearerAuth, HmacAuth
from sowstream.client import Client
from sowstream.errors import CommandFailedError
from sowstream.wire.protocol import Command, Reply
from tests.support.engine import EngineProcesses

pytestmark = pytest.mark.integration

SECRETS = {"alice": "alice-secret", "feed": "feed-secret"}
MAX_AGE_S = 4
ALICE = HmacAuth("alice", SECRETS["alice"])
FEED = HmacAuth("feed", SECRETS["feed"])
ROWS = [{"id": i, "desk": desk} for i, desk in enumerate("aabbb")]


@pytest.fixture(scope="module")
def issuer() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def bearer(issuer: rsa.RSAPrivateKey, sub: str, expires_in: float = 300) -> BearerAuth:
    claims = {"sub": sub, "exp": int(time.time() + expires_in), "iss": "idp"}
    return BearerAuth(jwt.encode(claims, issuer, algorithm="RS256"))


@pytest.fixture(scope="module")
def engine(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory, issuer: rsa.RSAPrivateKey
) -> Iterator[EngineProcesses]:
    work = tmp_path_factory.mktemp("auth")
    pem = work / "idp.pem"
    pem.write_bytes(
        issuer.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    authentication: dict[str, Any] = {
        "required": True,
        "hmac": SECRETS,
        "jwt": {"public_keys": [str(pem)], "issuer": "idp"},
        "max_age_s": MAX_AGE_S,
    }
    procs = EngineProcesses(
        kafka_bootstrap,
        work,
        [{"Name": "orders", "Key": "/id"}],
        engine_extra={"authentication": authentication},
        entitlements={"alice": {"orders": "/desk = 'a'"}, "bob": {"orders": "/desk = 'b'"}},
        publish_entitlements={"bob": {"orders": "/desk = 'b'"}},
        auth=FEED,
    )
    procs.start("w1")
    try:
        procs.wait_ready(["orders"])
        with procs.client() as feed:
            for row in ROWS:
                feed.publish("orders", row, ack=True)
        yield procs
    finally:
        procs.stop_all()


def ids(client: Client) -> list[int]:
    return sorted(row["id"] for row in client.sow_records("orders"))


def test_each_identity_sees_what_its_credential_entitles(
    engine: EngineProcesses, issuer: rsa.RSAPrivateKey
) -> None:
    with engine.client(auth=ALICE) as alice, engine.client(auth=bearer(issuer, "bob")) as bob:
        assert ids(alice) == [0, 1]
        assert ids(bob) == [2, 3, 4]
        sub = alice.sow_and_subscribe("orders")
        snapshot = []
        while (msg := sub.next(timeout=20)) is not None and msg.command != "group_end":
            if msg.command == "sow":
                snapshot.append(msg.json()["id"])
        assert sorted(snapshot) == [0, 1]
        with engine.client() as feed:  # the harness's own identity: feed
            feed.publish("orders", {"id": 10, "desk": "b"}, ack=True)
            feed.publish("orders", {"id": 11, "desk": "a"}, ack=True)
        live = sub.next(timeout=20)
        assert live is not None and live.json() == {"id": 11, "desk": "a"}
        assert sub.next(timeout=2) is None
        sub.close()


def test_claiming_another_identity_is_refused_and_shows_nothing(engine: EngineProcesses) -> None:
    with engine.client(auth=ALICE, identity="bob") as forger:
        with pytest.raises(CommandFailedError) as refused:
            forger.sow_records("orders")
        assert refused.value.reason == "not_entitled"
        assert "'bob' is claimed with a credential of identity 'alice'" in str(refused.value)
        with pytest.raises(CommandFailedError, match="'bob' is claimed"):
            forger.sow_and_subscribe("orders")
        with pytest.raises(CommandFailedError) as publish:
            forger.publish("orders", {"id": 20, "desk": "b"}, ack=True)
        assert publish.value.reason == "not_entitled"


def test_missing_expired_and_tampered_credentials_are_refused(
    engine: EngineProcesses, issuer: rsa.RSAPrivateKey
) -> None:
    with engine.client(auth=None) as anonymous:
        with pytest.raises(CommandFailedError) as unsigned:
            anonymous.sow_records("orders")
        assert unsigned.value.reason == "authentication_failed"
        assert "requires every command" in str(unsigned.value)
    expired = bearer(issuer, "bob", expires_in=-120)
    with engine.client(auth=expired) as late, pytest.raises(CommandFailedError, match="expired"):
        late.sow_records("orders")
    token = bearer(issuer, "bob").token
    assert isinstance(token, str)
    head, _, signature = token.split(".")
    body = jwt.utils.base64url_encode(b'{"sub":"alice","iss":"idp"}').decode()
    with (
        engine.client(auth=BearerAuth(f"{head}.{body}.{signature}")) as tampered,
        pytest.raises(CommandFailedError, match="JWT was refused"),
    ):
        tampered.sow_records("orders")
    wrong = HmacAuth("alice", "guessed")
    with engine.client(auth=wrong) as guesser, pytest.raises(CommandFailedError, match="match"):
        guesser.sow_records("orders")


def test_publish_entitlements_hold_for_the_proven_identity(
    engine: EngineProcesses, issuer: rsa.RSAPrivateKey
) -> None:
    with engine.client(auth=bearer(issuer, "bob")) as bob:
        bob.publish("orders", {"id": 30, "desk": "b"}, ack=True)
        with pytest.raises(CommandFailedError) as refused:
            bob.publish("orders", {"id": 31, "desk": "a"}, ack=True)
        assert refused.value.reason == "entitlement"
        assert 30 in ids(bob)


def test_a_captured_command_replayed_after_its_lifetime_is_refused(
    engine: EngineProcesses,
) -> None:
    """Someone who could read the control topic copies alice's signed command and writes it
    again: within its lifetime it does what alice asked (answered to alice's reply topic),
    after it the engine refuses it."""
    with engine.client(auth=ALICE) as alice:
        assert {0, 1} <= set(ids(alice))
        control = alice.topic_info("orders").control_topic
        captured = read_last(engine.bootstrap, control, alice)
        time.sleep(MAX_AGE_S + 1.5)
        command = Command.decode(captured["value"])
        producer = Producer({"bootstrap.servers": engine.bootstrap})
        producer.produce(
            control,
            value=captured["value"],
            partition=captured["partition"],
            headers=captured["headers"],
        )
        producer.flush(10)
        answer = wait_reply(engine.bootstrap, command.reply_to, command.command_id)
        assert answer.status == "failure" and answer.reason == "authentication_failed"
        assert "more than max_age_s" in (answer.message or "")


def read_last(bootstrap: str, topic: str, client: Client) -> dict[str, Any]:
    """The last command ``client`` wrote to ``topic``, as it is on the wire."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"spy-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    found: dict[str, Any] | None = None
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                if found is not None:
                    return found
                continue
            if msg.error() or msg.value() is None:
                continue
            if Command.decode(msg.value()).reply_to == client._connection.reply_topic:
                found = {
                    "value": msg.value(),
                    "partition": msg.partition(),
                    "headers": msg.headers(),
                }
    finally:
        consumer.close()
    assert found is not None, "the client's command was not on the control topic"
    return found


def wait_reply(bootstrap: str, reply_topic: str, command_id: str) -> Reply:
    """The failure reply to ``command_id`` on ``reply_topic``, read as a spy would."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"spy-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([reply_topic])
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None or msg.error() or msg.value() is None:
                continue
            if "sow.cmd" in dict(msg.headers() or []):
                continue  # a subscription message, not an answer
            reply = Reply.decode(msg.value())
            if reply.command_id == command_id and reply.status == "failure":
                return reply
    finally:
        consumer.close()
    raise AssertionError(f"no failure reply to {command_id} on {reply_topic}")


def test_the_cli_takes_its_credential_from_the_environment(
    engine: EngineProcesses, monkeypatch: pytest.MonkeyPatch
) -> None:
    refused = engine.cli("sow", "orders", "--json")
    assert refused.returncode != 0
    assert "requires every command" in refused.stderr + refused.stdout
    monkeypatch.setenv("SOWSTREAM_HMAC_SECRET", SECRETS["alice"])
    monkeypatch.setenv("SOWSTREAM_IDENTITY", "alice")
    answer = engine.cli("sow", "orders", "--json")
    assert answer.returncode == 0, answer.stderr
    rows = [orjson.loads(line) for line in answer.stdout.splitlines() if line.strip()]
    assert rows and all(row["data"]["desk"] == "a" for row in rows), rows
