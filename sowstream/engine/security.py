"""The engine's Kafka security settings: librdkafka-style keys, translated for faust (aiokafka).

One ``engine.kafka`` mapping configures every client the engine makes, so TLS and SASL are given
once, in the names Kafka users know (``security.protocol``, ``sasl.mechanism``, ...).
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping

from faust.auth import SASLCredentials, SSLCredentials
from faust.types.auth import CredentialsT

from sowstream.errors import SowstreamError

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


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


def faust_credentials(kafka: Mapping[str, str]) -> CredentialsT | None:
    """faust's ``broker_credentials`` for ``engine.kafka``; None for a plaintext cluster."""
    protocol = kafka.get("security.protocol", "PLAINTEXT").upper()
    if protocol == "PLAINTEXT":
        return None
    if protocol == "SSL":
        return SSLCredentials(_ssl_context(kafka))
    if protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        mechanism = kafka.get("sasl.mechanism", kafka.get("sasl.mechanisms", "PLAIN")).upper()
        if mechanism not in SASL_MECHANISMS:
            raise SowstreamError(
                f"engine.kafka: sasl.mechanism {mechanism!r} is not supported by the worker "
                f"(supported: {', '.join(SASL_MECHANISMS)})"
            )
        return SASLCredentials(
            username=kafka.get("sasl.username"),
            password=kafka.get("sasl.password"),
            mechanism=mechanism,
            ssl_context=_ssl_context(kafka) if protocol == "SASL_SSL" else None,
        )
    raise SowstreamError(
        f"engine.kafka: security.protocol {protocol!r} is not one of PLAINTEXT, SSL, "
        "SASL_PLAINTEXT, SASL_SSL"
    )
