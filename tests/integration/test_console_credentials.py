"""The console against an engine that requires credentials (engine.authentication): its client
proves itself with the credential of its environment, as the CLI does (SOWSTREAM_TOKEN, or
SOWSTREAM_HMAC_SECRET with SOWSTREAM_IDENTITY), and the engine's entitlements follow the
identity that credential proves. Without one it says so, at start and in every refusal."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from sowstream.auth import HmacAuth
from tests.integration.test_console import ConsoleProcess, http
from tests.support.engine import EngineProcesses

pytestmark = pytest.mark.integration

SECRETS = {"console": "console-secret", "feed": "feed-secret"}
ROWS = [{"id": i, "desk": desk} for i, desk in enumerate("aabbb")]
CREDENTIAL_VARIABLES = ("SOWSTREAM_TOKEN", "SOWSTREAM_HMAC_SECRET", "SOWSTREAM_IDENTITY")


@pytest.fixture(scope="module")
def issuer() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def engine(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory, issuer: rsa.RSAPrivateKey
) -> Iterator[EngineProcesses]:
    work = tmp_path_factory.mktemp("console-auth")
    pem = work / "idp.pem"
    pem.write_bytes(
        issuer.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    procs = EngineProcesses(
        kafka_bootstrap,
        work,
        [{"Name": "orders", "Key": "/id"}],
        engine_extra={
            "authentication": {
                "required": True,
                "hmac": SECRETS,
                "jwt": {"public_keys": [str(pem)], "issuer": "idp"},
            }
        },
        entitlements={"console": {"orders": "/desk = 'a'"}, "bob": {"orders": "/desk = 'b'"}},
        auth=HmacAuth("feed", SECRETS["feed"]),
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


def environment(**credential: str) -> dict[str, str]:
    """The test's environment without any credential of its own, plus ``credential``."""
    env = {k: v for k, v in os.environ.items() if k not in CREDENTIAL_VARIABLES}
    return {**env, **credential}


@pytest.fixture
def started(engine: EngineProcesses, tmp_path: Path) -> Iterator[list[ConsoleProcess]]:
    consoles: list[ConsoleProcess] = []
    yield consoles
    for console in consoles:
        console.stop()


def start(
    engine: EngineProcesses, tmp_path: Path, started: list[ConsoleProcess], **credential: str
) -> ConsoleProcess:
    console = ConsoleProcess(engine, tmp_path, env=environment(**credential))
    started.append(console)
    return console


def query(console: ConsoleProcess) -> tuple[int, dict[str, Any]]:
    status, body, _ = http(f"{console.url}/api/query", {"topic": "orders"})
    return status, body


def test_a_console_without_a_credential_says_so(
    engine: EngineProcesses, tmp_path: Path, started: list[ConsoleProcess]
) -> None:
    console = start(engine, tmp_path, started)
    status, body = query(console)
    assert status == 400 and body["reason"] == "authentication_failed", body
    assert "no credential" in body["error"]  # the engine's own reason ...
    assert "SOWSTREAM_TOKEN" in body["error"] and "SOWSTREAM_HMAC_SECRET" in body["error"]
    assert body["credential"].startswith("no engine credential")
    _, session, _ = http(f"{console.url}/api/session")
    assert session["engine_credential"].startswith("no engine credential")
    status, fleet, _ = http(f"{console.url}/api/fleet")
    assert status == 503 and "SOWSTREAM_TOKEN" in fleet["error"], fleet
    assert "no engine credential" in console.log.read_text()


def test_a_console_with_an_hmac_secret_acts_as_its_identity(
    engine: EngineProcesses, tmp_path: Path, started: list[ConsoleProcess]
) -> None:
    console = start(
        engine,
        tmp_path,
        started,
        SOWSTREAM_HMAC_SECRET=SECRETS["console"],
        SOWSTREAM_IDENTITY="console",
    )
    status, body = query(console)
    assert status == 200, body
    assert sorted(row["id"] for row in body["rows"]) == [0, 1]  # console's entitlement: desk a
    _, session, _ = http(f"{console.url}/api/session")
    assert "HMAC for identity 'console'" in session["engine_credential"]
    status, fleet, _ = http(f"{console.url}/api/fleet")
    assert status == 200 and fleet["rows"], fleet
    assert "engine credential: HMAC for identity 'console'" in console.log.read_text()


def test_a_console_with_a_token_acts_as_its_subject(
    engine: EngineProcesses,
    tmp_path: Path,
    started: list[ConsoleProcess],
    issuer: rsa.RSAPrivateKey,
) -> None:
    token = jwt.encode(
        {"sub": "bob", "exp": int(time.time() + 300), "iss": "idp"}, issuer, algorithm="RS256"
    )
    console = start(engine, tmp_path, started, SOWSTREAM_TOKEN=token)
    status, body = query(console)
    assert status == 200, body
    assert sorted(row["id"] for row in body["rows"]) == [2, 3, 4]  # bob's entitlement: desk b


def test_a_console_with_a_secret_the_engine_does_not_hold_is_told_the_credential_failed(
    engine: EngineProcesses, tmp_path: Path, started: list[ConsoleProcess]
) -> None:
    console = start(
        engine, tmp_path, started, SOWSTREAM_HMAC_SECRET="wrong", SOWSTREAM_IDENTITY="console"
    )
    status, body = query(console)
    assert status == 400 and body["reason"] == "authentication_failed", body
    assert "HMAC for identity 'console'" in body["credential"]
    assert "SOWSTREAM_TOKEN" not in body["error"]  # it has one; the engine refused it
