"""deploy/ checked offline: each overlay builds with kustomize, every resource validates against
the Kubernetes API schemas (kubernetes-validate) or Strimzi's CRDs, the example Kafka's topics are
the engine's, the worker runs as the probes and the sizing assume, and the Dockerfile lints."""

from __future__ import annotations

import copy
import math
import re
import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from sowstream.config import load_config_text
from sowstream.config.root import SowstreamConfig
from sowstream.engine.app import Engine
from tests.deploy import tools

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
OVERLAYS = ("dev", "prod")
# The oldest Kubernetes we claim (persistentVolumeClaimRetentionPolicy is GA from 1.32) and the
# newest whose schemas kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.32.0", kubernetes_validate.latest_version())

# docs/benchmarks.md (SOW engine): one worker holding 4 partitions with 100k keys had an RSS of
# 233 MB; an idle worker about 105 MB. docs/deploy.md#sizing explains how requests follow.
MEASURED_RSS = 233 * 1000**2
IDLE_RSS = 105 * 1000**2

Resources = list[dict[str, Any]]


def build(path: Path) -> Resources:
    """``kustomize build path`` as a list of resources."""
    proc = subprocess.run(
        [str(tools.kustomize()), "build", str(path)], capture_output=True, text=True
    )
    assert proc.returncode == 0, f"kustomize build {path} failed:\n{proc.stderr}"
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


@pytest.fixture(scope="module")
def rendered() -> dict[str, Resources]:
    return {name: build(K8S / "overlays" / name) for name in OVERLAYS}


@pytest.fixture(scope="module")
def strimzi() -> dict[tuple[str, str], dict[str, Any]]:
    return tools.strimzi_schemas()


