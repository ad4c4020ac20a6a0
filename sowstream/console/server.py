"""The console's web server: aiohttp serving the page, a JSON API and one websocket per page.

The sowstream :class:`~sowstream.client.Client` runs here, one per identity (so the engine's
entitlements apply to what each user sees); its blocking calls run in threads. A page's
websocket carries its live subscription's row events and, every ``poll`` seconds, the fleet:
partitions, their workers, log lag, throughput and latency as the console measures them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import WSCloseCode, WSMsgType, web
from aiohttp.typedefs import Handler
from confluent_kafka import Consumer, KafkaException, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from sowstream.auth import Auth as Credential
from sowstream.auth import BearerAuth, HmacAuth
from sowstream.client import Client, Subscription
from sowstream.client.topics import TopicInfo
from sowstream.console.auth import COOKIE, Auth
from sowstream.console.rows import KEY, LiveGrid, body, cells
from sowstream.errors import CommandFailedError, SowstreamError
from sowstream.filters import FilterError
from sowstream.wire.kafka import quiet

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
DEFAULT_ROWS = 1000  # a query without top_n shows at most this many rows
HISTORY = 120  # fleet samples kept for the charts


@dataclass(frozen=True)
class Settings:
    """Where the engine is and how the console reaches it."""

    bootstrap: str
    prefix: str = "sowstream"
    kafka: dict[str, str] = field(default_factory=dict)
    poll: float = 2.0  # seconds between fleet samples
    metrics: tuple[str, ...] = ()  # workers' Prometheus endpoints (http://host:port/metrics)
    # What the console's client proves itself with to an engine that checks credentials
    # (engine.authentication); None: it sends none, and such an engine refuses its commands.
    credential: Credential | None = None


# Environment variables that give the console (as the CLI) its engine credential.
CREDENTIAL_VARIABLES = "SOWSTREAM_TOKEN, or SOWSTREAM_HMAC_SECRET with SOWSTREAM_IDENTITY"
# Reasons the engine refuses a command for its credential (sowstream.auth).
CREDENTIAL_REASONS = frozenset({"authentication_failed", "not_entitled"})


def describe_credential(credential: Credential | None) -> str:
    """What the console proves itself with, in a line for its start and its session answer."""
    if credential is None:
        return (
            f"no engine credential ({CREDENTIAL_VARIABLES} unset): an engine that requires "
            "authentication refuses the console's queries and subscriptions"
        )
    if isinstance(credential, HmacAuth):
        return (
            f"engine credential: HMAC for identity {credential.identity!r}; every console user "
            "acts as it on the engine"
        )
    if isinstance(credential, BearerAuth):
        return (
            "engine credential: a JWT (SOWSTREAM_TOKEN); every console user acts as its "
            "subject on the engine"
        )
    return f"engine credential: {type(credential).__name__}"


# Worker counters the fleet charts, summed over topics and workers.
SCRAPED = {
    "sowstream_updates_applied": "updates",
    "sowstream_subscription_messages": "delivered",
    "sowstream_query_seconds": "query",
}


def scrape(url: str) -> dict[str, float]:
    """One worker's totals: updates applied, messages delivered, query count and seconds."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    totals = {"updates": 0.0, "delivered": 0.0, "query_count": 0.0, "query_sum": 0.0}
    for family in text_string_to_metric_families(text):
        name = SCRAPED.get(family.name)
        for sample in family.samples if name else ():
            if name == "query":
                if sample.name.endswith("_count"):
                    totals["query_count"] += sample.value
                elif sample.name.endswith("_sum"):
                    totals["query_sum"] += sample.value
            elif name and sample.name.endswith("_total"):
                totals[name] += sample.value
    return totals


def error_body(
    exc: BaseException, credential: Credential | None = None, **fields: str | None
) -> dict[str, Any]:
    """An error for the page; a filter error names the field and the position in it; a refusal
    of the console's credential says what the console proves itself with (or that it has
    nothing to prove itself with)."""
    out: dict[str, Any] = {"error": str(exc)}
    if isinstance(exc, CommandFailedError) and exc.reason in CREDENTIAL_REASONS:
        out["reason"] = exc.reason
        out["credential"] = describe_credential(credential)
        if credential is None:
            out["error"] = (
                f"{exc}; the console has no engine credential: set {CREDENTIAL_VARIABLES} "
                "where it runs"
            )
    if isinstance(exc, FilterError):
        # validate_query checks the filter and the OrderBy with one error type: say which.
        named = [name for name, text in fields.items() if text and text == exc.text]
        out.update(
            field=named[0] if named else "filter",
            position=exc.position,
            line=exc.line,
            column=exc.column,
            reason=exc.reason,
        )
    return out


