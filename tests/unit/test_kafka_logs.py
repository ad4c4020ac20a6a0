"""librdkafka's own log lines reach no terminal unless asked for: the client's Kafka clients hand
them to the ``sowstream.kafka`` logger as DEBUG records, and ``sowstream -v`` shows them."""

from __future__ import annotations

import logging
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from confluent_kafka import Producer

from sowstream.wire.kafka import quiet

NOWHERE = "127.0.0.1:1"  # nothing listens: librdkafka logs a failed connect per attempt


def chatty(**conf: object) -> dict[str, object]:
    """Settings under which librdkafka logs at once: a refused connect and its debug lines."""
    return {"bootstrap.servers": NOWHERE, "debug": "broker", **conf}


def test_without_a_logger_librdkafka_writes_to_stderr_itself(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The premise of the tests below: on its own librdkafka prints ``%7|…`` lines."""
    producer = Producer(chatty())
    producer.poll(1)
    del producer
    assert "%7|" in capfd.readouterr().err


def test_quiet_clients_log_through_python_logging_at_debug(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="sowstream.kafka")
    producer = Producer(quiet(chatty()))
    producer.poll(1)
    producer.produce("t", b"never delivered")
    del producer  # "terminating with 1 message still in queue": dropped with the client
    assert capfd.readouterr().err == ""
    lines = [r for r in caplog.records if r.name == "sowstream.kafka"]
    assert lines and {r.levelno for r in lines} == {logging.DEBUG}
    assert all(r.getMessage().startswith("librdkafka ") for r in lines)
    assert any("librdkafka debug: " in r.getMessage() for r in lines)


def test_a_setting_of_the_caller_wins() -> None:
    mine = object()
    assert quiet({"logger": mine, "a": "b"}) == {"logger": mine, "a": "b"}


def sowstream(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sowstream", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_cli_shows_librdkafka_lines_only_with_v() -> None:
    """No broker answers: one error line; with -v librdkafka's connect failures before it."""
    with ThreadPoolExecutor(2) as pool:  # each waits out the CLI's 10 s for a broker: at once
        quiet_run = pool.submit(sowstream, "sow", "orders", "--bootstrap", NOWHERE)
        verbose_run = pool.submit(sowstream, "-v", "sow", "orders", "--bootstrap", NOWHERE)
        plain, verbose = quiet_run.result(), verbose_run.result()
    assert plain.returncode == 1
    assert len(plain.stderr.strip().splitlines()) == 1
    assert plain.stderr.startswith("error: cannot reach Kafka at 127.0.0.1:1")
    assert verbose.returncode == 1
    assert "sowstream.kafka: librdkafka error: FAIL" in verbose.stderr
    assert "Connection refused" in verbose.stderr
    assert verbose.stderr.strip().splitlines()[-1].startswith("error: cannot reach Kafka")
    assert "%3|" not in verbose.stderr  # through logging, not librdkafka's own printing
