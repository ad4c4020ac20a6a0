"""Who is looking: tokens that log in as an identity, and the sessions they open.

Bound to a loopback address with no token configured, the console is open and every request
acts as the default identity. Otherwise each request needs a session cookie (opened by posting
a token to ``/api/login``) or ``Authorization: Bearer <token>``; the token decides the identity
the console's queries and subscriptions run as, so the engine's entitlements apply.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from dataclasses import dataclass, field

from sowstream.errors import SowstreamError

COOKIE = "sowstream_console"


def is_loopback(host: str) -> bool:
    """Whether binding to ``host`` keeps the console on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost: assume it is reachable from elsewhere


def parse_users(specs: list[str]) -> dict[str, str]:
    """``IDENTITY=TOKEN`` options as token -> identity; errors name the bad option."""
    users: dict[str, str] = {}
    for spec in specs:
        identity, sep, token = spec.partition("=")
        if not sep or not token:
            raise SowstreamError(f"--user {spec!r}: expected IDENTITY=TOKEN")
        if token in users:
            raise SowstreamError(f"--user {spec!r}: that token is already given to another user")
        users[token] = identity
    return users


@dataclass
class Auth:
    """Tokens (token -> identity) and open sessions (session id -> identity)."""

    tokens: dict[str, str]
    default_identity: str = ""
    required: bool = False
    sessions: dict[str, str] = field(default_factory=dict)
    generated: str | None = None  # a token made up at start, to print

    @classmethod
    def for_host(
        cls,
        host: str,
        *,
        token: str | None = None,
        users: dict[str, str] | None = None,
        identity: str = "",
    ) -> Auth:
        """Login is required off loopback or whenever tokens are given; off loopback with none,
        one is generated (for ``identity``) so the console is never open to the network."""
        tokens = dict(users or {})
        if token:
            tokens[token] = identity
        generated = None
        if not tokens and not is_loopback(host):
            generated = secrets.token_urlsafe(24)
            tokens[generated] = identity
        return cls(tokens, identity, required=bool(tokens), generated=generated)

    def login(self, token: str) -> str | None:
        """A new session id for a valid token, else None (compared in constant time)."""
        identity = self._identity_of(token)
        if identity is None:
            return None
        session = secrets.token_urlsafe(32)
        self.sessions[session] = identity
        return session

    def logout(self, session: str | None) -> None:
        """Forget a session."""
        if session:
            self.sessions.pop(session, None)

    def identity(self, session: str | None, authorization: str | None) -> str | None:
        """The identity a request acts as, or None when it must log in first."""
        if not self.required:
            return self.default_identity
        if session and session in self.sessions:
            return self.sessions[session]
        if authorization and authorization.startswith("Bearer "):
            return self._identity_of(authorization.removeprefix("Bearer ").strip())
        return None

    def _identity_of(self, token: str) -> str | None:
        found = None
        for known, identity in self.tokens.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                found = identity
        return found
