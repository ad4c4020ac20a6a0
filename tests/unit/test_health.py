"""The worker's HTTP endpoints (sowstream.engine.health), served for real on a free port, and
the environment references of engine.kafka (sowstream.engine.security)."""

from __future__ import annotations

import asyncio
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from sowstream.engine import health as health_module
from sowstream.engine.health import LIVE_STALE_SECONDS, Health, Readiness, serve
from sowstream.engine.security import expand_environment
from sowstream.errors import SowstreamError


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def health(clock: Clock) -> Health:
    return Health(clock)


@pytest.fixture
def url(health: Health) -> Iterator[str]:
    server = serve(health, "127.0.0.1", 0, poll_interval=0.05)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running in a thread, as the worker's runs beside the HTTP threads."""
    running = asyncio.new_event_loop()
    thread = threading.Thread(target=running.run_forever, daemon=True)
    thread.start()
    try:
        yield running
    finally:
        running.call_soon_threadsafe(running.stop)
        thread.join(5)
        running.close()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_nothing_is_live_or_ready_before_the_loop_turns(url: str) -> None:
    assert get(url + "/live") == (503, "starting: the worker's event loop has not run yet\n")
    assert get(url + "/ready")[0] == 503


def test_ready_reports_what_the_loop_worked_out(url: str, health: Health) -> None:
    health.beat(Readiness(False, "rebalancing: restoring tables from their changelogs"))
    assert get(url + "/live")[0] == 200
    assert get(url + "/ready") == (503, "rebalancing: restoring tables from their changelogs\n")
    health.beat(Readiness(True, "ready: 4 topic partition(s) owned and restored"))
    assert get(url + "/ready") == (200, "ready: 4 topic partition(s) owned and restored\n")


def test_a_loop_that_stops_turning_is_neither_live_nor_ready(
    url: str, health: Health, clock: Clock
) -> None:
    health.beat(Readiness(True, "ready"))
    clock.now += LIVE_STALE_SECONDS - 1
    assert get(url + "/live")[0] == 200
    clock.now += 2
    code, body = get(url + "/live")
    assert code == 503 and "has not turned for" in body
    assert get(url + "/ready")[0] == 503  # the last answer is stale
    health.beat(Readiness(True, "ready"))
    assert get(url + "/live")[0] == 200


def test_status_answers_the_loops_rows_as_json_lines(
    url: str, health: Health, loop: asyncio.AbstractEventLoop
) -> None:
    rows = [
        {"topic": "orders", "partition": 0, "watermark": 41, "worker": "w-0"},
        {"topic": "orders", "partition": 2, "watermark": 7, "worker": "w-0"},
    ]

    async def status() -> list[dict[str, Any]]:
        assert asyncio.get_running_loop() is loop  # read in the worker's loop, not a thread
        return rows

    health.beat(Readiness(True, "ready"))
    health.serve_status(loop, status)
    code, body = get(url + "/status")
    assert code == 200
    assert [orjson.loads(line) for line in body.splitlines()] == rows


