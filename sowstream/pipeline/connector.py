"""Fetch Spark's Kafka connector from Maven Central, once, into a cache outside the repository.

PySpark ships without the Kafka data source. ``provision_connector`` resolves
``spark-sql-kafka-0-10_<scala>:<pyspark version>`` and its dependencies with Maven, keeps only the
jars Spark does not already have (a second copy of scala-library, slf4j or jackson on the class
path breaks Spark in subtle ways) and caches them in ``$SOWSTREAM_CACHE/spark-<version>/jars``
(default ``~/.cache/sowstream``), with a ``.complete`` marker listing them. When Maven Central
has no connector for that exact version yet, the newest earlier ``x.y.0`` of the same major
version is used, with a warning; ``connector-version`` in the cache records which.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from sowstream.broker.provision import cache_dir
from sowstream.errors import PipelineError

__all__ = [
    "connector_coordinates",
    "connector_jars",
    "connector_jars_dir",
    "provision_connector",
    "spark_jars_dir",
    "spark_version",
]

_READY = ".complete"
_CONNECTOR_VERSION = "connector-version"
log = logging.getLogger("sowstream.pipeline")
# How Maven says that a version does not exist (first try, then from its local failure cache).
_MISSING = re.compile(r"Could not find artifact|was not found in")
_SCALA_RE = re.compile(r"^spark-core_(\d+\.\d+)-")

# Generated rather than shipped so that an installed wheel can provision too; the Spark and Scala
# versions come from the installed pyspark, never from a pin that could drift from it.
_POM = """\
<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>io.sowstream</groupId>
  <artifactId>spark-kafka-connector</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.spark</groupId>
      <artifactId>spark-sql-kafka-0-10_{scala}</artifactId>
      <version>{version}</version>
    </dependency>
  </dependencies>
</project>
"""


def spark_version() -> str:
    """The version of the installed pyspark (read from its metadata: pyspark is not imported)."""
    try:
        return importlib.metadata.version("pyspark")
    except importlib.metadata.PackageNotFoundError:
        raise PipelineError(
            "pyspark is not installed: install sowstream with the 'spark' extra "
            "(pip install 'sowstream[spark]')"
        ) from None


def spark_jars_dir() -> Path:
    """The jars Spark runs with: ``$SPARK_HOME/jars`` if set, else the ones inside pyspark."""
    home = os.environ.get("SPARK_HOME")
    if home and (Path(home) / "jars").is_dir():
        return Path(home) / "jars"
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise PipelineError("pyspark is not installed: install sowstream with the 'spark' extra")
    jars = Path(next(iter(spec.submodule_search_locations))) / "jars"
    if not jars.is_dir():
        raise PipelineError(f"pyspark has no jars directory at {jars}; set SPARK_HOME")
    return jars


def _scala_version(jars: Path) -> str:
    for jar in jars.glob("spark-core_*.jar"):
        found = _SCALA_RE.match(jar.name)
        if found:
            return found.group(1)
    raise PipelineError(f"no spark-core jar in {jars}: cannot tell which Scala version Spark uses")


def connector_coordinates(version: str | None = None) -> str:
    """The Maven coordinates of the connector matching the installed Spark (for ``--packages``)."""
    scala = _scala_version(spark_jars_dir())
    return f"org.apache.spark:spark-sql-kafka-0-10_{scala}:{version or spark_version()}"


def connector_jars_dir(version: str | None = None) -> Path:
    """Where the connector jars for ``version`` live (whether or not they are there yet)."""
    return cache_dir() / f"spark-{version or spark_version()}" / "jars"


def _read_ready(jars: Path) -> list[Path] | None:
    marker = jars / _READY
    if not marker.exists():
        return None
    found = [jars / name for name in marker.read_text().split()]
    # A cleaned-up cache (someone deleted a jar) provisions again rather than failing in Spark.
    return found if all(p.is_file() for p in found) else None


def connector_jars(version: str | None = None) -> list[Path]:
    """The connector jars to add to Spark's class path, provisioning them on first use."""
    return _read_ready(connector_jars_dir(version)) or provision_connector(version)


