"""The web console in a real headless Chromium against a real broker and worker.

Each view is driven as a user would and screenshotted (into docs/console/ when
SOWSTREAM_CONSOLE_SCREENSHOTS says so). The token and
entitlement checks are plain HTTP: no browser is needed to see a 401.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

from sowstream.broker.local import free_port
from sowstream.filters import FilterError
from sowstream.sow.query import validate_query
from tests.support.engine import REPO, EngineProcesses

pytestmark = pytest.mark.integration


# Screenshots go to docs/console/ only when asked (SOWSTREAM_CONSOLE_SCREENSHOTS=docs/console):
# a test run must not change files the repository tracks.
SHOTS = Path(os.environ.get("SOWSTREAM_CONSOLE_SCREENSHOTS") or tempfile.mkdtemp(prefix="console-"))
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,900",
)
TOPICS: list[dict[str, Any]] = [{"Name": "orders", "Key": ["/order"], "Partitions": 2}]
VIEWS: list[dict[str, Any]] = [
    {
        "Name": "BY_CUSTOMER",
        "UnderlyingTopic": "orders",
        "Projection": ["/customer", "SUM(/qty) AS /qty", "COUNT(/order) AS /orders"],
        "Grouping": ["/customer"],
        "Partitions": 1,
    }
]
ENTITLEMENTS = {"alice": {"orders": "/customer = 'alice'"}}
ORDERS = [
    {"order": 1, "customer": "alice", "qty": 5, "px": 101.5},
    {"order": 2, "customer": "bob", "qty": 9, "px": 99.0},
    {"order": 3, "customer": "alice", "qty": 2, "px": 100.25},
    {"order": 4, "customer": "carol", "qty": 7, "px": 98.0},
]


@pytest.fixture(scope="module")
def metrics_port() -> int:
    """Where the worker serves its Prometheus metrics."""
    return free_port()


@pytest.fixture(scope="module")
def engine(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory, metrics_port: int
) -> Iterator[EngineProcesses]:
    procs = EngineProcesses(
        kafka_bootstrap,
        tmp_path_factory.mktemp("console"),
        TOPICS,
        views=VIEWS,
        entitlements=ENTITLEMENTS,
    )
    procs.start("w1", "--metrics-port", str(metrics_port))
    try:
        procs.wait_ready(["orders", "BY_CUSTOMER"])
        with procs.client() as client:
            for order in ORDERS:
                client.publish("orders", order, ack=True)
        yield procs
    finally:
        procs.stop_all()


def http(
    url: str, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, JSON body, headers) of a GET, or of a POST when ``body`` is given."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw or b"{}"), dict(exc.headers)
        except ValueError:
            return exc.code, {"text": raw.decode(errors="replace")}, dict(exc.headers)


class ConsoleProcess:
    """``sowstream console`` as a subprocess, as a user starts it."""

    def __init__(
        self,
        engine: EngineProcesses,
        workdir: Path,
        *args: str,
        env: dict[str, str] | None = None,
    ) -> None:
        """``env``: the console's environment (default: the test's own)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / f"console-{self.port}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "sowstream",
                    "console",
                    "--bootstrap",
                    engine.bootstrap,
                    "--prefix",
                    engine.prefix,
                    "--port",
                    str(self.port),
                    "--poll",
                    "1",
                    *args,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=REPO,
                env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"},
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                http(f"{self.url}/api/session")
                return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.2)
        raise RuntimeError(f"console did not answer:\n{self.log.read_text()}")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def console(
    engine: EngineProcesses, tmp_path_factory: pytest.TempPathFactory, metrics_port: int
) -> Iterator[ConsoleProcess]:
    proc = ConsoleProcess(
        engine,
        tmp_path_factory.mktemp("console-open"),
        "--metrics",
        f"http://127.0.0.1:{metrics_port}/metrics",
    )
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def secured(
    engine: EngineProcesses, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ConsoleProcess]:
    """Bound to every address: a token is required; alice's is entitled to her orders only."""
    proc = ConsoleProcess(
        engine,
        tmp_path_factory.mktemp("console-secured"),
        "--host",
        "0.0.0.0",
        "--user",
        "alice=alice-token",
        "--user",
        "ops=ops-token",
        # nothing listens there: the fleet view says so instead of failing
        "--metrics",
        f"http://127.0.0.1:{free_port()}/metrics",
    )
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail("no Chromium: `make chromium` installs Debian's chromium and chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    profile = tmp_path_factory.mktemp("chromium-profile")
    options.add_argument(f"--user-data-dir={profile}")
    # the Debian driver, never one selenium-manager would download
    driver = webdriver.Chrome(
        options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER)
    )
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def shot(driver: WebDriver, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SHOTS / f"{name}.png"))


