"""The engine's side: settings (``engine.authentication``) and the check that turns a record's
credential into the identity entitlements apply to."""

from __future__ import annotations

import hmac
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jwt
from pydantic import BaseModel, ConfigDict, model_validator

from sowstream.auth.credentials import (
    BEARER_SCHEME,
    hmac_signature,
    parse_hmac,
    signing_input,
    split_scheme,
)
from sowstream.errors import AuthenticationError

NOT_ENTITLED = "not_entitled"
_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_TOKEN_CACHE = 10_000  # verified tokens kept, so a token is checked against its keys once


class _Closed(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class JwtSettings(_Closed):
    """Where the keys that sign accepted JWTs are, and what a token must say."""

    public_keys: tuple[str, ...] = ()  # PEM files of public keys (or HMAC secrets for HS256)
    jwks_file: str | None = None  # a JSON Web Key Set file; tokens pick their key by ``kid``
    algorithms: tuple[str, ...] = ("RS256", "ES256", "EdDSA")
    identity_claim: str = "sub"
    issuer: str | None = None
    audience: str | None = None
    leeway_s: float = 30.0

    @model_validator(mode="after")
    def _has_keys(self) -> JwtSettings:
        if not self.public_keys and self.jwks_file is None:
            raise ValueError("jwt needs public_keys (PEM files) or a jwks_file")
        return self


class AuthenticationSettings(_Closed):
    """``engine.authentication``: which credentials the engine accepts, and whether it requires
    one. Unset (no ``hmac``, no ``jwt``), identities are asserted by clients, as before."""

    required: bool = False
    hmac: dict[str, str] = {}  # identity -> shared secret; ``${NAME}`` reads the environment
    jwt: JwtSettings | None = None
    max_age_s: float = 60.0  # an HMAC-signed record is refused once this much older than issued

    @model_validator(mode="after")
    def _usable(self) -> AuthenticationSettings:
        if self.required and not self.enabled:
            raise ValueError("required: true needs hmac identities or jwt keys to check against")
        for identity in self.hmac:
            if not identity or ":" in identity:
                raise ValueError(f"hmac: identity {identity!r} must be non-empty, without ':'")
        if self.max_age_s <= 0:
            raise ValueError(f"max_age_s must be positive, got {self.max_age_s}")
        return self

    @property
    def enabled(self) -> bool:
        """Whether any credential is checked at all."""
        return bool(self.hmac) or self.jwt is not None


def resolve_secret(text: str, environ: Mapping[str, str] | None = None) -> str:
    """``text`` with every ``${NAME}`` replaced from the environment (ValueError naming it)."""
    env = os.environ if environ is None else environ

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in env:
            raise ValueError(f"environment variable {name} is not set")
        return env[name]

    return _ENV_REFERENCE.sub(value, text)


class Authenticator:
    """Checks credentials against ``settings``; one per worker, shared by every stage."""

    def __init__(
        self, settings: AuthenticationSettings, environ: Mapping[str, str] | None = None
    ) -> None:
        """Reads secrets and key files now, so a bad setting fails the start (ValueError
        naming the setting)."""
        self.settings = settings
        self.enabled = settings.enabled
        self._secrets: dict[str, bytes] = {}
        for identity, secret in settings.hmac.items():
            try:
                self._secrets[identity] = resolve_secret(secret, environ).encode()
            except ValueError as exc:
                raise ValueError(f"engine.authentication.hmac.{identity}: {exc}") from None
        self._keys: list[Any] = []
        self._jwks: jwt.PyJWKSet | None = None
        if settings.jwt is not None:
            for path in settings.jwt.public_keys:
                try:
                    self._keys.append(Path(path).read_bytes())
                except OSError as exc:
                    raise ValueError(
                        f"engine.authentication.jwt.public_keys: cannot read {path}: {exc}"
                    ) from None
            if settings.jwt.jwks_file is not None:
                try:
                    self._jwks = jwt.PyJWKSet.from_json(Path(settings.jwt.jwks_file).read_text())
                except (OSError, jwt.PyJWTError, ValueError) as exc:
                    raise ValueError(
                        f"engine.authentication.jwt.jwks_file {settings.jwt.jwks_file}: {exc}"
                    ) from None
        self._verified: dict[str, dict[str, Any]] = {}

    def identify(
        self,
        credential: str | None,
        claimed: str,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        at_ms: int,
    ) -> str:
        """The identity a record written at ``at_ms`` acts as (AuthenticationError saying why
        not). Without authentication configured, the ``claimed`` identity; with it, the
        credential's identity, which must equal ``claimed`` when one is claimed; a record
        without a credential is anonymous ("") unless credentials are required."""
        if not self.enabled:
            return claimed
        if not credential:
            if self.settings.required:
                raise AuthenticationError(
                    "no credential: this engine requires every command and publish to carry "
                    "one (header sow.credential)"
                )
            if claimed:
                raise AuthenticationError(
                    f"identity {claimed!r} is claimed without a credential", reason=NOT_ENTITLED
                )
            return ""
        scheme, rest = split_scheme(credential)
        if scheme == BEARER_SCHEME:
            identity = self._jwt_identity(rest, at_ms)
        else:
            identity = self._hmac_identity(rest, topic, key, value, at_ms)
        if claimed and claimed != identity:
            raise AuthenticationError(
                f"identity {claimed!r} is claimed with a credential of identity {identity!r}",
                reason=NOT_ENTITLED,
            )
        return identity

    def _hmac_identity(
        self, text: str, topic: str, key: bytes | None, value: bytes | None, at_ms: int
    ) -> str:
        cred = parse_hmac(text)
        secret = self._secrets.get(cred.identity)
        if secret is None:
            raise AuthenticationError(
                f"no HMAC secret is configured for identity {cred.identity!r}"
            )
        wanted = hmac_signature(
            secret, signing_input(cred.identity, cred.issued_ms, topic, key, value)
        )
        if not hmac.compare_digest(wanted, cred.signature):
            raise AuthenticationError(
                f"the HMAC signature of identity {cred.identity!r} does not match this record "
                "(wrong secret, or the record was altered)"
            )
        age_ms = at_ms - cred.issued_ms
        limit_ms = self.settings.max_age_s * 1000
        if age_ms > limit_ms:
            raise AuthenticationError(
                f"the credential of identity {cred.identity!r} was issued {age_ms / 1000:.1f} s "
                f"before the record was handled, more than max_age_s ({self.settings.max_age_s:g})"
            )
        if age_ms < -limit_ms:
            raise AuthenticationError(
                f"the credential of identity {cred.identity!r} is issued in the future "
                f"({-age_ms / 1000:.1f} s): check the client's clock"
            )
        return cred.identity

    def _jwt_identity(self, token: str, at_ms: int) -> str:
        settings = self.settings.jwt
        if settings is None:
            raise AuthenticationError("this engine takes no JWTs (engine.authentication.jwt)")
        claims = self._verified.get(token)
        if claims is None:
            claims = self._verify_signature(token, settings)
            if len(self._verified) >= _TOKEN_CACHE:
                self._verified.pop(next(iter(self._verified)))
            self._verified[token] = claims
        now = at_ms / 1000
        exp, nbf = claims.get("exp"), claims.get("nbf")
        if isinstance(exp, int | float) and now > exp + settings.leeway_s:
            raise AuthenticationError(f"the JWT expired {now - exp:.0f} s before the record")
        if isinstance(nbf, int | float) and now < nbf - settings.leeway_s:
            raise AuthenticationError("the JWT is not valid yet (nbf)")
        identity = claims.get(settings.identity_claim)
        if not isinstance(identity, str) or not identity:
            raise AuthenticationError(
                f"the JWT has no {settings.identity_claim!r} claim to take the identity from"
            )
        return identity

    def _verify_signature(self, token: str, settings: JwtSettings) -> dict[str, Any]:
        """The token's claims once its signature, issuer and audience check out (expiry is
        checked per record, against the time the record was written)."""
        options = {
            "verify_exp": False,
            "verify_nbf": False,
            "verify_aud": settings.audience is not None,
        }
        keys: list[Any] = list(self._keys)
        if self._jwks is not None:
            try:
                kid = jwt.get_unverified_header(token).get("kid")
            except jwt.PyJWTError as exc:
                raise AuthenticationError(f"malformed JWT: {exc}") from None
            keys += [k.key for k in self._jwks.keys if kid is None or k.key_id == kid]
        problem = "no configured key verifies it"
        for candidate in keys:
            try:
                claims: dict[str, Any] = jwt.decode(
                    token,
                    candidate,
                    algorithms=list(settings.algorithms),
                    audience=settings.audience,
                    issuer=settings.issuer,
                    options=options,  # type: ignore[arg-type]
                )
                return claims
            except jwt.InvalidSignatureError:
                continue
            except jwt.PyJWTError as exc:
                problem = str(exc)
                if not isinstance(exc, jwt.InvalidKeyError | jwt.InvalidAlgorithmError):
                    break
        raise AuthenticationError(f"the JWT was refused: {problem}")
