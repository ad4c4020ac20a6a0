"""deploy/k8s's StatefulSet played on this machine: each pod a worker process started from the
manifest's own container (command, args, environment, volumes, probes), as the kubelet would.

What cannot be the same on one machine is mapped, and only that: the in-cluster Kafka address
(``SOWSTREAM_BOOTSTRAP``) becomes the test broker; each volume mount becomes a directory of the
pod's (the PVC ``data-<pod>`` outlives the pod as a volume does; the ConfigMap is written once);
the container port becomes a free port of the loopback interface, since every pod here shares
one network namespace.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka.admin import AdminClient

REPO = Path(__file__).resolve().parents[2]
STATEFULSET = REPO / "deploy" / "k8s" / "base" / "statefulset.yaml"

_KUBELET_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's expansion of ``$(VAR)`` in a container's args (``$$`` is a literal ``$``;
    a reference to a variable the container does not define stays as it is)."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _KUBELET_REFERENCE.sub(one, text)


def free_port() -> int:
    """A TCP port of the loopback interface nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Pod:
    """One pod of the set: its process, its port and its volume."""

    name: str
    port: int
    volume: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    argv: list[str] = field(default_factory=list)
    deleted: bool = False  # stopped on purpose (scaled down or deleted), not crashed
    # What its readiness probe answered since it started, consecutive repeats left out.
    readiness: list[tuple[int, str]] = field(default_factory=list)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class LocalStatefulSet:
    """The manifest's StatefulSet, its pods as local processes with stable names and volumes."""

    def __init__(
        self, workdir: Path, bootstrap: str, config_text: str, manifest: Path = STATEFULSET
    ) -> None:
        self.workdir = workdir
        self.bootstrap = bootstrap
        self.manifest: dict[str, Any] = yaml.safe_load(manifest.read_text())
        spec = self.manifest["spec"]
        self.name: str = self.manifest["metadata"]["name"]
        pod_spec = spec["template"]["spec"]
        self.container: dict[str, Any] = next(
            c for c in pod_spec["containers"] if c["name"] == "worker"
        )
        self.grace = float(pod_spec.get("terminationGracePeriodSeconds", 30))
        # Where each volume of the pod lives here: the ConfigMap's files in one directory
        # (every pod reads the same), the volume claim template per pod, emptyDirs per pod.
        volumes = {v["name"]: v for v in pod_spec["volumes"]}
        claims = {c["metadata"]["name"] for c in spec["volumeClaimTemplates"]}
        self._mounts: list[tuple[str, str]] = []
        for mount in self.container["volumeMounts"]:
            if mount["name"] in claims:
                kind = "claim"
            elif "configMap" in volumes.get(mount["name"], {}):
                kind = "configMap"
            elif "emptyDir" in volumes.get(mount["name"], {}):
                kind = "emptyDir"
            else:
                raise ValueError(f"volume {mount['name']!r}: not a kind the fleet test can mount")
            self._mounts.append((mount["mountPath"], f"{kind}:{mount['name']}"))
        self.configmap = workdir / "configmap"
        self.configmap.mkdir(parents=True)
        (self.configmap / "sowstream.yaml").write_text(config_text)
        self.group: str = yaml.safe_load(config_text)["engine"]["app_id"]  # faust's group
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self.pods: dict[int, Pod] = {}

    # -- the pod template --------------------------------------------------------------------------

    def _host_path(self, pod: Pod, kind_and_name: str) -> Path:
        kind, name = kind_and_name.split(":", 1)
        if kind == "configMap":
            return self.configmap
        if kind == "claim":
            return pod.volume
        return self.workdir / "emptydir" / pod.name / name

    def _environment(self, pod: Pod) -> dict[str, str]:
        """The container's environment, as the kubelet builds it for ``pod``."""
        env: dict[str, str] = {}
        for var in self.container.get("env", []):
            if "value" in var:
                env[var["name"]] = expand(var["value"], env)
            elif var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
                env[var["name"]] = pod.name
            else:
                raise ValueError(f"env {var['name']}: a source the fleet test does not provide")
        if "SOWSTREAM_BOOTSTRAP" not in env:
            raise ValueError("the worker container sets no SOWSTREAM_BOOTSTRAP")
        env["SOWSTREAM_BOOTSTRAP"] = self.bootstrap  # the cluster's Service is not here
        return env

    def _argv(self, pod: Pod, env: dict[str, str]) -> list[str]:
        """The container's command and args for ``pod``, mapped to this machine."""
        ports = {str(p["containerPort"]) for p in self.container.get("ports", [])}
        command = self.container["command"]
        if command != ["sowstream"]:
            raise ValueError(f"the worker's command is {command}, not the sowstream entry point")
        argv = [sys.executable, "-m", "sowstream"]  # the entry point the image installs
        for raw in self.container.get("args", []):
            arg = expand(raw, env)
            flag, sep, value = arg.partition("=")
            if sep:
                # The deepest mount holding the path, as in the container's filesystem.
                for mount_path, volume in sorted(self._mounts, key=lambda m: -len(m[0])):
                    if value == mount_path or value.startswith(mount_path + "/"):
                        host = self._host_path(pod, volume)
                        value = str(host) + value[len(mount_path) :]
                        break
                if value in ports:
                    value = str(pod.port)
                elif value == "0.0.0.0":
                    value = "127.0.0.1"  # one machine: the probes and metrics stay on loopback
                arg = f"{flag}={value}"
            argv.append(arg)
        return argv

    # -- the controller ------------------------------------------------------------------------

    def pod(self, ordinal: int) -> Pod:
        """The pod with this ordinal (created on first use, then kept with its volume)."""
        if ordinal not in self.pods:
            name = f"{self.name}-{ordinal}"
            self.pods[ordinal] = Pod(
                name=name,
                port=free_port(),
                volume=self.workdir / "pvc" / f"data-{name}",
                log=self.workdir / f"{name}.log",
            )
        return self.pods[ordinal]

    def start(self, ordinal: int) -> Pod:
        """Create the pod: its volume is the one it had, if any."""
        pod = self.pod(ordinal)
        if pod.running():
            return pod
        for _, volume in self._mounts:
            self._host_path(pod, volume).mkdir(parents=True, exist_ok=True)
        env = self._environment(pod)
        pod.argv = self._argv(pod, env)
        log = open(pod.log, "ab")  # noqa: SIM115 - owned by the process
        pod.deleted = False
        pod.readiness = []
        pod.proc = subprocess.Popen(
            pod.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=pod.volume,
            env={**os.environ, **env, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"},
        )
        log.close()
        return pod

    def scale(self, replicas: int) -> None:
        """Scale to ``replicas``: new ordinals start, the highest ones stop (volumes stay)."""
        for ordinal in range(replicas):
            self.start(ordinal)
        for ordinal in sorted((o for o in self.pods if o >= replicas), reverse=True):
            self.delete(ordinal)

    def running(self) -> list[Pod]:
        return [p for _, p in sorted(self.pods.items()) if p.running()]

    def delete(self, ordinal: int, *, kill: bool = False) -> None:
        """Stop the pod: SIGTERM and the grace period, as the kubelet does; SIGKILL at once
        with ``kill`` (a node lost, ``kubectl delete pod --force --grace-period=0``)."""
        pod = self.pods.get(ordinal)
        if pod is None or pod.proc is None or pod.proc.poll() is not None:
            return
        pod.deleted = True
        pod.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            pod.proc.wait(self.grace)
        except subprocess.TimeoutExpired:
            pod.proc.kill()
            pod.proc.wait(10)

    def delete_volume(self, ordinal: int) -> None:
        """Delete the pod's PersistentVolumeClaim: its RocksDB is gone."""
        shutil.rmtree(self.pod(ordinal).volume, ignore_errors=True)

    def stop_all(self) -> None:
        for ordinal in sorted(self.pods, reverse=True):
            self.delete(ordinal)

    # -- the probes -----------------------------------------------------------------------------

    def probe(self, pod: Pod, probe: str) -> tuple[int, str]:
        """GET the path of the manifest's ``probe`` on ``pod``: (status, body); 0 when nothing
        answers."""
        path = self.container[probe]["httpGet"]["path"]
        return self.get(pod, path)

    def get(self, pod: Pod, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{pod.port}{path}", timeout=5) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()
        except OSError:
            return 0, ""

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Block until every running pod passes its readiness and liveness probes."""
        deadline = time.monotonic() + timeout
        last: dict[str, str] = {}
        while time.monotonic() < deadline:
            for pod in self.pods.values():
                if pod.proc is not None and not pod.deleted and not pod.running():
                    raise RuntimeError(f"{pod.name} died:\n{self.log_tail(pod)}")
            answers = {}
            for pod in self.running():
                ready = self.probe(pod, "readinessProbe")
                if not pod.readiness or pod.readiness[-1] != ready:
                    pod.readiness.append(ready)
                answers[pod.name] = (ready, self.probe(pod, "livenessProbe"))
            if all(ready[0] == 200 and live[0] == 200 for ready, live in answers.values()):
                return
            last = {
                name: f"ready {ready[0]} {ready[1].strip()}; live {live[0]}"
                for name, (ready, live) in answers.items()
            }
            time.sleep(0.5)
        tails = "\n".join(f"--- {p.name}\n{self.log_tail(p)}" for p in self.running())
        raise AssertionError(f"pods not ready after {timeout}s: {last}\n{tails}")

    def log_tail(self, pod: Pod, lines: int = 60) -> str:
        if not pod.log.exists():
            return ""
        return "\n".join(pod.log.read_text(errors="replace").splitlines()[-lines:])
