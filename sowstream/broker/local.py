"""A single-node KRaft Kafka broker run from the jars ``provision`` fetched: for development,
``make run`` and the tests on machines without Docker."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from sowstream.broker.provision import KAFKA_VERSION, LOG4J_CONFIG, ensure_kafka_jars
from sowstream.errors import BrokerError

DEFAULT_HOME = Path(".sowstream") / "broker"
STATE_FILE = "broker.json"
START_TIMEOUT = 90.0


@dataclass(frozen=True)
class BrokerStatus:
    """What ``sowstream broker status`` reports."""

    running: bool
    pid: int | None
    bootstrap: str | None
    data_dir: Path
    log_file: Path
    version: str


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child still "exists": look at its state where /proc tells
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ", 1)[-1].startswith("Z"))


def answers(bootstrap: str, timeout: float = 3.0) -> bool:
    """Whether a Kafka broker answers a metadata request at ``bootstrap``."""
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
        meta = admin.list_topics(timeout=timeout)
    except Exception:
        return False
    return bool(meta.brokers)


class LocalBroker:
    """A KRaft broker (combined broker and controller) whose files live under ``home``."""

    def __init__(
        self,
        home: Path | str | None = None,
        version: str = KAFKA_VERSION,
        *,
        sasl_users: Mapping[str, str] | None = None,
        acls: bool = False,
    ) -> None:
        # sasl_users adds a SASL/PLAIN listener (user -> password) for tests of secured clusters;
        # acls turns Kafka's authorizer on for it: SASL users get only what ACLs grant them (the
        # PLAINTEXT listener and the controller stay super users, to administer it).
        self.sasl_users = dict(sasl_users or {})
        self.acls = acls
        self.home = Path(home or DEFAULT_HOME).resolve()
        self.version = version
        self.data_dir = self.home / "data"
        self.log_file = self.home / "broker.log"
        self._state = self.home / STATE_FILE

    def _read_state(self) -> dict[str, Any]:
        try:
            state: dict[str, Any] = json.loads(self._state.read_text())
            return state
        except (OSError, ValueError):
            return {}

    @property
    def sasl_bootstrap(self) -> str | None:
        """``127.0.0.1:PORT`` of the SASL_PLAINTEXT listener, when ``sasl_users`` were given."""
        port = self._read_state().get("sasl_port")
        return f"127.0.0.1:{port}" if port else None

    @property
    def bootstrap(self) -> str | None:
        """``127.0.0.1:PORT`` of the broker recorded in ``home``, if any."""
        port = self._read_state().get("port")
        return f"127.0.0.1:{port}" if port else None

    def status(self) -> BrokerStatus:
        """Whether the recorded broker process is alive."""
        state = self._read_state()
        pid = state.get("pid")
        running = isinstance(pid, int) and _alive(pid)
        return BrokerStatus(
            running=running,
            pid=pid if isinstance(pid, int) and running else None,
            bootstrap=self.bootstrap if running else None,
            data_dir=self.data_dir,
            log_file=self.log_file,
            version=str(state.get("version") or self.version),
        )

    def _properties(self, port: int, controller_port: int, sasl_port: int | None) -> Path:
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            # one node: internal topics cannot have more replicas than that
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "share.coordinator.state.topic.num.partitions": "4",
            # share groups (share.version=1, on by default in 4.2): a member's first partitions
            # come a heartbeat or two after it joins, so beat every second, not every five
            "group.share.heartbeat.interval.ms": "1000",
            "group.share.min.heartbeat.interval.ms": "1000",
            "group.share.initialize.retry.interval.ms": "2000",
            "min.insync.replicas": "1",
            # tests start and stop many consumer groups: do not wait for more members
            "group.initial.rebalance.delay.ms": "0",
            # sowstream creates its topics explicitly, with the partition counts keys depend on
            "auto.create.topics.enable": "false",
            "log.segment.bytes": str(64 * 1024 * 1024),
        }
        if sasl_port:
            users = " ".join(f'user_{u}="{p}"' for u, p in self.sasl_users.items())
            props["listeners"] += f",SASL_PLAINTEXT://127.0.0.1:{sasl_port}"
            props["advertised.listeners"] += f",SASL_PLAINTEXT://127.0.0.1:{sasl_port}"
            props["listener.security.protocol.map"] += ",SASL_PLAINTEXT:SASL_PLAINTEXT"
            props["sasl.enabled.mechanisms"] = "PLAIN"
            props["listener.name.sasl_plaintext.plain.sasl.jaas.config"] = (
                f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};"
            )
            if self.acls:
                props["authorizer.class.name"] = (
                    "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
                )
                props["super.users"] = "User:ANONYMOUS"
                props["allow.everyone.if.no.acl.found"] = "false"
        path = self.home / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return path

    def _java(self, libs: Path, main: str, *args: str) -> list[str]:
        heap = os.environ.get("KAFKA_HEAP_OPTS", "-Xms256m -Xmx768m").split()
        return [
            "java",
            *heap,
            "-XX:+UseG1GC",
            f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
            "-cp",
            f"{libs}/*",
            main,
            *args,
        ]

    def _format(self, libs: Path, properties: Path) -> None:
        if (self.data_dir / "meta.properties").exists():
            return
        cluster_id = uuid.uuid4().hex[:22]
        proc = subprocess.run(
            self._java(
                libs, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(properties)
            ),
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise BrokerError(
                f"formatting Kafka storage in {self.data_dir} failed:\n"
                + "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            )

    def start(self, port: int | None = None, timeout: float = START_TIMEOUT) -> str:
        """Start the broker (or return the running one's bootstrap) once it answers."""
        status = self.status()
        if status.running and status.bootstrap and answers(status.bootstrap):
            return status.bootstrap
        libs = ensure_kafka_jars(self.version)
        self.home.mkdir(parents=True, exist_ok=True)
        state = self._read_state()
        # Reuse the recorded ports: the KRaft metadata in the data dir names the controller.
        port = port or int(state.get("port") or 0) or free_port()
        controller = int(state.get("controller_port") or 0) or free_port()
        for p in (port, controller):
            if not _port_free(p):
                raise BrokerError(
                    f"port {p} on 127.0.0.1 is already in use; pick another with "
                    "--port or stop what listens there"
                )
        sasl = (int(state.get("sasl_port") or 0) or free_port()) if self.sasl_users else None
        properties = self._properties(port, controller, sasl)
        self._format(libs, properties)
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen(
                self._java(libs, "kafka.Kafka", str(properties)),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # keeps running after `sowstream broker start` returns
            )
        self._state.write_text(
            json.dumps(
                {
                    "pid": proc.pid,
                    "port": port,
                    "controller_port": controller,
                    "sasl_port": sasl,
                    "version": self.version,
                }
            )
        )
        bootstrap = f"127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise BrokerError(
                    f"the Kafka broker exited with code {proc.returncode}:\n{self.log_tail()}"
                )
            if answers(bootstrap, timeout=2.0):
                return bootstrap
            time.sleep(0.5)
        self.stop()
        raise BrokerError(
            f"the Kafka broker did not answer on {bootstrap} within "
            f"{timeout:.0f}s:\n{self.log_tail()}"
        )

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop the broker (SIGTERM, then SIGKILL); returns whether one was running."""
        status = self.status()
        if not status.running or status.pid is None:
            return False
        pid = status.pid
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _alive(pid):
            _reap(pid)
            time.sleep(0.2)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)
            _reap(pid)
        return True

    def log_tail(self, lines: int = 30) -> str:
        """The end of the broker's log file."""
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no broker log)"


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        # like the JVM's server sockets: a port in TIME_WAIT counts as free, a listener does not
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _reap(pid: int) -> None:
    # A broker started by this very process is our child: collect it so it does not linger.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
