import os

import pytest


@pytest.fixture(scope="session")
def kafka_bootstrap():
    yield os.environ["SOWSTREAM_BOOTSTRAP"]