def topic_row(info: TopicInfo) -> dict[str, Any]:
    """A topic's definition as the topics view lists it."""
    kind = "queue" if info.queue else "view" if info.view_of else "SOW" if info.sow else "topic"
    return {
        "name": info.name,
        "kind": kind,
        "message_type": info.message_type,
        "keys": ", ".join(info.keys),
        "partitions": info.partitions,
        "view_of": ", ".join(info.view_of),
        "queue_of": ", ".join(info.queue_of),
        "pattern": info.pattern,
        "auto": info.auto,
        "log_topic": info.log_topic,
        "preprocessing": "; ".join(info.preprocessing),
    }


class Clients:
    """One connected client per identity, created on first use, closed with the console."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._clients: dict[str, Client] = {}
        self._lock = threading.Lock()

    def get(self, identity: str) -> Client:
        """The identity's client (blocking: call from a thread). With a credential there is one
        client, acting as the identity the credential proves: the engine refuses a client that
        claims another identity than its credential's."""
        credential = self.settings.credential
        if credential is not None:
            identity = ""
        with self._lock:
            client = self._clients.get(identity)
            if client is None:
                client = Client(
                    self.settings.bootstrap,
                    prefix=self.settings.prefix,
                    config=self.settings.kafka,
                    identity=identity,  # the identity may hold characters topic names cannot
                    auth=credential,
                ).connect()
                self._clients[identity] = client
            return client

    def close(self) -> None:
        """Close every client (their reply topics go)."""
        with self._lock:
            for client in self._clients.values():
                with contextlib.suppress(Exception):
                    client.close()
            self._clients.clear()


