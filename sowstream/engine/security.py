"""The engine's Kafka security settings: librdkafka-style keys, checked once for every client.

One ``engine.kafka`` mapping configures every client the engine makes, so TLS and SASL are given
once, in the names Kafka users know (``security.protocol``, ``sasl.mechanism``, ...).
Secrets need not be in the file: ``${NAME}`` in a value is read from the environment, where
an orchestrator puts them (a Kubernetes Secret as an environment variable).
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass

from sowstream.errors import SowstreamError

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def expand_environment(
    kafka: Mapping[str, str], environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """``engine.kafka`` with every ``${NAME}`` replaced by environment variable ``NAME``.

    Raises SowstreamError naming the setting and the variable when one is not set: a worker
    started without its password must say so, not try to log in with the text ``${...}``.
    """
    env = os.environ if environ is None else environ

    def value(setting: str, text: str) -> str:
        def lookup(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in env:
                raise SowstreamError(
                    f"engine.kafka: {setting} refers to environment variable {name}, "
                    "which is not set"
                )
            return env[name]

        return _ENV_REFERENCE.sub(lookup, text)

    return {setting: value(setting, text) for setting, text in kafka.items()}


def _ssl_context(kafka: Mapping[str, str]) -> ssl.SSLContext:
    context = ssl.create_default_context(
        purpose=ssl.Purpose.SERVER_AUTH, cafile=kafka.get("ssl.ca.location")
    )
    cert = kafka.get("ssl.certificate.location")
    if cert:
        context.load_cert_chain(cert, kafka.get("ssl.key.location"), kafka.get("ssl.key.password"))
    if kafka.get("enable.ssl.certificate.verification", "true").lower() == "false":
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


@dataclass(frozen=True)
class KafkaSecurity:
    """``engine.kafka``'s TLS and SASL settings, checked, for the worker's faust (aiokafka)
    clients, which do not read librdkafka's keys (the runtime turns this into faust's
    credentials)."""

    protocol: str  # SSL, SASL_PLAINTEXT or SASL_SSL
    ssl_context: ssl.SSLContext | None = None
    mechanism: str | None = None  # SASL only
    username: str | None = None
    password: str | None = None


def kafka_security(kafka: Mapping[str, str]) -> KafkaSecurity | None:
    """The security ``engine.kafka`` asks for; None for a plaintext cluster. SowstreamError for
    a protocol or SASL mechanism the worker does not support."""
    protocol = kafka.get("security.protocol", "PLAINTEXT").upper()
    if protocol == "PLAINTEXT":
        return None
    if protocol == "SSL":
        return KafkaSecurity(protocol, _ssl_context(kafka))
    if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        mechanism = kafka.get("sasl.mechanism", kafka.get("sasl.mechanisms", "PLAIN")).upper()
        if mechanism not in SASL_MECHANISMS:
            raise SowstreamError(
                f"engine.kafka: sasl.mechanism {mechanism!r} is not supported by the worker "
                f"(supported: {', '.join(SASL_MECHANISMS)})"
            )
        return KafkaSecurity(
            protocol,
            _ssl_context(kafka) if protocol == "SASL_SSL" else None,
            mechanism=mechanism,
            username=kafka.get("sasl.username"),
            password=kafka.get("sasl.password"),
        )
    raise SowstreamError(
        f"engine.kafka: security.protocol {protocol!r} is not one of PLAINTEXT, SSL, "
        "SASL_PLAINTEXT, SASL_SSL"
    )
