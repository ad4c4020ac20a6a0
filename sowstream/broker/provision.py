"""Fetch Apache Kafka's jars from Maven Central, once, into a cache outside the repository."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from rich.console import Console

from sowstream.errors import BrokerError

# The one place the broker version is pinned; deploy/local-kafka/pom.xml's default matches it.
KAFKA_VERSION = "4.2.1"

RESOURCES = Path(__file__).resolve().parent / "resources"
POM = RESOURCES / "pom.xml"
LOG4J_CONFIG = RESOURCES / "log4j2.properties"
_READY = ".complete"


def cache_dir() -> Path:
    """``$SOWSTREAM_CACHE`` or ``~/.cache/sowstream``."""
    return Path(os.environ.get("SOWSTREAM_CACHE") or Path.home() / ".cache" / "sowstream")


def kafka_libs(version: str = KAFKA_VERSION) -> Path:
    """Where the jars of ``version`` live (whether or not they are there yet)."""
    return cache_dir() / f"kafka-{version}" / "libs"


def require_tool(name: str) -> str:
    """The path of a command we need, or a BrokerError saying what to install."""
    path = shutil.which(name)
    if path is None:
        raise BrokerError(
            f"`{name}` is not on PATH: the local Kafka broker needs Java 17+ and Maven "
            "(or set SOWSTREAM_BOOTSTRAP to use an existing cluster)"
        )
    return path


def ensure_kafka_jars(version: str = KAFKA_VERSION, *, quiet: bool = False) -> Path:
    """The directory of Kafka's jars, downloading them with Maven the first time."""
    libs = kafka_libs(version)
    if (libs / _READY).exists():
        return libs
    require_tool("java")
    mvn = require_tool("mvn")
    libs.mkdir(parents=True, exist_ok=True)
    console = Console(stderr=True, quiet=quiet)
    cmd = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(POM),
        f"-Dkafka.version={version}",
        "dependency:copy-dependencies",
        f"-DoutputDirectory={libs}",
    ]
    with console.status(f"Fetching Apache Kafka {version} from Maven Central into {libs}"):
        proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
        raise BrokerError(f"Maven could not fetch Kafka {version}:\n{tail}")
    if not any(libs.glob("kafka_2.13-*.jar")):
        raise BrokerError(f"Maven finished but no Kafka broker jar is in {libs}")
    (libs / _READY).write_text(version)
    console.print(f"Apache Kafka {version} is ready in {libs}")
    return libs