def test_status_fails_when_the_loop_cannot_answer(
    url: str, health: Health, loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert get(url + "/status")[0] == 503  # no loop yet
    monkeypatch.setattr(health_module, "STATUS_TIMEOUT", 0.2)
    release = asyncio.Event()

    async def stuck() -> list[dict[str, Any]]:
        await release.wait()
        return []

    health.beat(Readiness(True, "ready"))
    health.serve_status(loop, stuck)
    assert get(url + "/status") == (503, "the worker did not answer in time\n")


def test_other_paths_are_the_prometheus_metrics(url: str) -> None:
    code, body = get(url + "/metrics")
    assert code == 200 and "# TYPE" in body


def test_environment_references_in_engine_kafka_are_expanded() -> None:
    kafka = {
        "sasl.password": "${KAFKA_SASL_PASSWORD}",
        "sasl.username": "u-${TEAM}-worker",
        "ssl.ca.location": "/etc/ca.crt",
        "plain": "$NOT_A_REFERENCE",
    }
    env = {"KAFKA_SASL_PASSWORD": "s3cret", "TEAM": "risk"}
    assert expand_environment(kafka, env) == {
        "sasl.password": "s3cret",
        "sasl.username": "u-risk-worker",
        "ssl.ca.location": "/etc/ca.crt",
        "plain": "$NOT_A_REFERENCE",
    }


def test_an_unset_environment_reference_is_refused_naming_setting_and_variable() -> None:
    with pytest.raises(SowstreamError) as caught:
        expand_environment({"sasl.password": "${KAFKA_SASL_PASSWORD}"}, {})
    assert str(caught.value) == (
        "engine.kafka: sasl.password refers to environment variable KAFKA_SASL_PASSWORD, "
        "which is not set"
    )


def test_a_worker_without_its_secret_refuses_to_start(tmp_path: Any) -> None:
    from sowstream.config import load_config_text
    from sowstream.engine.app import Engine

    config = load_config_text(
        "engine:\n"
        "  kafka:\n"
        "    security.protocol: SASL_PLAINTEXT\n"
        "    sasl.password: ${SOWSTREAM_TEST_UNSET_PASSWORD}\n"
        "sow:\n"
        "  - {Name: orders, Key: /order}\n",
        source="test",
    )
    with pytest.raises(SowstreamError, match="SOWSTREAM_TEST_UNSET_PASSWORD, which is not set"):
        Engine(config, bootstrap="kafka.invalid:9092", data_dir=tmp_path)


def test_readiness_waits_for_view_and_conflated_input_partitions(tmp_path: Any) -> None:
    from sowstream.config import load_config_text
    from sowstream.engine.app import Engine
    from sowstream.views.conflated import Conflator

    config = load_config_text(
        "sow:\n"
        "  - {Name: orders, Key: /id}\n"
        "conflated_topics:\n"
        "  - {Name: orders-C, UnderlyingTopic: orders}\n"
        "views:\n"
        "  - Name: by_desk\n"
        "    UnderlyingTopic: orders\n"
        "    Projection: [/desk AS /desk, COUNT(/id) AS /n]\n"
        "    Grouping: [/desk]\n",
        source="test",
    )
    engine = Engine(config, bootstrap="kafka.invalid:9092", data_dir=tmp_path)
    status = engine.status
    status.assigned = True  # faust assigned partitions: no SOW partition of orders, though
    progress = engine.runtime.app.progress  # ... and recovered them
    progress.assignment()
    progress.resumed()
    engine.clients.registry.loaded.set()
    inputs = {unit.name: unit for unit in engine.topology.inputs}
    view, conflated = inputs["by_desk"].runner, inputs["orders-C"].runner
    assert status.readiness().ready  # nothing assigned yet
    view.assign([1, 0])
    conflated.assign([2])
    assert status.readiness() == Readiness(False, "loading view by_desk input partition 0")
    # Loaded (the runners keep memory stores without a table) and caught up with the input.
    view._table = conflated._table = None
    for partition in (0, 1):
        loaded = view.ready(partition)
        assert loaded is not None
        loaded.caught_up = partition == 0
    assert status.readiness() == Readiness(False, "loading view by_desk input partition 1")
    loaded = view.ready(1)
    assert loaded is not None
    loaded.caught_up = True
    assert status.readiness() == Readiness(
        False, "loading conflated topic orders-C input partition 2"
    )
    conflated._parts[2] = Conflator(-1)  # read from its last flush (none): what _ready keeps
    assert status.readiness() == Readiness(
        True, "ready: 0 topic partition(s) owned and restored, 3 view input partition(s) loaded"
    )


def test_cluster_status_is_the_gathered_document_or_why_there_is_none(
    url: str, health: Health
) -> None:
    assert get(url + "/status/cluster") == (
        503,
        "this worker does not serve the cluster status\n",
    )

    def unreachable() -> dict[str, Any]:
        raise SowstreamError("cannot reach Kafka at 127.0.0.1:1 within 10s (down)")

    health.serve_cluster(unreachable)
    assert get(url + "/status/cluster") == (
        503,
        "could not gather the cluster status: cannot reach Kafka at 127.0.0.1:1 within 10s "
        "(down)\n",
    )
    doc = {"workers": [{"worker": "w-0", "answering": True}], "partitions": []}
    health.serve_cluster(lambda: doc)
    code, body = get(url + "/status/cluster")
    assert code == 200 and orjson.loads(body) == doc
