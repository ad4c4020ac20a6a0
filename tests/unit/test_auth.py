"""Credentials: HMAC signatures over the record they travel with, JWTs against configured keys,
and the identity the engine then acts on."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import jwt
import orjson
import pytest
import typer
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from sowstream.auth import AuthenticationSettings, Authenticator, BearerAuth, HmacAuth
from sowstream.cli.common import client_auth
from sowstream.config import ConfigError, load_config_text
from sowstream.engine.processor import TopicProcessor
from sowstream.errors import AuthenticationError
from sowstream.sow.compiled import compile_topic
from sowstream.sow.keys import generated_sow_key
from sowstream.sow.ops import RawRecord
from sowstream.wire import headers as h
from sowstream.wire.avro import decode
from sowstream.wire.topics import TopicNames
from tests.support.sender import RecordingSender

TOPIC = "p.ctl.orders"
VALUE = b'{"command":"sow"}'


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def hmac_engine(required: bool = False, max_age_s: float = 60.0) -> Authenticator:
    settings = AuthenticationSettings(
        required=required, hmac={"alice": "alice-secret", "bob": "bob-secret"}, max_age_s=max_age_s
    )
    return Authenticator(settings)


def test_an_hmac_credential_proves_its_identity_for_its_own_record() -> None:
    cred = HmacAuth("alice", "alice-secret").credential(TOPIC, b"k", VALUE)
    assert hmac_engine().identify(cred, "", TOPIC, b"k", VALUE, now_ms()) == "alice"
    assert hmac_engine().identify(cred, "alice", TOPIC, b"k", VALUE, now_ms()) == "alice"


@pytest.mark.parametrize(
    ("topic", "key", "value"),
    [
        ("p.ctl.other", b"k", VALUE),  # copied onto a record of another topic
        (TOPIC, b"k2", VALUE),  # another key
        (TOPIC, None, VALUE),  # no key where one was signed
        (TOPIC, b"k", b'{"command":"sow","filter":"1=1"}'),  # the command altered
        (TOPIC, b"k", None),  # a tombstone
    ],
)
def test_an_hmac_credential_does_not_verify_another_record(
    topic: str, key: bytes | None, value: bytes | None
) -> None:
    cred = HmacAuth("alice", "alice-secret").credential(TOPIC, b"k", VALUE)
    with pytest.raises(AuthenticationError, match="does not match this record"):
        hmac_engine().identify(cred, "", topic, key, value, now_ms())


def test_a_wrong_secret_is_refused() -> None:
    cred = HmacAuth("alice", "guessed").credential(TOPIC, None, VALUE)
    with pytest.raises(AuthenticationError, match="does not match"):
        hmac_engine().identify(cred, "", TOPIC, None, VALUE, now_ms())


def test_a_record_replayed_after_its_lifetime_is_refused() -> None:
    cred = HmacAuth("alice", "alice-secret").credential(TOPIC, None, VALUE)
    engine = hmac_engine(max_age_s=2)
    assert engine.identify(cred, "", TOPIC, None, VALUE, now_ms() + 1_000) == "alice"
    with pytest.raises(AuthenticationError, match="more than max_age_s"):
        engine.identify(cred, "", TOPIC, None, VALUE, now_ms() + 5_000)
    with pytest.raises(AuthenticationError, match="in the future"):
        engine.identify(cred, "", TOPIC, None, VALUE, now_ms() - 5_000)


def test_claiming_another_identity_is_not_entitled() -> None:
    cred = HmacAuth("alice", "alice-secret").credential(TOPIC, None, VALUE)
    with pytest.raises(AuthenticationError, match="'bob' is claimed") as err:
        hmac_engine().identify(cred, "bob", TOPIC, None, VALUE, now_ms())
    assert err.value.reason == "not_entitled"


def test_without_a_credential() -> None:
    assert hmac_engine().identify(None, "", TOPIC, None, VALUE, now_ms()) == ""
    with pytest.raises(AuthenticationError, match="claimed without a credential") as err:
        hmac_engine().identify(None, "bob", TOPIC, None, VALUE, now_ms())
    assert err.value.reason == "not_entitled"
    with pytest.raises(AuthenticationError, match="requires every command") as err:
        hmac_engine(required=True).identify(None, "", TOPIC, None, VALUE, now_ms())
    assert err.value.reason == "authentication_failed"


def test_without_authentication_configured_the_identity_is_asserted() -> None:
    engine = Authenticator(AuthenticationSettings())
    assert not engine.enabled
    assert engine.identify(None, "bob", TOPIC, None, VALUE, now_ms()) == "bob"


@pytest.mark.parametrize(
    ("credential", "problem"),
    [
        ("Basic abc", "unknown credential scheme"),
        ("HMAC", "unknown credential scheme"),
        ("HMAC alice:x", "malformed HMAC credential"),
        ("HMAC alice:soon:sig", "is not milliseconds"),
        ("HMAC carol:1:sig", "no HMAC secret is configured for identity 'carol'"),
        ("Bearer abc", "takes no JWTs"),
    ],
)
def test_malformed_credentials_are_refused_with_the_reason(credential: str, problem: str) -> None:
    with pytest.raises(AuthenticationError, match=problem):
        hmac_engine().identify(credential, "", TOPIC, None, VALUE, now_ms())


# -- JWTs --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def public_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def token(key: rsa.RSAPrivateKey, **claims: Any) -> str:
    body = {"sub": "bob", "exp": int(time.time()) + 300, **claims}
    return jwt.encode(body, key, algorithm="RS256", headers={"kid": "k1"})


def jwt_engine(tmp_path: Path, key: rsa.RSAPrivateKey, **jwt_settings: Any) -> Authenticator:
    pem = tmp_path / "issuer.pem"
    pem.write_bytes(public_pem(key))
    settings = AuthenticationSettings(jwt={"public_keys": (str(pem),), **jwt_settings})
    return Authenticator(settings)


def test_a_jwt_proves_its_subject(tmp_path: Path, rsa_key: rsa.RSAPrivateKey) -> None:
    engine = jwt_engine(tmp_path, rsa_key)
    cred = BearerAuth(token(rsa_key)).credential(TOPIC, None, VALUE)
    assert engine.identify(cred, "", TOPIC, None, VALUE, now_ms()) == "bob"
    with pytest.raises(AuthenticationError, match="'alice' is claimed"):
        engine.identify(cred, "alice", TOPIC, None, VALUE, now_ms())


def test_a_jwt_with_another_claim_as_identity(tmp_path: Path, rsa_key: rsa.RSAPrivateKey) -> None:
    engine = jwt_engine(tmp_path, rsa_key, identity_claim="desk")
    cred = BearerAuth(lambda: token(rsa_key, desk="rates")).credential(TOPIC, None, VALUE)
    assert engine.identify(cred, "", TOPIC, None, VALUE, now_ms()) == "rates"
    bare = BearerAuth(token(rsa_key)).credential(TOPIC, None, VALUE)
    with pytest.raises(AuthenticationError, match="no 'desk' claim"):
        engine.identify(bare, "", TOPIC, None, VALUE, now_ms())


def test_an_expired_jwt_is_refused(tmp_path: Path, rsa_key: rsa.RSAPrivateKey) -> None:
    engine = jwt_engine(tmp_path, rsa_key, leeway_s=0)
    cred = BearerAuth(token(rsa_key, exp=int(time.time()) - 60)).credential(TOPIC, None, VALUE)
    with pytest.raises(AuthenticationError, match="expired"):
        engine.identify(cred, "", TOPIC, None, VALUE, now_ms())
    # ... but a registration written while it was valid still holds when read again later
    assert engine.identify(cred, "", TOPIC, None, VALUE, now_ms() - 120_000) == "bob"


def test_a_tampered_or_foreign_jwt_is_refused(tmp_path: Path, rsa_key: rsa.RSAPrivateKey) -> None:
    engine = jwt_engine(tmp_path, rsa_key)
    head, _body, signature = token(rsa_key).split(".")
    forged_body = jwt.utils.base64url_encode(json.dumps({"sub": "alice"}).encode()).decode()
    forged = f"Bearer {head}.{forged_body}.{signature}"
    with pytest.raises(AuthenticationError, match="refused"):
        engine.identify(forged, "", TOPIC, None, VALUE, now_ms())
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with pytest.raises(AuthenticationError, match="no configured key verifies it"):
        engine.identify(f"Bearer {token(other)}", "", TOPIC, None, VALUE, now_ms())
    with pytest.raises(AuthenticationError, match="refused"):
        engine.identify("Bearer not.a.jwt", "", TOPIC, None, VALUE, now_ms())


def test_issuer_and_audience_are_checked(tmp_path: Path, rsa_key: rsa.RSAPrivateKey) -> None:
    engine = jwt_engine(tmp_path, rsa_key, issuer="idp", audience="sowstream")
    good = token(rsa_key, iss="idp", aud="sowstream")
    assert engine.identify(f"Bearer {good}", "", TOPIC, None, VALUE, now_ms()) == "bob"
    for bad in (token(rsa_key, iss="other", aud="sowstream"), token(rsa_key, iss="idp")):
        with pytest.raises(AuthenticationError, match="refused"):
            engine.identify(f"Bearer {bad}", "", TOPIC, None, VALUE, now_ms())


def test_a_jwks_file(tmp_path: Path, rsa_key: rsa.RSAPrivateKey) -> None:
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(rsa_key.public_key()))
    (tmp_path / "keys.json").write_text(
        json.dumps({"keys": [{**jwk, "kid": "k1", "alg": "RS256"}]})
    )
    settings = AuthenticationSettings(jwt={"jwks_file": str(tmp_path / "keys.json")})
    engine = Authenticator(settings)
    assert engine.identify(f"Bearer {token(rsa_key)}", "", TOPIC, None, VALUE, now_ms()) == "bob"


# -- settings ----------------------------------------------------------------------------------


def test_secrets_come_from_the_environment() -> None:
    settings = AuthenticationSettings(hmac={"alice": "${ALICE_SECRET}"})
    engine = Authenticator(settings, environ={"ALICE_SECRET": "s3"})
    cred = HmacAuth("alice", "s3").credential(TOPIC, None, VALUE)
    assert engine.identify(cred, "", TOPIC, None, VALUE, now_ms()) == "alice"
    with pytest.raises(ValueError, match=r"hmac\.alice: environment variable ALICE_SECRET"):
        Authenticator(settings, environ={})


def test_unreadable_key_files_name_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="public_keys: cannot read"):
        Authenticator(AuthenticationSettings(jwt={"public_keys": (str(tmp_path / "no.pem"),)}))
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="jwks_file"):
        Authenticator(AuthenticationSettings(jwt={"jwks_file": str(tmp_path / "bad.json")}))


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ("required: true", "required: true needs hmac identities or jwt keys"),
        ("jwt: {algorithms: [RS256]}", "jwt needs public_keys"),
        ("hmac: {'a:b': s}", "without ':'"),
        ("max_age_s: 0", "max_age_s must be positive"),
        ("hmac: {alice: s}\n    unknown: 1", "unknown"),
    ],
)
def test_bad_authentication_settings_are_config_errors(section: str, problem: str) -> None:
    text = f"engine:\n  authentication:\n    {section}\nsow:\n  - Name: t\n    Key: /id\n"
    with pytest.raises(ConfigError, match=problem):
        load_config_text(text)


# -- publishes through the apply stage ---------------------------------------------------------


def test_publishes_act_as_the_identity_their_credential_proves() -> None:
    """bob may publish only desk 'b'; a publish claiming bob with alice's credential, a tampered
    one and an unsigned one all go to the dead letters with the reason, the rest is stored."""
    config = load_config_text(
        "engine:\n  authentication:\n    required: true\n"
        "    hmac: {alice: alice-secret, bob: bob-secret}\n"
        "sow:\n  - {Name: orders, Key: /id, Partitions: 1}\n"
        "publish_entitlements:\n  bob: {orders: \"/desk = 'b'\"}\n"
    )
    topic = config.topics[0]
    names = TopicNames("p")
    sender = RecordingSender()
    proc = TopicProcessor(compile_topic(topic), names, sender)
    proc.applier.authenticator = Authenticator(config.engine.authentication)
    log_topic = names.log("orders")

    def record(
        offset: int, body: dict[str, Any], auth: HmacAuth | None, **headers: str
    ) -> RawRecord:
        value = orjson.dumps(body)
        key = sow_key(body["id"]).encode()  # as clients key the log: by SowKey
        if auth is not None:
            headers[h.CREDENTIAL] = auth.credential(log_topic, key, value)
        return RawRecord(0, offset, now_ms(), key, value, headers)

    def sow_key(i: int) -> str:
        return generated_sow_key("orders", "orders", ["/id"], {"id": i})

    alice, bob = HmacAuth("alice", "alice-secret"), HmacAuth("bob", "bob-secret")
    tampered = record(4, {"id": 4, "desk": "b"}, bob)
    tampered.value = b'{"id":4,"desk":"a"}'

    async def go() -> None:
        await proc.ready(0)
        await proc.process(
            [
                record(1, {"id": 1, "desk": "a"}, alice),
                record(2, {"id": 2, "desk": "b"}, bob),
                record(3, {"id": 3, "desk": "b"}, alice, **{h.IDENTITY: "bob"}),
                tampered,
                record(5, {"id": 5, "desk": "a"}, bob),
                record(6, {"id": 6, "desk": "a"}, None),
            ]
        )
        await proc.drain()

    asyncio.run(go())
    stored = {i for i in range(1, 7) if proc.table.current_record(0, sow_key(i))}
    assert stored == {1, 2}
    dead = [decode("DeadLetter", r.value) for r in sender.records if r.topic == names.dead_letter]
    reasons = {orjson.loads(d["value"])["id"]: (d["reason"], d["error"]) for d in dead}
    assert reasons[3][0] == "not_entitled" and "'bob' is claimed" in reasons[3][1]
    assert reasons[4][0] == "authentication_failed" and "does not match" in reasons[4][1]
    assert reasons[5][0] == "entitlement" and "'bob' may not publish" in reasons[5][1]
    assert reasons[6][0] == "authentication_failed" and "requires every" in reasons[6][1]
    assert sorted(reasons) == [3, 4, 5, 6]


def test_the_cli_reads_credentials_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SOWSTREAM_TOKEN", "SOWSTREAM_HMAC_SECRET", "SOWSTREAM_IDENTITY"):
        monkeypatch.delenv(name, raising=False)
    assert client_auth() is None
    monkeypatch.setenv("SOWSTREAM_HMAC_SECRET", "s")
    with pytest.raises(typer.BadParameter, match="needs --identity or SOWSTREAM_IDENTITY"):
        client_auth()
    assert client_auth("alice") == HmacAuth("alice", "s")
    monkeypatch.setenv("SOWSTREAM_TOKEN", "t")
    assert client_auth("alice") == BearerAuth("t")