def one(resources: Resources, kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        r
        for r in resources
        if r["kind"] == kind and (name is None or r["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def worker_container(resources: Resources) -> dict[str, Any]:
    sts = one(resources, "StatefulSet", "sowstream-worker")
    containers = sts["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "worker")


def engine_config(resources: Resources) -> SowstreamConfig:
    configmap = next(
        r
        for r in resources
        if r["kind"] == "ConfigMap" and r["metadata"]["name"].startswith("sowstream-config")
    )
    return load_config_text(configmap["data"]["sowstream.yaml"], source="the ConfigMap")


# -- schemas -------------------------------------------------------------------------------------


def strict(schema: Any) -> Any:
    """A CRD schema that refuses unknown fields, as ``kubectl apply`` does (strict field
    validation) where the CRD does not keep them (x-kubernetes-preserve-unknown-fields)."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if (
        schema.get("type") == "object"
        and "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def problems(resource: dict[str, Any], strimzi: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    """What is wrong with ``resource`` for every Kubernetes version we support (empty: valid)."""
    where = f"{resource.get('kind')} {resource.get('metadata', {}).get('name')}"
    key = (resource.get("apiVersion", ""), resource.get("kind", ""))
    if key[0].startswith("kafka.strimzi.io/"):
        if key not in strimzi:
            return [f"{where}: no Strimzi CRD for {key}"]
        validator = jsonschema.Draft7Validator(strict(strimzi[key]))
        return [
            f"{where}: {'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(resource)
        ]
    found = []
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except jsonschema.ValidationError as exc:
            path = ".".join(map(str, exc.absolute_path))
            found.append(f"{where} (Kubernetes {version}): {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            found.append(f"{where}: no schema for {exc}")
    return found


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_builds_and_every_resource_validates(
    overlay: str,
    rendered: dict[str, Resources],
    strimzi: dict[tuple[str, str], dict[str, Any]],
) -> None:
    resources = rendered[overlay]
    kinds = {r["kind"] for r in resources}
    assert {
        "Namespace",
        "ConfigMap",
        "StatefulSet",
        "Service",
        "PodDisruptionBudget",
        "Kafka",
        "KafkaNodePool",
        "KafkaTopic",
    } <= kinds
    assert all(
        r["metadata"].get("namespace") == "sowstream" for r in resources if r["kind"] != "Namespace"
    )
    assert [p for r in resources for p in problems(r, strimzi)] == []


def test_the_validators_refuse_what_a_cluster_would(
    rendered: dict[str, Resources], strimzi: dict[tuple[str, str], dict[str, Any]]
) -> None:
    resources = rendered["prod"]
    sts = copy.deepcopy(one(resources, "StatefulSet"))
    sts["spec"]["replica"] = 3  # a misspelt field
    assert any("replica" in p for p in problems(sts, strimzi))
    probe = copy.deepcopy(one(resources, "StatefulSet"))
    probe["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"] = [1]
    assert problems(probe, strimzi)
    topic = copy.deepcopy(one(resources, "KafkaTopic", "sowstream.log.orders"))
    topic["spec"]["partition"] = 12
    assert any("partition" in p for p in problems(topic, strimzi))
    kafka = copy.deepcopy(one(resources, "Kafka"))
    kafka["spec"]["kafka"]["listeners"][0]["type"] = "public"
    assert any("public" in p for p in problems(kafka, strimzi))


# -- consistency with the engine -----------------------------------------------------------------


def certifi_like_bundle() -> str:
    """A CA bundle file of this machine's."""
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile, "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).exists():
            return candidate
    pytest.fail("no CA bundle on this machine to stand in for the cluster CA")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_example_kafka_topics_are_the_engines(
    overlay: str,
    rendered: dict[str, Resources],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    resources = rendered[overlay]
    config = engine_config(resources)
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", "unused")  # prod's config reads it
    if "ssl.ca.location" in config.engine.kafka:  # the Secret's file is not here: any CA will do
        kafka = {**config.engine.kafka, "ssl.ca.location": certifi_like_bundle()}
        engine_part = config.engine.model_copy(update={"kafka": kafka})
        config = config.model_copy(update={"engine": engine_part})
    engine = Engine(config, bootstrap="kafka.invalid:9092", data_dir=tmp_path)
    expected = {s.name: (s.partitions, s.config) for s in engine.topic_specs()}
    for table in engine.tables.values():
        changelog = table.faust_table.changelog_topic
        policy = {"cleanup.policy": "compact"} if changelog.compacting else {}
        expected[changelog.get_topic_name()] = (changelog.partitions, policy)
    topics = [r for r in resources if r["kind"] == "KafkaTopic"]
    actual = {
        t["spec"].get("topicName", t["metadata"]["name"]): (
            t["spec"]["partitions"],
            {k: str(v) for k, v in t["spec"].get("config", {}).items()},
        )
        for t in topics
    }
    assert actual == expected
    assert {t["spec"]["replicas"] for t in topics} == {config.engine.replication_factor}
    kafka = one(resources, "Kafka")
    assert kafka["spec"]["kafka"]["config"]["default.replication.factor"] >= (
        config.engine.replication_factor
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlays_run_the_worker_as_the_base_and_the_fleet_test_do(
    overlay: str, rendered: dict[str, Resources]
) -> None:
    base = yaml.safe_load((K8S / "base" / "statefulset.yaml").read_text())
    base_container = base["spec"]["template"]["spec"]["containers"][0]
    container = worker_container(rendered[overlay])
    assert container["command"] == base_container["command"] == ["sowstream"]
    assert container["args"] == base_container["args"]
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert "--name=$(POD_NAME)" in container["args"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_and_metrics_reach_the_workers_http_port(
    overlay: str, rendered: dict[str, Resources]
) -> None:
    resources = rendered[overlay]
    container = worker_container(resources)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    args = dict(a.removeprefix("--").split("=", 1) for a in container["args"] if "=" in a)
    assert int(args["metrics-port"]) == ports["http"]
    assert args["metrics-host"] == "0.0.0.0"  # reachable from the kubelet and Prometheus
    paths = {
        name: container[name]["httpGet"]
        for name in ("startupProbe", "livenessProbe", "readinessProbe")
    }
    assert {name: (g["path"], g["port"]) for name, g in paths.items()} == {
        "startupProbe": ("/live", "http"),
        "livenessProbe": ("/live", "http"),
        "readinessProbe": ("/ready", "http"),
    }
    metrics = one(resources, "Service", "sowstream-metrics")
    annotations = metrics["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == ports["http"]
    assert metrics["spec"]["ports"][0]["targetPort"] == "http"
    headless = one(resources, "Service", "sowstream-worker")
    sts = one(resources, "StatefulSet", "sowstream-worker")
    assert headless["spec"]["clusterIP"] == "None"
    assert sts["spec"]["serviceName"] == "sowstream-worker"
    pdb = one(resources, "PodDisruptionBudget")
    assert pdb["spec"]["selector"] == sts["spec"]["selector"]
    assert pdb["spec"]["maxUnavailable"] == 1


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_secrets_the_config_reads_come_from_the_pod(
    overlay: str, rendered: dict[str, Resources]
) -> None:
    resources = rendered[overlay]
    config = engine_config(resources)
    container = worker_container(resources)
    env = {e["name"]: e for e in container["env"]}
    wanted = {
        name for value in config.engine.kafka.values() for name in re.findall(r"\$\{(\w+)\}", value)
    }
    for name in wanted:
        assert name in env, f"the config reads ${{{name}}}, which the pod does not set"
        assert "secretKeyRef" in env[name].get("valueFrom", {}), f"{name} is not from a Secret"
    mounts = [m["mountPath"] for m in container["volumeMounts"]]
    for setting in ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location"):
        path = config.engine.kafka.get(setting)
        if path:
            assert any(path.startswith(m + "/") for m in mounts), f"{setting} {path} is not mounted"
    if overlay == "prod":
        assert wanted == {"KAFKA_SASL_PASSWORD"}
        assert config.engine.kafka["security.protocol"] == "SASL_SSL"
        assert env["SOWSTREAM_BOOTSTRAP"]["value"].endswith(":9093")  # the TLS listener
        user = one(resources, "KafkaUser", config.engine.kafka["sasl.username"])
        assert user["spec"]["authentication"]["type"] == "scram-sha-512"


def mebibytes(quantity: str) -> float:
    """A Kubernetes memory quantity (``512Mi``, ``1Gi``) in bytes."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    return float(quantity[:-2]) * units[quantity[-2:]]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_memory_is_sized_from_the_benchmark_and_the_rocksdb_settings(
    overlay: str, rendered: dict[str, Resources]
) -> None:
    """Requests cover the RSS measured for 4 partitions; the limit covers an idle worker plus
    RocksDB's full caches and memtables for every partition a worker holds while one is away."""
    resources = rendered[overlay]
    config = engine_config(resources)
    replicas = one(resources, "StatefulSet")["spec"]["replicas"]
    memory = worker_container(resources)["resources"]
    partitions = sum(t.partitions for t in config.topics if t.durability == "persistent")
    worst = math.ceil(partitions / max(replicas - 1, 1))
    rocks = config.engine.rocksdb
    per_partition = rocks.block_cache_size + rocks.write_buffer_size * rocks.max_write_buffer_number
    assert mebibytes(memory["requests"]["memory"]) >= MEASURED_RSS
    assert mebibytes(memory["limits"]["memory"]) >= IDLE_RSS + worst * per_partition
    assert "cpu" not in memory.get("limits", {})  # throttling delays group heartbeats


# -- the image ----------------------------------------------------------------------------------

DOCKERFILE = REPO / "deploy" / "Dockerfile"


def test_the_dockerfile_passes_hadolint() -> None:
    proc = subprocess.run(
        [str(tools.hadolint()), "--no-color", str(DOCKERFILE)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_finds_what_it_should() -> None:
    bad = "FROM python:latest\nRUN cd /app && pip install sowstream\n"
    proc = subprocess.run(
        [str(tools.hadolint()), "--no-color", "-"], input=bad, capture_output=True, text=True
    )
    assert proc.returncode != 0
    assert {"DL3007", "DL3003", "DL3013"} <= set(re.findall(r"DL\d{4}", proc.stdout))


def _image_builder() -> list[str] | None:
    """A command that builds an image here, or None when no engine answers."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "info"], capture_output=True).returncode == 0:
        return [docker, "build"]
    buildah = shutil.which("buildah")
    if buildah and subprocess.run([buildah, "info"], capture_output=True).returncode == 0:
        return [buildah, "bud"]
    return None


@pytest.fixture
def builder() -> Iterator[list[str]]:
    found = _image_builder()
    if found is None:
        pytest.skip("no Docker engine or buildah answers here: the Dockerfile is linted only")
    yield found


def test_the_image_builds(builder: list[str]) -> None:
    proc = subprocess.run(
        [*builder, "-f", str(DOCKERFILE), "-t", "sowstream:test", str(REPO)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