def wait(driver: WebDriver, until: Callable[[WebDriver], Any], timeout: float = 20) -> Any:
    return WebDriverWait(
        driver, timeout, poll_frequency=0.05, ignored_exceptions=[StaleElementReferenceException]
    ).until(until)


def view(driver: WebDriver, name: str) -> None:
    driver.find_element(By.CSS_SELECTOR, f'#nav button[data-view="{name}"]').click()
    wait(driver, lambda d: d.find_element(By.ID, f"view-{name}").is_displayed())


def cell(driver: WebDriver, grid: str, key: str, field: str) -> WebElement | None:
    found = driver.find_elements(
        By.CSS_SELECTOR,
        f'#{grid} .tabulator-row[data-key="{key}"] .tabulator-cell[tabulator-field="{field}"]',
    )
    return found[0] if found else None


def column(driver: WebDriver, grid: str, field: str) -> list[str]:
    """The text of a grid's column, top to bottom (read in one script: grids re-render)."""
    return list(
        driver.execute_script(
            "return [...document.querySelectorAll(arguments[0])].map(e => e.textContent)",
            f'#{grid} .tabulator-row .tabulator-cell[tabulator-field="{field}"]',
        )
    )


def text_of(driver: WebDriver, grid: str, key: str, field: str) -> str | None:
    """A cell's text, None when the row or column is not there."""
    found = cell(driver, grid, key, field)
    try:
        return found.text if found is not None else None
    except StaleElementReferenceException:
        return None


def classes(driver: WebDriver, grid: str, key: str, field: str) -> list[str]:
    """A cell's CSS classes."""
    return list(
        driver.execute_script(
            "const e = document.querySelector(arguments[0]); return e ? [...e.classList] : []",
            f'#{grid} .tabulator-row[data-key="{key}"] .tabulator-cell[tabulator-field="{field}"]',
        )
    )


def run_query(driver: WebDriver, filter: str, order_by: str = "", top_n: str = "") -> None:
    view(driver, "query")
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#q-topic option"))
    Select(driver.find_element(By.ID, "q-topic")).select_by_visible_text("orders")
    for field, value in (("q-filter", filter), ("q-order", order_by), ("q-top", top_n)):
        box = driver.find_element(By.ID, field)
        box.clear()
        box.send_keys(value)
    driver.find_element(By.ID, "q-run").click()


@pytest.fixture(scope="module")
def page(browser: WebDriver, console: ConsoleProcess) -> WebDriver:
    browser.get(console.url + "/")
    wait(browser, lambda d: "orders" in d.find_element(By.ID, "topics-grid").text)
    return browser


def test_page_loads_and_lists_the_topics(page: WebDriver) -> None:
    grid = page.find_element(By.ID, "topics-grid").text
    assert "orders" in grid and "BY_CUSTOMER" in grid
    assert "view" in grid  # BY_CUSTOMER's kind
    assert page.find_element(By.ID, "login").is_displayed() is False  # localhost: no login
    shot(page, "topics")


def test_a_query_returns_rows_in_a_sortable_grid(page: WebDriver) -> None:
    run_query(page, "/qty > 2", "/qty DESC")
    wait(page, lambda d: len(column(d, "q-grid", "qty")) == 3)
    assert column(page, "q-grid", "qty") == ["9", "7", "5"]
    assert "3 row(s)" in page.find_element(By.ID, "q-info").text
    # the grid sorts itself by any column: customer, ascending on the first click
    page.find_element(
        By.CSS_SELECTOR, '#q-grid .tabulator-col[tabulator-field="customer"] .tabulator-col-title'
    ).click()
    wait(page, lambda d: column(d, "q-grid", "customer") == ["alice", "bob", "carol"])
    shot(page, "query")


def test_top_n_limits_the_rows(page: WebDriver) -> None:
    run_query(page, "", "/px", "2")
    wait(page, lambda d: column(d, "q-grid", "px") == ["98", "99"])


def test_a_bad_filter_shows_the_error_and_its_position(page: WebDriver) -> None:
    bad = "/qty > 5 AND AND /px < 3"
    with pytest.raises(FilterError) as raised:
        validate_query(filter=bad)
    run_query(page, bad)
    error = wait(
        page,
        lambda d: (
            d.find_element(By.ID, "q-error").is_displayed() and d.find_element(By.ID, "q-error")
        ),
    )
    assert f"position {raised.value.position}" in error.text
    # the caret sits under the offending character of what was typed
    caret_line = error.text.splitlines()[-1]
    assert caret_line.index("^") == len("filter: ") + raised.value.position
    shot(page, "query-error")
    run_query(page, "1=1")  # the error goes with the next good query
    wait(page, lambda d: not d.find_element(By.ID, "q-error").is_displayed())


