"""The shipped deployment files stay consistent with the code."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from sowstream.broker.provision import KAFKA_VERSION, POM
from sowstream.config import load_config_text

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_configmap_holds_a_valid_sowstream_config() -> None:
    doc = yaml.safe_load((DEPLOY / "k8s" / "configmap.yaml").read_text())
    config = load_config_text(doc["data"]["sowstream.yaml"], source="configmap.yaml")
    assert [t.name for t in config.topics] == ["orders"]
    assert config.engine.replication_factor == 3


def test_statefulset_runs_the_worker_with_the_configmap() -> None:
    docs = yaml.safe_load((DEPLOY / "k8s" / "statefulset.yaml").read_text())
    container = docs["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][0] == "worker"
    assert "--config=/etc/sowstream/sowstream.yaml" in container["args"]
    assert "--name=$(POD_NAME)" in container["args"]


def test_pom_default_matches_the_pinned_kafka_version() -> None:
    match = re.search(r"<kafka.version>([^<]+)</kafka.version>", POM.read_text())
    assert match is not None and match.group(1) == KAFKA_VERSION
