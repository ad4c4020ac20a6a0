"""Authentication: credentials clients attach to the records they write, and the engine's
check that turns them into the identity entitlements apply to (see docs/subscriptions.md)."""

from sowstream.auth.credentials import Auth, BearerAuth, HmacAuth
from sowstream.auth.verify import AuthenticationSettings, Authenticator, JwtSettings

__all__ = [
    "Auth",
    "AuthenticationSettings",
    "Authenticator",
    "BearerAuth",
    "HmacAuth",
    "JwtSettings",
]