def test_a_bad_order_by_names_that_field(console: ConsoleProcess) -> None:
    status, body, _ = http(
        f"{console.url}/api/query", {"topic": "orders", "order_by": "/px SIDEWAYS"}
    )
    assert status == 400
    assert body["field"] == "order_by" and "position" in body


def test_an_unknown_topic_is_a_clear_error(console: ConsoleProcess) -> None:
    status, body, _ = http(f"{console.url}/api/query", {"topic": "nope"})
    assert status == 400 and "nope" in body["error"]


def test_live_grid_flashes_changes_adds_rows_and_shows_why_rows_leave(
    page: WebDriver, engine: EngineProcesses
) -> None:
    view(page, "live")
    Select(page.find_element(By.ID, "l-topic")).select_by_visible_text("orders")
    box = page.find_element(By.ID, "l-filter")
    box.clear()
    box.send_keys("/qty > 1")
    page.find_element(By.ID, "l-run").click()
    wait(page, lambda d: d.find_element(By.ID, "l-state").text.startswith("live:"))
    with engine.client() as publisher:
        key = next(m.sow_key for m in publisher.sow("orders", "/order = 2") if m.command == "sow")
        wait(page, lambda d: text_of(d, "l-grid", key, "qty") == "9")

        # a delta_publish changes one cell: it shows within a second, and flashes
        publisher.delta_publish("orders", {"order": 2, "qty": 11})
        publisher.flush()
        WebDriverWait(
            page, 1.0, poll_frequency=0.02, ignored_exceptions=[StaleElementReferenceException]
        ).until(lambda d: text_of(d, "l-grid", key, "qty") == "11")
        assert "flash" in classes(page, "l-grid", key, "qty")
        assert "flash" not in classes(page, "l-grid", key, "customer")

        # a new record appears as a new row
        new_key = publisher.publish("orders", {"order": 5, "customer": "dave", "qty": 3, "px": 97})
        publisher.flush()
        wait(page, lambda d: cell(d, "l-grid", str(new_key), "customer") is not None, 5)

        # a record that stops matching the filter leaves with reason `match`
        publisher.delta_publish("orders", {"order": 3, "qty": 1})
        publisher.flush()
        gone = next(m.sow_key for m in publisher.sow("orders", "/order = 3") if m.command == "sow")
        wait(
            page,
            lambda d: d.find_elements(
                By.CSS_SELECTOR, f'#l-left li[data-key="{gone}"][data-reason="match"]'
            ),
            5,
        )

        # a delete makes the row leave with reason `deleted`
        assert publisher.sow_delete("orders", filter="/order = 2") == 1
        wait(
            page,
            lambda d: d.find_elements(
                By.CSS_SELECTOR, f'#l-left li[data-key="{key}"][data-reason="deleted"]'
            ),
            5,
        )
        shot(page, "live")
        wait(page, lambda d: cell(d, "l-grid", key, "qty") is None, 5)
        assert cell(page, "l-grid", gone, "qty") is None
        assert cell(page, "l-grid", str(new_key), "qty") is not None

        # a bad live filter is refused with its position
        box = page.find_element(By.ID, "l-filter")
        box.clear()
        box.send_keys("/qty >")
        page.find_element(By.ID, "l-run").click()
        error = wait(
            page,
            lambda d: (
                d.find_element(By.ID, "l-error").is_displayed() and d.find_element(By.ID, "l-error")
            ),
        )
        assert "position" in error.text


def test_views_show_a_table_and_a_chart(page: WebDriver) -> None:
    view(page, "views")
    Select(page.find_element(By.ID, "v-view")).select_by_visible_text("BY_CUSTOMER")
    wait(page, lambda d: "alice" in column(d, "v-grid", "customer"))
    Select(page.find_element(By.ID, "v-label")).select_by_visible_text("customer")
    # the chart's labels are the groups, its bars the numeric fields
    labels = wait(
        page,
        lambda d: d.execute_script(
            "const c = Chart.getChart('v-chart');"
            "return c && c.data.labels.includes('alice') && c.data.labels"
        ),
    )
    assert "alice" in labels
    datasets = page.execute_script(
        "return Chart.getChart('v-chart').data.datasets.map(d => d.label)"
    )
    assert set(datasets) >= {"qty", "orders"}
    shot(page, "views")


def test_fleet_shows_partitions_lag_and_rates(page: WebDriver, engine: EngineProcesses) -> None:
    view(page, "fleet")
    wait(page, lambda d: "w1" in column(d, "f-grid", "worker"))
    assert set(column(page, "f-grid", "topic")) >= {"orders", "BY_CUSTOMER"}
    with engine.client() as publisher:
        for i in range(20):
            publisher.publish("orders", {"order": 100 + i, "customer": "eve", "qty": 1})
        publisher.flush()
    # a later sample counts them as throughput
    wait(
        page,
        lambda d: d.execute_script(
            "return Chart.getChart('f-throughput').data.datasets[1].data.some(v => v > 0)"
        ),
        20,
    )
    assert (
        page.execute_script("return Chart.getChart('f-latency').data.datasets[0].data.length") > 1
    )
    wait(page, lambda d: all(x == "0" for x in column(d, "f-grid", "lag")), 20)
    shot(page, "fleet")


