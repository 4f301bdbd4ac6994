"""The console in a real headless browser: Debian's ``chromium`` driven by Playwright.

The console is served by uvicorn on 127.0.0.1 (a free port) in front of a real broker; the
browser clicks through every page as a person would: create a topic, produce a record
and find it in the record browser, watch a consumer group's lag grow and fall to zero
without reloading, delete a topic through its confirmation page; the pages also work
with JavaScript off, by keyboard, and on a phone-sized screen. A screenshot of each page
goes to ``build/console-screenshots/`` (``TIDELOG_CONSOLE_SCREENSHOTS`` overrides).

Playwright drives the system browser (``executable_path``): nothing is downloaded.
``make venv`` and ``.ci/run`` install ``chromium``; without it these tests fail in CI
(``CI=true``) and skip elsewhere, saying what to install.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from tidelog.broker.cluster.testing import LocalCluster, zookeeper_available
from tidelog.broker.testing import InProcessBroker
from tidelog.client import Consumer, Producer, TopicPartition
from tidelog.client.admin import AdminClient
from tidelog.client.console import ConsoleConfig, create_app

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    _MESSAGE = "no chromium for the browser tests (apt-get install chromium, or `make venv`)"
    if os.environ.get("CI") == "true":
        raise RuntimeError(_MESSAGE)
    pytest.skip(_MESSAGE, allow_module_level=True)

from playwright.sync_api import Browser, Page, expect, sync_playwright  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("TIDELOG_CONSOLE_SCREENSHOTS", ROOT / "build" / "console-screenshots"))
WAIT_MS = 20_000  # every wait in the browser is bounded by this
expect.set_options(timeout=WAIT_MS)


class _Server:
    """uvicorn serving the console on 127.0.0.1:0 in a thread; ``stop`` ends it."""

    def __init__(self, config: ConsoleConfig) -> None:
        self.server = uvicorn.Server(
            uvicorn.Config(
                create_app(config),
                host="127.0.0.1",
                port=0,
                log_level="warning",
                access_log=False,
                lifespan="on",
                ws="none",
            )
        )
        self.thread = threading.Thread(target=self.server.run, name="console", daemon=True)

    def start(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert self.thread.is_alive(), "the console server died"
            assert time.monotonic() < deadline, "the console server did not start"
            time.sleep(0.05)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


@pytest.fixture(scope="module")
def broker() -> Iterator[InProcessBroker]:
    with InProcessBroker() as running:
        yield running


@pytest.fixture(scope="module")
def console_url(broker: InProcessBroker) -> Iterator[str]:
    server = _Server(ConsoleConfig(bootstrap_servers=broker.address, port=0, refresh_ms=1_000))
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(WAIT_MS)
    opened = context.new_page()
    try:
        yield opened
    finally:
        context.close()


def shot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def test_click_through_create_produce_browse_and_delete(
    page: Page, console_url: str, broker: InProcessBroker
) -> None:
    page.goto(console_url + "/")
    expect(page.locator("h1")).to_have_text("Overview")
    expect(page.locator('tr[data-broker="0"]')).to_contain_text("up")
    expect(page.locator('tr[data-broker="0"]')).to_contain_text("controller")
    # The chart draws (uPlot, vendored) once the page has sampled twice.
    expect(page.locator(".chart .uplot")).to_have_count(1, timeout=WAIT_MS)
    shot(page, "overview")

    page.get_by_role("link", name="Topics").click()
    expect(page.locator("h1")).to_have_text("Topics")
    page.get_by_label("Name", exact=True).fill("browser-orders")
    page.get_by_label("Partitions").fill("2")
    page.get_by_role("button", name="Create topic").click()
    expect(page.locator("h1")).to_contain_text("browser-orders")
    expect(page.locator(".flash.ok")).to_have_text("Created topic browser-orders.")
    expect(page.locator("#partitions tbody tr")).to_have_count(2)

    page.get_by_label("Partition", exact=True).last.fill("1")
    page.get_by_label("Key (UTF-8)").fill("customer-9")
    page.get_by_label("Value (UTF-8)").fill('{"order": 1001, "total": 12.5}')
    page.get_by_label("Headers").fill("source=browser-test")
    page.get_by_role("button", name="Send record").click()
    expect(page.locator(".flash.ok")).to_contain_text("partition 1, offset 0")
    record = page.locator('#records tr[data-offset="0"]')
    expect(record).to_contain_text("customer-9")
    expect(record).to_contain_text('"order": 1001')
    expect(record).to_contain_text("source")
    expect(record).to_contain_text("corrected")
    shot(page, "topic")

    # Find it again with the record browser's own form.
    page.get_by_label("Partition", exact=True).first.select_option("1")
    page.get_by_label("From offset").fill("0")
    page.get_by_label("Show values as").select_option("hex")
    page.get_by_role("button", name="Show records").click()
    expect(page.locator('#records tr[data-offset="0"]')).to_contain_text("7b 22 6f 72")

    page.get_by_role("link", name="Topics").click()
    page.get_by_label("Filter by name").fill("browser")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator('tr[data-topic="browser-orders"]')).to_be_visible()
    page.get_by_role("link", name="Partitions").click()  # sort by partitions
    expect(page.locator("th[aria-sort]")).to_contain_text("Partitions")
    shot(page, "topics")

    page.get_by_role("link", name="browser-orders").click()
    page.get_by_role("link", name="Delete this topic…").click()
    expect(page.locator("h1")).to_contain_text("Delete topic")
    shot(page, "confirm-delete")
    page.get_by_label("Type the topic's name to confirm").fill("wrong-name")
    page.get_by_role("button", name="Delete browser-orders").click()
    expect(page.locator(".flash.error")).to_contain_text("Type the topic's name")
    page.get_by_label("Type the topic's name to confirm").fill("browser-orders")
    page.get_by_role("button", name="Delete browser-orders").click()
    expect(page.locator(".flash.ok")).to_have_text("Deleted topic browser-orders.")
    expect(page.locator('tr[data-topic="browser-orders"]')).to_have_count(0)
    with AdminClient(broker.address) as admin:
        assert "browser-orders" not in {t.name for t in admin.list_topics()}


def test_group_lag_grows_and_falls_to_zero_live(
    page: Page, console_url: str, broker: InProcessBroker
) -> None:
    topic, group = "browser-events", "browser-readers"
    with AdminClient(broker.address) as admin:
        admin.create_topic(topic, 1)
    tp = TopicPartition(topic, 0)
    with Producer(broker.address, acks=1) as producer:
        for i in range(5):
            producer.send(topic, value=f"event {i}".encode())
        producer.flush()
    member = Consumer(
        broker.address, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False
    )
    try:
        member.subscribe([topic])
        deadline = time.monotonic() + 30
        while tp not in member.assignment():
            assert time.monotonic() < deadline, "no assignment"
            member.poll(timeout_ms=100, max_records=1)
        member.commit({tp: 0})

        page.goto(console_url + "/groups")
        expect(page.locator(f'tr[data-group="{group}"]')).to_contain_text("1")
        shot(page, "groups")
        page.get_by_role("link", name=group).click()
        expect(page.locator("#total-lag")).to_have_text("5")
        expect(page.locator("#group-members")).to_have_text("1")
        # No reset while it has members.
        expect(page.get_by_role("button", name="Review the reset…")).to_be_disabled()
        # More records: the lag grows on the open page, with no reload (live updates).
        page.evaluate("window.notReloaded = true")
        with Producer(broker.address, acks=1) as producer:
            for i in range(7):
                producer.send(topic, value=f"more {i}".encode())
            producer.flush()
        expect(page.locator("#total-lag")).to_have_text("12", timeout=WAIT_MS)
        # Consume everything and commit: the lag falls to zero, still without a reload.
        deadline = time.monotonic() + 30
        while member.position(tp) < 12:
            assert time.monotonic() < deadline, f"read up to {member.position(tp)} of 12"
            member.poll(timeout_ms=200)
        member.commit()
        expect(page.locator("#total-lag")).to_have_text("0", timeout=WAIT_MS)
        assert page.evaluate("window.notReloaded") is True
        expect(page.locator(".chart .uplot")).to_have_count(1)
        shot(page, "group")
        # The overview's live chart and figures follow traffic made while it is open.
        page.goto(console_url + "/")
        with Producer(broker.address, acks=1) as producer:
            for _ in range(16):
                for i in range(50):
                    producer.send(topic, value=f"burst {i}".encode())
                producer.flush()
                member.poll(timeout_ms=250)
                member.commit()
                time.sleep(0.3)  # traffic spread over a few of the page's refreshes
        expect(page.locator("#produce-rate")).not_to_have_text("\u2013")
        expect(page.locator("#consume-rate")).not_to_have_text("\u2013")
        expect(page.locator(".chart")).to_have_attribute("data-points", re.compile(r"[4-9]|\d\d"))
        shot(page, "overview-rates")
    finally:
        member.close(autocommit=False)
    # Empty now: reset to the earliest offset through the confirmation page.
    page.goto(console_url + f"/groups/{group}")
    expect(page.locator("#group-members")).to_have_text("0", timeout=WAIT_MS)
    page.reload()
    page.get_by_role("button", name="Review the reset…").click()
    expect(page.locator("h1")).to_contain_text("Reset group")
    page.get_by_role("button", name="Reset offsets").click()
    expect(page.locator(".flash.ok")).to_contain_text("Reset 1 partition(s)")
    expect(page.locator("#total-lag")).to_have_text("812")


def test_a_group_whose_id_has_slashes_spaces_and_accents(
    page: Page, console_url: str, broker: InProcessBroker
) -> None:
    topic, group = "browser-awkward", "ops/eu west?#1 100% ünïcode ✓"
    with AdminClient(broker.address) as admin:
        admin.create_topic(topic, 1)
    tp = TopicPartition(topic, 0)
    with Producer(broker.address, acks=1) as producer:
        for i in range(6):
            producer.send(topic, value=f"awkward {i}".encode())
        producer.flush()
    member = Consumer(
        broker.address, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False
    )
    try:
        member.subscribe([topic])
        deadline = time.monotonic() + 30
        while tp not in member.assignment():
            assert time.monotonic() < deadline, "no assignment"
            member.poll(timeout_ms=100, max_records=1)
        member.commit({tp: 2})
        page.goto(console_url + "/groups")
        page.get_by_role("link", name=group).click()
        expect(page.locator("h1")).to_have_text(f"Group {group}")
        assert "/groups/ops%2Feu%20west%3F%231%20100%25%20" in page.url
        expect(page.locator("#total-lag")).to_have_text("4")
        expect(page.locator("#group-members")).to_have_text("1")
        expect(page.locator(".chart .uplot")).to_have_count(1)  # its chart's JSON too
    finally:
        member.close(autocommit=False)
    # Empty now (the live page follows): reset through the confirmation page.
    expect(page.locator("#group-members")).to_have_text("0")
    page.reload()
    page.get_by_role("button", name="Review the reset…").click()
    expect(page.locator("h1")).to_have_text(f"Reset group {group}?")
    page.get_by_role("button", name="Reset offsets").click()
    expect(page.locator(".flash.ok")).to_have_text(f"Reset 1 partition(s) of group {group}.")
    expect(page.locator("#total-lag")).to_have_text("6")
    shot(page, "group-awkward-id")


@pytest.mark.timeout(60)
def test_a_cluster_with_a_broker_killed(browser: Browser) -> None:
    """A real three-broker cluster; one broker SIGKILLed while the overview is open: the
    page shows it down and partitions offline by itself, and the topic page still works."""
    if not zookeeper_available():
        if os.environ.get("CI") == "true":
            pytest.fail("CI needs libzookeeper-java and java for the cluster tests")
        pytest.skip("no ZooKeeper (apt-get install libzookeeper-java)")
    began = time.monotonic()
    settings = {"replica.lag.time.max.ms": 2_000}
    with LocalCluster(brokers=3, settings=settings) as cluster:
        with AdminClient(cluster.bootstrap, request_timeout_ms=15_000) as admin:
            admin.create_topic("spread", 3, replication_factor=1)
            admin.create_topic("safe", 2, replication_factor=3)
            controller = admin.describe_cluster().controller_id
            leaders = {p.partition: p.leader for p in admin.describe_topic("spread").partitions}
        victim = next(b for b in cluster.broker_ids if b != controller and b in leaders.values())
        lost = sorted(p for p, leader in leaders.items() if leader == victim)
        kept = sorted(p for p, leader in leaders.items() if leader != victim)
        server = _Server(
            ConsoleConfig(
                bootstrap_servers=cluster.bootstrap,
                port=0,
                refresh_ms=1_000,
                request_timeout_ms=3_000,
            )
        )
        url = server.start()
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        context.set_default_timeout(WAIT_MS)
        try:
            page = context.new_page()
            page.goto(url + "/")
            for broker_id in cluster.broker_ids:
                expect(page.locator(f'tr[data-broker="{broker_id}"]')).to_contain_text("up")
            expect(page.locator("#total-offline")).to_have_text("0")
            page.evaluate("window.notReloaded = true")

            cluster.kill(victim)
            # The open page updates itself: the broker down, its partitions offline.
            expect(page.locator(f'tr[data-broker="{victim}"]')).to_contain_text("down")
            expect(page.locator("#total-offline")).not_to_have_text("0")
            for broker_id in cluster.broker_ids:
                if broker_id != victim:
                    expect(page.locator(f'tr[data-broker="{broker_id}"]')).to_contain_text("up")
            assert page.evaluate("window.notReloaded") is True
            shot(page, "overview-broker-down")

            page.get_by_role("link", name="Topics").click()
            expect(page.locator('tr[data-topic="spread"]')).to_be_visible()
            page.get_by_role("link", name="spread", exact=True).click()
            expect(page.locator("h1")).to_contain_text("spread")
            for p in lost:
                expect(page.locator(f'#partitions tr[data-partition="{p}"]')).to_contain_text(
                    "offline"
                )
            for p in kept:
                row = page.locator(f'#partitions tr[data-partition="{p}"]')
                expect(row).not_to_contain_text("offline")
            # Still working: produce to a live partition and find the record.
            page.get_by_label("Partition", exact=True).last.fill(str(kept[0]))
            page.get_by_label("Value (UTF-8)").fill("after the kill")
            page.get_by_role("button", name="Send record").click()
            expect(page.locator(".flash.ok")).to_contain_text(f"partition {kept[0]}, offset 0")
            expect(page.locator('#records tr[data-offset="0"]')).to_contain_text("after the kill")
            shot(page, "topic-broker-down")
        finally:
            context.close()
            server.stop()
    assert time.monotonic() - began < 60


UNLABELLED = """() => Array.from(document.querySelectorAll("input, select, textarea"))
    .filter((e) => e.type !== "hidden" && !e.labels.length && !e.getAttribute("aria-label"))
    .map((e) => e.name || e.id)"""


def test_labels_keyboard_and_a_phone_screen(
    page: Page, console_url: str, broker: InProcessBroker
) -> None:
    page.goto(console_url + "/security")
    expect(page.locator("h1")).to_have_text("Security")
    shot(page, "security")
    # Every field of every page has a label, and every page one h1.
    with AdminClient(broker.address) as admin:
        admin.create_topic("labelled", 1)
    for path in ("/", "/topics", "/topics/labelled", "/topics/labelled/delete", "/groups",
                 "/security"):  # fmt: skip
        page.goto(console_url + path)
        assert page.evaluate(UNLABELLED) == [], path
        expect(page.locator("h1")).to_have_count(1)
    # Keyboard: the first Tab reaches the skip link, which moves focus to the content.
    page.goto(console_url + "/topics")
    page.keyboard.press("Tab")
    expect(page.locator(":focus")).to_have_text("Skip to content")
    page.keyboard.press("Enter")
    expect(page.locator(":focus")).to_have_attribute("id", "main")
    # The navigation is reachable by Tab from the top and opens with Enter.
    page.goto(console_url + "/topics")
    for _ in range(8):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent") == "Groups":
            break
    page.keyboard.press("Enter")
    expect(page.locator("h1")).to_have_text("Groups")
    # A phone-sized screen: nothing wider than the screen but the tables' own scrollers.
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(console_url + "/")
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 1
    shot(page, "overview-phone")


def test_pages_work_with_javascript_off(browser: Browser, console_url: str) -> None:
    context = browser.new_context(java_script_enabled=False)
    context.set_default_timeout(WAIT_MS)
    try:
        page = context.new_page()
        page.goto(console_url + "/topics")
        page.get_by_label("Name", exact=True).fill("no-script")
        page.get_by_role("button", name="Create topic").click()
        expect(page.locator(".flash.ok")).to_have_text("Created topic no-script.")
        page.get_by_label("Value (UTF-8)").fill("plain html")
        page.get_by_role("button", name="Send record").click()
        expect(page.locator('#records tr[data-offset="0"]')).to_contain_text("plain html")
        for path in ("/", "/groups", "/security"):
            page.goto(console_url + path)
            expect(page.locator("table").first).to_be_visible()
        expect(page.locator("#live-toggle")).to_be_hidden()  # shown by the script only
    finally:
        context.close()


def test_login_in_the_browser(browser: Browser, tmp_path: Path) -> None:
    from tidelog.broker.core.scram import credential_from_password
    from tidelog.broker.core.users import FileUserStore

    users = FileUserStore.open(tmp_path)
    users.upsert("root", credential_from_password("SCRAM-SHA-256", "root-secret"))
    security = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256"}
    settings = {"security.protocol": "SASL_PLAINTEXT"}
    with InProcessBroker(tmp_path, settings=settings) as secured:
        server = _Server(
            ConsoleConfig(bootstrap_servers=secured.address, port=0, security=security)
        )
        url = server.start()
        context = browser.new_context()
        context.set_default_timeout(WAIT_MS)
        try:
            page = context.new_page()
            page.goto(url + "/topics")
            expect(page.locator("h1")).to_have_text("Log in")
            page.get_by_label("User name").fill("root")
            page.get_by_label("Password").fill("not-it")
            page.get_by_role("button", name="Log in").click()
            expect(page.locator(".flash.error")).to_contain_text("refused")
            assert "not-it" not in page.url
            shot(page, "login")
            page.get_by_label("User name").fill("root")
            page.get_by_label("Password").fill("root-secret")
            page.get_by_role("button", name="Log in").click()
            expect(page.locator("h1")).to_have_text("Topics")  # back where it was going
            expect(page.locator(".who")).to_contain_text("Signed in as root")
            assert "root-secret" not in page.url
            page.get_by_role("button", name="Log out").click()
            expect(page.locator("h1")).to_have_text("Log in")
        finally:
            context.close()
            server.stop()
