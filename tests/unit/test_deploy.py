"""The shipped deployment files stay consistent with the code (kustomize and the schema checks
are in tests/deploy)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from sowstream.broker.provision import KAFKA_VERSION, POM
from sowstream.config import load_config_text

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"


@pytest.mark.parametrize(
    ("path", "partitions", "replication"),
    [("base", 12, 3), ("overlays/dev", 4, 1), ("overlays/prod", 12, 3)],
)
def test_each_config_the_configmap_carries_is_valid(
    path: str, partitions: int, replication: int
) -> None:
    file = K8S / path / "sowstream.yaml"
    config = load_config_text(file.read_text(), source=str(file))
    assert [(t.name, t.partitions) for t in config.topics] == [("orders", partitions)]
    assert config.engine.replication_factor == replication
    assert config.engine.auto_create_topics is False


def test_statefulset_runs_the_worker_with_the_configmap() -> None:
    sts = yaml.safe_load((K8S / "base" / "statefulset.yaml").read_text())
    spec = sts["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert container["args"][0] == "worker"
    assert "--config=/etc/sowstream/config/sowstream.yaml" in container["args"]
    assert "--name=$(POD_NAME)" in container["args"]
    assert "--static-membership" in container["args"]  # the pod name is the group member
    config_volume = next(v for v in spec["volumes"] if v["name"] == "config")
    assert config_volume["configMap"]["name"] == "sowstream-config"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["config"] == "/etc/sowstream/config"
    assert "--data-dir=" + mounts["data"] in container["args"]


def test_pom_default_matches_the_pinned_kafka_version() -> None:
    match = re.search(r"<kafka.version>([^<]+)</kafka.version>", POM.read_text())
    assert match is not None and match.group(1) == KAFKA_VERSION