def test_off_loopback_a_token_is_required(secured: ConsoleProcess) -> None:
    status, _, _ = http(f"{secured.url}/api/topics")
    assert status == 401
    status, _, _ = http(f"{secured.url}/api/query", {"topic": "orders"})
    assert status == 401
    status, body, _ = http(f"{secured.url}/api/login", {"token": "wrong"})
    assert status == 401 and body["error"] == "invalid token"
    status, _, _ = http(f"{secured.url}/api/login", {"tok": 1})
    assert status == 401
    status, _, _ = http(f"{secured.url}/ws")
    assert status == 401
    status, body, _ = http(
        f"{secured.url}/api/topics", headers={"Authorization": "Bearer ops-token"}
    )
    assert status == 200 and any(t["name"] == "orders" for t in body["topics"])
    # the page itself loads, and shows the login form
    status_code = urllib.request.urlopen(secured.url + "/", timeout=10).status
    assert status_code == 200


def test_an_unreachable_metrics_endpoint_is_reported(secured: ConsoleProcess) -> None:
    ops = {"Authorization": "Bearer ops-token"}
    status, body, _ = http(f"{secured.url}/api/fleet", headers=ops)
    assert status == 200
    assert any(row["topic"] == "orders" for row in body["rows"])  # the rest still works
    assert body["metrics_errors"] and "/metrics" in body["metrics_errors"][0]


def login(console: ConsoleProcess, token: str) -> dict[str, str]:
    status, body, headers = http(f"{console.url}/api/login", {"token": token})
    assert status == 200, body
    cookie = headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    return {"Cookie": cookie.split(";", 1)[0]}


def test_entitlements_hide_what_a_user_may_not_see(secured: ConsoleProcess) -> None:
    alice = login(secured, "alice-token")
    status, body, _ = http(f"{secured.url}/api/session", headers=alice)
    assert body["identity"] == "alice"
    status, body, _ = http(f"{secured.url}/api/query", {"topic": "orders"}, headers=alice)
    assert status == 200
    assert body["rows"] and {r["customer"] for r in body["rows"]} == {"alice"}
    ops = login(secured, "ops-token")
    status, body, _ = http(f"{secured.url}/api/query", {"topic": "orders"}, headers=ops)
    assert {r["customer"] for r in body["rows"]} > {"alice"}
    # a logged-out session is refused again
    http(f"{secured.url}/api/logout", {}, headers=alice)
    status, _, _ = http(f"{secured.url}/api/query", {"topic": "orders"}, headers=alice)
    assert status == 401


def test_the_login_form_logs_in(browser: WebDriver, secured: ConsoleProcess) -> None:
    browser.delete_all_cookies()
    browser.get(secured.url + "/")
    wait(browser, lambda d: d.find_element(By.ID, "login").is_displayed())
    browser.find_element(By.ID, "token").send_keys("nope")
    browser.find_element(By.ID, "login-button").click()
    wait(browser, lambda d: "invalid token" in d.find_element(By.ID, "login-error").text)
    shot(browser, "login")
    box = browser.find_element(By.ID, "token")
    box.clear()
    box.send_keys("alice-token")
    browser.find_element(By.ID, "login-button").click()
    wait(browser, lambda d: d.find_element(By.ID, "who").text == "as alice")
    run_query(browser, "1=1")
    wait(browser, lambda d: column(d, "q-grid", "customer"))
    assert set(column(browser, "q-grid", "customer")) == {"alice"}


def test_a_websocket_from_another_origin_is_refused(console: ConsoleProcess) -> None:
    status, _, _ = http(
        f"{console.url}/ws",
        headers={
            "Origin": "http://evil.example",
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        },
    )
    assert status == 403


def test_a_console_with_a_page_open_stops_at_once(engine: EngineProcesses, tmp_path: Path) -> None:
    """Stopping the console (SIGTERM, as Kubernetes and Ctrl-C do) closes its open pages with
    "going away" rather than waiting for them to leave."""
    console = ConsoleProcess(engine, tmp_path)

    async def page_sees() -> tuple[WSMsgType, int | None]:
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(f"{console.url}/ws", origin=console.url) as ws,
        ):
            console.proc.terminate()
            message = await ws.receive(timeout=15)
            return message.type, ws.close_code

    try:
        kind, code = asyncio.run(page_sees())
        assert (kind, code) == (WSMsgType.CLOSE, 1001)
        console.proc.wait(15)
    finally:
        console.stop()
