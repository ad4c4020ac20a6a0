"""The worker's HTTP endpoints: Prometheus metrics and the probes an orchestrator asks.

* ``/live``: the event loop turns. A task of the worker stamps the time every second; the
  endpoint fails once the stamp is older than ``LIVE_STALE_SECONDS`` (a loop held by a stuck
  call answers nothing else either, so restarting the process is the cure).
* ``/ready``: the worker owns its partitions and has restored them (faust's rebalance and
  changelog recovery are over, the subscription registry is read and every partition the
  worker was assigned is loaded, view and conflated-topic input partitions included). The
  worker works this out in its loop at each stamp; the endpoint reports the last answer, and
  fails as well when the loop stopped turning.
* ``/status``: this worker's partitions (topic, partition, watermark, records, warnings), one
  JSON object per line.
* ``/status/cluster``: the document ``sowstream status --json`` prints, gathered by this worker
  as a client would (from its HTTP thread, not the event loop).
* any other path: the Prometheus metrics.

The server runs in its own threads (as prometheus-client's does), so a blocked event loop
cannot keep ``/live`` from answering that it is blocked.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import orjson
from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

BEAT_SECONDS = 1.0
LIVE_STALE_SECONDS = 15.0  # several beats, and far above the longest pause we measured (250 ms)
STATUS_TIMEOUT = 10.0  # seconds /status waits for the loop to gather the rows

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


@dataclass(frozen=True)
class Readiness:
    """Whether the worker may be counted on, and why (shown by ``/ready``)."""

    ready: bool
    reason: str


class Health:
    """What the probes report, written by the event loop and read by the HTTP threads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._beat_at: float | None = None
        self._readiness = Readiness(False, "starting: the worker's event loop has not run yet")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._status: Callable[[], Awaitable[list[dict[str, Any]]]] | None = None
        self._cluster: Callable[[], dict[str, Any]] | None = None

    def beat(self, readiness: Readiness) -> None:
        """The loop turned (called from it), and this is the worker's readiness now."""
        self._beat_at = self._clock()
        self._readiness = readiness

    def live(self) -> Readiness:
        """Whether the event loop turned within ``LIVE_STALE_SECONDS``."""
        if self._beat_at is None:
            return Readiness(False, "starting: the worker's event loop has not run yet")
        age = self._clock() - self._beat_at
        if age > LIVE_STALE_SECONDS:
            return Readiness(False, f"the event loop has not turned for {age:.1f}s")
        return Readiness(True, f"the event loop turned {age:.1f}s ago")

    def ready(self) -> Readiness:
        """The readiness the loop last worked out, provided it still turns."""
        live = self.live()
        return live if not live.ready else self._readiness

    def serve_status(
        self, loop: asyncio.AbstractEventLoop, rows: Callable[[], Awaitable[list[dict[str, Any]]]]
    ) -> None:
        """Let ``/status`` ask ``rows()`` on ``loop`` (called from the loop once it runs)."""
        self._loop = loop
        self._status = rows

    def serve_cluster(self, gather: Callable[[], dict[str, Any]]) -> None:
        """Let ``/status/cluster`` answer ``gather()`` (blocking; run in the HTTP thread)."""
        self._cluster = gather

    def cluster(self) -> dict[str, Any] | Readiness:
        """The cluster's status document, or why there is none."""
        if self._cluster is None:
            return Readiness(False, "this worker does not serve the cluster status")
        try:
            return self._cluster()
        except Exception as exc:  # e.g. the broker is away: say so, the server keeps serving
            return Readiness(False, f"could not gather the cluster status: {exc}")

    def status(self) -> list[dict[str, Any]] | None:
        """This worker's status rows, or None when the loop cannot answer in time."""
        loop, rows = self._loop, self._status
        if loop is None or rows is None or not self.live().ready:
            return None
        future = asyncio.run_coroutine_threadsafe(_call(rows), loop)
        try:
            return future.result(STATUS_TIMEOUT)
        except FutureTimeout:
            future.cancel()
            return None


async def _call(rows: Callable[[], Awaitable[list[dict[str, Any]]]]) -> list[dict[str, Any]]:
    return await rows()


def wsgi_app(health: Health) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    """The endpoints as one WSGI application."""
    metrics = make_wsgi_app()

    def probe(answer: Readiness, start_response: StartResponse) -> list[bytes]:
        code = "200 OK" if answer.ready else "503 Service Unavailable"
        start_response(code, [("Content-Type", "text/plain; charset=utf-8")])
        return [answer.reason.encode() + b"\n"]

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/live":
            return probe(health.live(), start_response)
        if path == "/ready":
            return probe(health.ready(), start_response)
        if path == "/status/cluster":
            doc = health.cluster()
            if isinstance(doc, Readiness):
                return probe(doc, start_response)
            start_response("200 OK", [("Content-Type", "application/json")])
            return [orjson.dumps(doc)]
        if path == "/status":
            rows = health.status()
            if rows is None:
                return probe(Readiness(False, "the worker did not answer in time"), start_response)
            start_response("200 OK", [("Content-Type", "application/x-ndjson")])
            return [b"".join(orjson.dumps(row) + b"\n" for row in rows)]
        answer: Iterable[bytes] = metrics(environ, start_response)
        return answer

    return app


class _QuietHandler(WSGIRequestHandler):
    """No access log: probes come every few seconds."""

    def log_message(self, format: str, *args: Any) -> None:
        return None


def serve(
    health: Health, host: str, port: int, *, poll_interval: float = 0.5
) -> ThreadingWSGIServer:
    """Serve the endpoints on ``host:port`` from daemon threads; returns the server.

    ``poll_interval`` is how soon ``shutdown()`` is noticed, not a delay for requests."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

    class Server(ThreadingWSGIServer):
        address_family = family

    httpd = make_server(host, port, wsgi_app(health), Server, handler_class=_QuietHandler)
    thread = threading.Thread(
        target=httpd.serve_forever, args=(poll_interval,), name="sowstream-http", daemon=True
    )
    thread.start()
    return httpd
