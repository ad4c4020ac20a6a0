"""Which Kafka cluster to talk to: the one asked for, ``$SOWSTREAM_BOOTSTRAP``, or the local broker
that ``sowstream broker start`` runs. Here, above ``wire``, because the last choice needs the
embedded broker and ``wire`` stays plain confluent-kafka plumbing."""

from __future__ import annotations

import os

from sowstream.errors import SowstreamError

BOOTSTRAP_ENV = "SOWSTREAM_BOOTSTRAP"


def resolve_bootstrap(explicit: str | None = None) -> str:
    """The bootstrap servers: the explicit value, else ``$SOWSTREAM_BOOTSTRAP``, else the local
    broker that ``sowstream broker start`` recorded."""
    if explicit:
        return explicit
    env = os.environ.get(BOOTSTRAP_ENV)
    if env:
        return env
    from sowstream.broker.local import LocalBroker  # the embedded default, only when asked for

    status = LocalBroker().status()
    if status.running and status.bootstrap:
        return status.bootstrap
    raise SowstreamError(
        f"no Kafka cluster: set {BOOTSTRAP_ENV}, pass --bootstrap, or run `sowstream broker start`"
    )