def _require(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise PipelineError(
            f"`{name}` is not on PATH: fetching Spark's Kafka connector needs Java 17+ and Maven "
            f"(or give it to spark-submit: --packages {connector_coordinates()})"
        )
    return path


def _shipped(spark_jars: Path) -> set[str]:
    return {p.name for p in spark_jars.glob("*.jar")}


def _ships(artifact_id: str, shipped: set[str]) -> bool:
    """Whether Spark already has ``artifact_id`` (any version): its jars are ``<id>-<version>``."""
    prefix = artifact_id + "-"
    return any(n.startswith(prefix) and n[len(prefix) : len(prefix) + 1].isdigit() for n in shipped)


def _resolved(listing: Path) -> list[tuple[str, Path]]:
    """(artifactId, jar) for each ``group:artifact:jar[:classifier]:version:scope:/path`` line."""
    out: list[tuple[str, Path]] = []
    for raw in listing.read_text().splitlines():
        line = raw.split(" -- ")[0].strip()  # newer plugins append " -- module name"
        parts = line.split(":")
        if len(parts) < 6 or parts[2] != "jar":
            continue
        text = parts[-1]
        if len(parts[-2]) == 1 and parts[-2].isalpha():  # a Windows drive letter: C:\...
            text = parts[-2] + ":" + text
        path = Path(text)
        if path.suffix == ".jar" and path.is_file():
            out.append((parts[1], path))
    return out


def _candidates(version: str) -> list[str]:
    """The exact version first, then the ``.0`` release of each earlier minor of the same major.

    Maven Central (or a mirror of it) can lag behind PyPI; the Kafka source only uses Spark's
    stable data-source API, so the newest earlier connector of the same major version works.
    """
    found = re.match(r"(\d+)\.(\d+)\.\d+", version)
    if not found:
        return [version]
    major, minor = int(found.group(1)), int(found.group(2))
    return [version, *(f"{major}.{m}.0" for m in range(minor - 1, -1, -1))]


def _resolve(mvn: str, work: Path, scala: str, version: str, quiet: bool) -> Path | str:
    """Run Maven for one connector version: the dependency listing, or Maven's last lines."""
    pom = work / f"pom-{version}.xml"
    pom.write_text(_POM.format(scala=scala, version=version))
    listing = work / f"dependencies-{version}.txt"
    cmd = [
        mvn,
        "-B",
        "-Dstyle.color=never",
        *(["-q"] if quiet else []),
        "-f",
        str(pom),
        "dependency:list",
        f"-DoutputFile={listing}",
        "-DoutputAbsoluteArtifactFilename=true",
        "-DincludeScope=runtime",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == 0 and listing.exists():
        return listing
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip() != "[ERROR]"]
    return "\n".join(lines[-12:])


def provision_connector(version: str | None = None, *, quiet: bool = True) -> list[Path]:
    """Resolve the connector with Maven into the cache (idempotent) and return its jars.

    ``version`` is the Spark version the jars are for (default: the installed pyspark). Raises
    ``PipelineError`` when Java or Maven is missing or Maven fails (with its last lines).
    """
    version = version or spark_version()
    jars = connector_jars_dir(version)
    ready = _read_ready(jars)
    if ready is not None:
        return ready
    spark_jars = spark_jars_dir()
    scala = _scala_version(spark_jars)
    _require("java")
    mvn = _require("mvn")
    jars.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="resolve-", dir=jars.parent) as tmp:
        work = Path(tmp)
        failures: list[str] = []
        listing: Path | None = None
        for candidate in _candidates(version):
            outcome = _resolve(mvn, work, scala, candidate, quiet)
            if isinstance(outcome, Path):
                listing = outcome
                break
            failures.append(f"{candidate}: {outcome}")
            if not _MISSING.search(outcome):
                break  # offline, proxy, bad settings: an older version would fail the same way
        if listing is None:
            raise PipelineError(
                f"Maven could not resolve the Kafka connector for Spark {version}:\n"
                + "\n".join(failures)
            )
        if candidate != version:
            log.warning(
                "Maven Central has no Kafka connector %s; using %s, the newest earlier release",
                version,
                candidate,
            )
        shipped = _shipped(spark_jars)
        keep = [path for artifact, path in _resolved(listing) if not _ships(artifact, shipped)]
        if not any(p.name.startswith("spark-sql-kafka-0-10_") for p in keep):
            raise PipelineError(f"Maven finished but resolved no spark-sql-kafka jar for {version}")
        staged = work / "jars"
        staged.mkdir()
        for path in keep:
            shutil.copy2(path, staged / path.name)
        (staged / _CONNECTOR_VERSION).write_text(candidate + "\n")
        (staged / _READY).write_text("\n".join(sorted(p.name for p in keep)) + "\n")
        # Rename into place in one step so a concurrent or interrupted run never sees half a set.
        if jars.exists():
            shutil.rmtree(jars, ignore_errors=True)
        try:
            staged.rename(jars)
        except OSError:
            if _read_ready(jars) is None:  # not another process winning the race: a real error
                raise
    result = _read_ready(jars)
    if result is None:
        raise PipelineError(f"the connector jars in {jars} are incomplete")
    return result
