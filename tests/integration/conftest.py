"""Fixtures shared by the integration modules: clients of the module's ``engine``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sowstream.client import Client
from tests.support.engine import EngineProcesses


@pytest.fixture
def client(engine: EngineProcesses) -> Iterator[Client]:
    """A connected client of the module's engine (each module defines ``engine``)."""
    with engine.client() as c:
        yield c


@pytest.fixture
def publisher(engine: EngineProcesses) -> Iterator[Client]:
    """A second client, for publishing while ``client`` subscribes or queries."""
    with engine.client() as c:
        yield c
