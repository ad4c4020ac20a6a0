"""Credentials: what a client puts in a record's ``sow.credential`` header, and how the engine
checks it.

Two kinds, both carried in the header of the Kafka record they authenticate (a command, a
subscription registration or a publish), so the record's value is signed exactly as sent:

- ``HMAC <identity>:<issued_ms>:<signature>``: the signature is HMAC-SHA256, under the identity's
  secret, of the record's topic, key and value and of the identity and issue time
  (:func:`signing_input`). It proves possession of the secret for this one record: a copy of the
  header on another record does not verify, and neither does the record itself once older than
  the lifetime the engine allows.
- ``Bearer <JWT>``: a token from an identity provider (the kind a Kafka SASL/OAUTHBEARER setup
  issues), checked against configured public keys; the identity is one of its claims. A bearer
  token proves nothing about the record it travels with, so clients must not be able to read the
  topics it travels on (see docs/deploy.md for the ACL layout).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sowstream.errors import AuthenticationError

HMAC_SCHEME = "HMAC"
BEARER_SCHEME = "Bearer"
_SIGNING_VERSION = b"sowstream-hmac-v1"


def signing_input(
    identity: str, issued_ms: int, topic: str, key: bytes | None, value: bytes | None
) -> bytes:
    """The bytes an HMAC credential signs: fixed-size digests of the record's key and value
    (absent and empty differ), so no field can bleed into another."""
    return b"\n".join(
        (
            _SIGNING_VERSION,
            identity.encode(),
            str(issued_ms).encode(),
            topic.encode(),
            _digest(key),
            _digest(value),
        )
    )


def _digest(data: bytes | None) -> bytes:
    return b"-" if data is None else hashlib.sha256(data).hexdigest().encode()


def hmac_signature(secret: bytes, message: bytes) -> str:
    """The URL-safe base64 HMAC-SHA256 of ``message`` under ``secret`` (no padding)."""
    mac = hmac.new(secret, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


class Auth(Protocol):
    """What a client uses to authenticate: a credential for each record it writes."""

    def credential(self, topic: str, key: bytes | None, value: bytes | None) -> str:
        """The ``sow.credential`` header value for this record."""


@dataclass(frozen=True)
class HmacAuth:
    """Signs every record with the identity's shared secret (for small setups)."""

    identity: str
    secret: str | bytes

    def credential(self, topic: str, key: bytes | None, value: bytes | None) -> str:
        """``HMAC identity:issued_ms:signature`` over this record, issued now."""
        if ":" in self.identity:
            raise AuthenticationError(f"identity {self.identity!r} may not contain ':'")
        issued = time.time_ns() // 1_000_000
        secret = self.secret.encode() if isinstance(self.secret, str) else self.secret
        signature = hmac_signature(secret, signing_input(self.identity, issued, topic, key, value))
        return f"{HMAC_SCHEME} {self.identity}:{issued}:{signature}"


@dataclass(frozen=True)
class BearerAuth:
    """Sends a token (a JWT) with every record; ``token`` may be a function returning a fresh
    one, called per record, so a client can renew tokens before they expire."""

    token: str | Callable[[], str]

    def credential(self, topic: str, key: bytes | None, value: bytes | None) -> str:
        """``Bearer <token>``."""
        token = self.token() if callable(self.token) else self.token
        return f"{BEARER_SCHEME} {token}"


@dataclass(frozen=True)
class HmacCredential:
    """A parsed ``HMAC`` credential."""

    identity: str
    issued_ms: int
    signature: str


def parse_hmac(text: str) -> HmacCredential:
    """The parts of ``identity:issued_ms:signature`` (AuthenticationError when malformed)."""
    parts = text.split(":")
    if len(parts) != 3 or not parts[0] or not parts[2]:
        raise AuthenticationError(
            "malformed HMAC credential: expected identity:issued_ms:signature"
        )
    try:
        issued = int(parts[1])
    except ValueError:
        raise AuthenticationError(
            f"malformed HMAC credential: issue time {parts[1]!r} is not milliseconds"
        ) from None
    return HmacCredential(parts[0], issued, parts[2])


def split_scheme(credential: str) -> tuple[str, str]:
    """``(scheme, rest)`` of a header value (AuthenticationError for an unknown scheme)."""
    scheme, _, rest = credential.strip().partition(" ")
    if scheme not in (HMAC_SCHEME, BEARER_SCHEME) or not rest:
        raise AuthenticationError(
            f"unknown credential scheme {scheme[:20]!r}: expected 'HMAC ...' or 'Bearer <JWT>'"
        )
    return scheme, rest.strip()