class Fleet:
    """Samples of the fleet: status rows, log ends, and the rates and latency derived from them.

    Throughput is computed by the console: records the workers applied per second (growth of
    the partitions' watermarks) and records published per second (growth of the log ends).
    Latency is the round trip of the status command through Kafka and every partition's worker.
    With the workers' Prometheus endpoints given, their own counters are charted too: updates
    applied and messages delivered per second, and the mean time to answer a partition query.
    """

    def __init__(self, clients: Clients, settings: Settings) -> None:
        self.clients = clients
        self.settings = settings
        self.samples: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self._last: tuple[float, dict[str, int], dict[str, int]] | None = None
        self._consumer: Consumer | None = None
        self._scraped: tuple[float, dict[str, float]] | None = None

    def sample(self) -> dict[str, Any]:
        """Take one sample (blocking: call from a thread)."""
        client = self.clients.get("")
        started = time.monotonic()
        rows = client.status()
        latency_ms = (time.monotonic() - started) * 1000
        infos = {info.name: info for info in client.topics.values()}
        applied: dict[str, int] = {}
        published: dict[str, int] = {}
        for row in rows:
            info = infos.get(row["topic"])
            end = self._log_end(info.log_topic, row["partition"]) if info else None
            done = int(row.get("watermark", -1)) + 1
            row["log_end"] = end
            row["lag"] = max(0, end - done) if end is not None and row.get("sow", True) else None
            applied[row["topic"]] = applied.get(row["topic"], 0) + done
            published[row["topic"]] = published.get(row["topic"], 0) + (end or 0)
        now = time.time()
        rates: dict[str, dict[str, float]] = {}
        if self._last is not None:
            then, applied0, published0 = self._last
            dt = max(now - then, 1e-3)
            for topic in applied:
                rates[topic] = {
                    "applied": max(0, applied[topic] - applied0.get(topic, applied[topic])) / dt,
                    "published": max(0, published[topic] - published0.get(topic, published[topic]))
                    / dt,
                }
        self._last = (now, applied, published)
        sample = {
            **self._worker_rates(now),
            "time": now,
            "rows": rows,
            "rates": rates,
            "applied_per_s": sum(r["applied"] for r in rates.values()),
            "published_per_s": sum(r["published"] for r in rates.values()),
            "status_ms": latency_ms,
        }
        self.samples.append(sample)
        return sample

    def _worker_rates(self, now: float) -> dict[str, Any]:
        """Rates from the workers' Prometheus counters since the last sample (none: no URLs)."""
        if not self.settings.metrics:
            return {}
        totals = {"updates": 0.0, "delivered": 0.0, "query_count": 0.0, "query_sum": 0.0}
        errors = []
        for url in self.settings.metrics:
            try:
                for name, value in scrape(url).items():
                    totals[name] += value
            except (OSError, ValueError) as exc:  # a worker down or not Prometheus: say which
                errors.append(f"{url}: {exc}")
        rates: dict[str, Any] = {"metrics_errors": errors}
        if self._scraped is not None:
            then, before = self._scraped
            dt = max(now - then, 1e-3)
            queries = totals["query_count"] - before["query_count"]
            rates.update(
                worker_updates_per_s=max(0.0, totals["updates"] - before["updates"]) / dt,
                worker_delivered_per_s=max(0.0, totals["delivered"] - before["delivered"]) / dt,
                worker_query_ms=(
                    (totals["query_sum"] - before["query_sum"]) / queries * 1000
                    if queries > 0
                    else None
                ),
            )
        self._scraped = (now, totals)
        return rates

    def _log_end(self, log_topic: str, partition: int) -> int | None:
        if self._consumer is None:
            self._consumer = Consumer(
                quiet(
                    {
                        "bootstrap.servers": self.settings.bootstrap,
                        "group.id": "sowstream-console-watermarks",  # never joins: offsets only
                        "log_level": 4,
                        **self.settings.kafka,
                    }
                )
            )
        try:
            _, high = self._consumer.get_watermark_offsets(
                TopicPartition(log_topic, partition), timeout=5, cached=False
            )
        except KafkaException:
            return None
        return int(high)

    def close(self) -> None:
        """Close the watermark consumer."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


class Console:
    """The application: routes, the fleet poller and the open pages."""

    def __init__(self, settings: Settings, auth: Auth) -> None:
        self.settings = settings
        self.auth = auth
        self.clients = Clients(settings)
        self.fleet = Fleet(self.clients, settings)
        self.pages: set[web.WebSocketResponse] = set()
        self.query_ms: deque[tuple[float, float]] = deque(maxlen=HISTORY)
        self._poller: asyncio.Task[None] | None = None

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application(middlewares=[self._guard])
        app.router.add_get("/", self.index)
        app.router.add_static("/static", STATIC)
        app.router.add_post("/api/login", self.login)
        app.router.add_post("/api/logout", self.logout)
        app.router.add_get("/api/session", self.session)
        app.router.add_get("/api/topics", self.topics)
        app.router.add_post("/api/query", self.query)
        app.router.add_get("/api/fleet", self.fleet_now)
        app.router.add_get("/ws", self.websocket)
        app.on_startup.append(self._start)
        # Pages are closed on shutdown, before aiohttp waits for the handlers to finish: an open
        # websocket would otherwise hold a stopping console for the whole shutdown timeout.
        app.on_shutdown.append(self._close_pages)
        app.on_cleanup.append(self._stop)
        return app

    # -- auth --------------------------------------------------------------------------------

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every API call and the websocket need an identity; the page and its files do not."""
        open_paths = ("/", "/api/login", "/api/session")
        if request.path in open_paths or request.path.startswith("/static/"):
            return await handler(request)
        identity = self.auth.identity(
            request.cookies.get(COOKIE), request.headers.get("Authorization")
        )
        if identity is None:
            return web.json_response({"error": "login required"}, status=401)
        request["identity"] = identity
        return await handler(request)

    async def login(self, request: web.Request) -> web.Response:
        """Trade a token for a session cookie."""
        try:
            token = str((await request.json()).get("token", ""))
        except (ValueError, AttributeError):
            return web.json_response({"error": 'expected {"token": "..."}'}, status=400)
        session = self.auth.login(token)
        if session is None:
            return web.json_response({"error": "invalid token"}, status=401)
        response = web.json_response({"identity": self.auth.sessions[session]})
        # HttpOnly: scripts never see it; Strict: no other site's page can use it (CSRF).
        response.set_cookie(COOKIE, session, httponly=True, samesite="Strict", path="/")
        return response

    async def logout(self, request: web.Request) -> web.Response:
        """End the session."""
        self.auth.logout(request.cookies.get(COOKIE))
        response = web.json_response({})
        response.del_cookie(COOKIE, path="/")
        return response

    async def session(self, request: web.Request) -> web.Response:
        """Who the page is logged in as (401: show the login form)."""
        identity = self.auth.identity(
            request.cookies.get(COOKIE), request.headers.get("Authorization")
        )
        if identity is None:
            return web.json_response({"error": "login required", "required": True}, status=401)
        return web.json_response(
            {
                "identity": identity,
                "required": self.auth.required,
                "engine_credential": describe_credential(self.settings.credential),
            }
        )

    # -- pages and queries ---------------------------------------------------------------------

    async def index(self, request: web.Request) -> web.FileResponse:
        """The page."""
        return web.FileResponse(STATIC / "index.html")

    async def topics(self, request: web.Request) -> web.Response:
        """Every topic the engine describes on its meta topic."""
        client = await asyncio.to_thread(self.clients.get, request["identity"])
        infos = await asyncio.to_thread(client.refresh_topics)
        rows = sorted((topic_row(i) for i in infos.values()), key=lambda r: r["name"])
        return web.json_response({"topics": rows})

    async def query(self, request: web.Request) -> web.Response:
        """A ``sow`` query as the session's identity: rows for the grid, or the error."""
        try:
            spec = await request.json()
            topic = str(spec["topic"])
        except (ValueError, KeyError, TypeError):
            return web.json_response({"error": 'expected {"topic": ..., ...}'}, status=400)
        filter_ = spec.get("filter") or None
        order_by = spec.get("order_by") or None
        top_n = spec.get("top_n")
        try:
            top_n = int(top_n) if top_n not in (None, "") else None
        except (TypeError, ValueError):
            return web.json_response({"error": f"top_n: not a number: {top_n!r}"}, status=400)
        started = time.monotonic()
        try:
            client = await asyncio.to_thread(self.clients.get, request["identity"])
            messages = await asyncio.to_thread(
                lambda: list(
                    client.sow(topic, filter_, order_by=order_by, top_n=top_n or DEFAULT_ROWS)
                )
            )
        except (SowstreamError, FilterError) as exc:
            body_ = error_body(exc, self.settings.credential, filter=filter_, order_by=order_by)
            return web.json_response(body_, status=400)
        elapsed = (time.monotonic() - started) * 1000
        self.query_ms.append((time.time(), elapsed))
        rows = [{KEY: m.sow_key, **cells(body(m))} for m in messages if m.command == "sow"]
        return web.json_response(
            {
                "rows": rows,
                "elapsed_ms": elapsed,
                "truncated": top_n is None and len(rows) >= DEFAULT_ROWS,
            }
        )

    async def fleet_now(self, request: web.Request) -> web.Response:
        """The fleet's latest sample (taken now if there is none yet)."""
        if not self.fleet.samples:
            try:
                await asyncio.to_thread(self.fleet.sample)
            except SowstreamError as exc:  # the engine refused the status command, say why
                return web.json_response(error_body(exc, self.settings.credential), status=503)
        return web.json_response(self._fleet_message(), dumps=_dumps)

    # -- the websocket: a live grid and the fleet ----------------------------------------------

    async def websocket(self, request: web.Request) -> web.WebSocketResponse:
        """One page: its live subscription (one at a time) and fleet samples."""
        origin = request.headers.get("Origin")
        if origin is not None and origin.split("://", 1)[-1] != request.host:
            # a page of another site must not ride this user's session (cross-site websocket)
            raise web.HTTPForbidden(text="websocket from another origin")
        ws = web.WebSocketResponse(heartbeat=20)
        await ws.prepare(request)
        self.pages.add(ws)
        outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        sender = asyncio.create_task(self._send(ws, outbox))
        live: LiveSubscription | None = None
        try:
            if self.fleet.samples:
                await ws.send_str(_dumps(self._fleet_message()))
            async for frame in ws:
                if frame.type != WSMsgType.TEXT:
                    continue
                try:
                    spec = orjson.loads(frame.data)
                except orjson.JSONDecodeError:
                    await outbox.put({"type": "error", "error": "not JSON"})
                    continue
                if live is not None:
                    await asyncio.to_thread(live.close)
                    live = None
                if spec.get("op") == "subscribe":
                    live = await self._subscribe(request["identity"], spec, outbox)
        finally:
            self.pages.discard(ws)
            if live is not None:
                await asyncio.to_thread(live.close)
            sender.cancel()
        return ws

    async def _subscribe(
        self, identity: str, spec: dict[str, Any], outbox: asyncio.Queue[dict[str, Any]]
    ) -> LiveSubscription | None:
        filter_ = spec.get("filter") or None
        order_by = spec.get("order_by") or None
        top_n = spec.get("top_n") or None
        try:
            client = await asyncio.to_thread(self.clients.get, identity)
            sub = await asyncio.to_thread(
                lambda: client.sow_and_delta_subscribe(
                    str(spec.get("topic", "")),
                    filter_,
                    options="oof",
                    order_by=order_by,
                    top_n=int(top_n) if top_n else None,
                )
            )
        except (SowstreamError, FilterError, ValueError) as exc:
            await outbox.put(
                {
                    "type": "error",
                    **error_body(exc, self.settings.credential, filter=filter_, order_by=order_by),
                }
            )
            return None
        live = LiveSubscription(sub, asyncio.get_running_loop(), outbox)
        await outbox.put({"type": "subscribed", "topic": spec.get("topic")})
        live.start()
        return live

    async def _send(self, ws: web.WebSocketResponse, outbox: asyncio.Queue[dict[str, Any]]) -> None:
        while True:
            message = await outbox.get()
            with contextlib.suppress(ConnectionResetError, RuntimeError):  # the page went
                await ws.send_str(_dumps(message))

    def _fleet_message(self) -> dict[str, Any]:
        latest = self.fleet.samples[-1] if self.fleet.samples else {}
        return {
            "type": "fleet",
            "rows": latest.get("rows", []),
            "rates": latest.get("rates", {}),
            "series": [
                {
                    "time": s["time"],
                    "applied_per_s": s["applied_per_s"],
                    "published_per_s": s["published_per_s"],
                    "status_ms": s["status_ms"],
                    "worker_updates_per_s": s.get("worker_updates_per_s"),
                    "worker_delivered_per_s": s.get("worker_delivered_per_s"),
                    "worker_query_ms": s.get("worker_query_ms"),
                }
                for s in self.fleet.samples
            ],
            "queries": [{"time": t, "ms": ms} for t, ms in self.query_ms],
            "prometheus": bool(self.settings.metrics),
            "metrics_errors": latest.get("metrics_errors", []),
        }

    async def _poll(self) -> None:
        """Sample the fleet while pages are open and push each sample to them."""
        while True:
            if self.pages:
                try:
                    await asyncio.to_thread(self.fleet.sample)
                except (SowstreamError, KafkaException) as exc:
                    log.warning(
                        "fleet sample failed: %s",
                        error_body(exc, self.settings.credential)["error"],
                    )
                else:
                    text = _dumps(self._fleet_message())
                    for ws in list(self.pages):
                        with contextlib.suppress(ConnectionResetError, RuntimeError):
                            await ws.send_str(text)
            await asyncio.sleep(self.settings.poll)

    async def _start(self, app: web.Application) -> None:
        self._poller = asyncio.create_task(self._poll())

    async def _close_pages(self, app: web.Application) -> None:
        for ws in list(self.pages):
            await ws.close(code=WSCloseCode.GOING_AWAY, message=b"console stopping")

    async def _stop(self, app: web.Application) -> None:
        if self._poller is not None:
            self._poller.cancel()
        await asyncio.to_thread(self.clients.close)
        self.fleet.close()


class LiveSubscription:
    """A subscription read in a thread; each message becomes a row event in the page's outbox."""

    def __init__(
        self,
        sub: Subscription,
        loop: asyncio.AbstractEventLoop,
        outbox: asyncio.Queue[dict[str, Any]],
    ) -> None:
        self.sub = sub
        self.loop = loop
        self.outbox = outbox
        self.grid = LiveGrid()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="console-live", daemon=True)

    def start(self) -> None:
        """Start reading."""
        self._thread.start()

    def _put(self, message: dict[str, Any]) -> None:
        self.loop.call_soon_threadsafe(self.outbox.put_nowait, message)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                msg = self.sub.next(timeout=0.25)
            except SowstreamError as exc:  # dropped (slow consumer) or failed
                self._put({"type": "error", "error": str(exc)})
                return
            if msg is None:
                continue
            if msg.command == "group_end":
                self._put({"type": "snapshot_end", "rows": len(self.grid.records)})
                continue
            event = self.grid.apply(msg)
            if event is not None:
                self._put({"type": "row", **event})

    def close(self) -> None:
        """Stop reading and unsubscribe (blocking: call from a thread)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        with contextlib.suppress(SowstreamError):
            self.sub.close()


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj, default=str).decode()
