"""End to end in a real browser: events produced through a gate reach the embedded broker, a live
materializer stores them, `callgate dashboard` serves them, and headless chromium (Debian's, driven
by Playwright) sees the blocked count, then sees it rise without a reload, and the Policy impact page
shows the shadow rule's divergent call. A screenshot of every page is saved in the folder the test
prints. Over a store with a signing gate, the Coverage page shows the signed check and the Call
detail page's Proof button shows a proof whose download verifies offline."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from callgate.broker import EmbeddedBroker, free_port
from consumers.reader import ApiReader, SourceUnavailableError
from events.kafka import KafkaSink
from events.proofs import check_proof
from interceptor_core import Block, Deny, Gate, RunContext, ToolBlockedError, before_tool_call, tool
from interceptor_core.policy import Policy

from .conftest import download

pytestmark = pytest.mark.integration

HOSTILE = "EVIL-1 <img src=https://evil.example/x.png onerror=alert(1)> [phish](https://evil.example/p)"
# Each page's path, its title, and text that shows once its data is drawn.
PAGES = {
    "overview": ("Overview", "Interceptors"),
    "blocked": ("Blocked attempts", "Open call detail"),
    "call": ("Call detail", "Redacted paths"),
    "run": ("Run", "Find a run"),
    "trends": ("Trends", "Denial reasons new in this window"),
    "impact": ("Policy impact", "orders / review-acme-5"),
    "coverage": ("Coverage", "coverage checks"),
    "pipeline": ("Pipeline health", "Dead letters"),
}


@tool
def get_order(order_id: str) -> str:
    """Loads an order."""
    return f"order {order_id}"


@before_tool_call(name="tenant-orders")
def tenant_orders(call: Any) -> Any:
    order = call.args["order_id"]
    if order.startswith("DROP"):
        return Block("DROP is never an order id")
    if not order.startswith("ACME-"):
        return Deny(f"Order {order} does not belong to tenant acme.")
    return None


# A candidate rule in shadow: ACME-5 would be denied (it is allowed), a divergent call.
SHADOW_ORDERS = """\
version: 1
name: orders
rules:
  - id: review-acme-5
    mode: shadow
    tools: [get_order]
    when: "args.order_id == 'ACME-5'"
    decision: deny
    message: "ACME-5 is under review"
  - id: deny-acme-0
    tools: [get_order]
    when: "args.order_id == 'ACME-0'"
    decision: deny
    message: "ACME-0 is closed"
"""


async def publish(bootstrap: str, topic: str, spool: Path, orders: list[str]) -> tuple[int, int]:
    """Call get_order for each order through a gate with a KafkaSink and a shadow rule; (denied,
    blocked) calls."""
    sink = KafkaSink(bootstrap, topic, spool)
    gate = Gate("shop", interceptors=[tenant_orders, Policy.from_text(SHADOW_ORDERS)], sinks=[sink])
    desk = gate.agent("desk", tools=[get_order])
    run = RunContext(tenant="acme", principal="u-1")
    denied = blocked = 0
    for i, order in enumerate(orders):
        try:
            result = await desk.call("get_order", {"order_id": order}, run=run, call_id=f"{spool.name}-{i}")
        except ToolBlockedError:
            blocked += 1
            continue
        denied += result.kind == "denied"
    assert await sink.close(timeout=60)
    return denied, blocked


def publish_now(bootstrap: str, topic: str, spool: Path, orders: list[str]) -> tuple[int, int]:
    """`publish` to completion from a thread of its own (the sync Playwright API owns this thread's loop)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(publish(bootstrap, topic, spool, orders))).result(timeout=90)


def blocked_in_store(api: str) -> int:
    try:
        (row,) = ApiReader(api, timeout_s=2).query("blocked_attempts_count").rows
    except SourceUnavailableError:
        return -1
    return int(row["attempts"])


def stored_attempts(api: str) -> int:
    """The blocked attempts the store holds once its read API answers (earlier tests' calls too)."""
    until(lambda: blocked_in_store(api) >= 0, 60, "the read API answering")
    return blocked_in_store(api)


def until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.1)  # sleep-ok: polling another process with a deadline


def stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def browser(signed_store: Any, browser: Any) -> Any:
    """The module's chromium (tests/dashboard/conftest.py), started after the signed store: that
    store runs a gate with `asyncio.run`, which cannot start while the sync Playwright API holds
    this thread's event loop."""
    return browser


@pytest.fixture
def screenshots(tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]) -> Path:
    """Where the page screenshots go: $CALLGATE_SCREENSHOT_DIR, or a fresh temporary folder; printed."""
    configured = os.environ.get("CALLGATE_SCREENSHOT_DIR")
    folder = Path(configured) if configured else tmp_path_factory.mktemp("dashboard-screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    with capsys.disabled():
        print(f"\ndashboard screenshots: {folder}")
    return folder


@pytest.fixture(scope="module")
def live_stack(kafka_broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A materializer with its read API on a topic of the module's own, and `callgate dashboard` over
    it, shared by the module's tests (each publishes calls of its own, by call id prefix)."""
    tmp_path = tmp_path_factory.mktemp("live-stack")
    started = time.monotonic()
    topic = f"dash-{uuid.uuid4().hex[:8]}"
    api_port, ui_port = free_port("127.0.0.1"), free_port("127.0.0.1")
    api = f"http://127.0.0.1:{api_port}"
    cli = [sys.executable, "-c", "from callgate.cli import main; main()"]
    materializer = subprocess.Popen(
        [
            *cli,
            "materialize",
            "--bootstrap",
            kafka_broker.bootstrap,
            "--topic",
            topic,
            "--db",
            str(tmp_path / "audit.duckdb"),
            "--group",
            f"g-{uuid.uuid4().hex[:8]}",
            "--api",
            f"127.0.0.1:{api_port}",
        ],
        stdout=subprocess.DEVNULL,
    )
    dashboard = subprocess.Popen(
        [*cli, "dashboard", "--api", api, "--port", str(ui_port), "--refresh", "1"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert dashboard.stdout is not None
        line = dashboard.stdout.readline()
        url = f"http://127.0.0.1:{ui_port}"
        assert line.startswith(f"dashboard at {url}"), line
        yield {"topic": topic, "api": api, "url": url, "bootstrap": kafka_broker.bootstrap, "started": started}
    finally:
        stop(dashboard)
        stop(materializer)
        if dashboard.stdout is not None:
            dashboard.stdout.close()


def test_blocked_count_is_live_in_a_real_browser(
    browser: Any, live_stack: dict[str, Any], screenshots: Path, tmp_path: Path
) -> None:
    """The Blocked attempts page shows the produced count, and the higher count after more denials
    arrive, without a reload; the Policy impact page shows the shadow rule's divergent call; hostile
    event text never becomes an image or a link; times are in the browser's zone; every page renders."""
    from playwright.sync_api import expect

    before = stored_attempts(live_stack["api"])
    first = ["GLOBEX-1", "GLOBEX-2", "ACME-3", "DROP-4", HOSTILE, "ACME-5"]
    denied, blocked = publish_now(live_stack["bootstrap"], live_stack["topic"], tmp_path / "first", first)
    assert (denied, blocked) == (3, 1)
    until(lambda: blocked_in_store(live_stack["api"]) == before + 4, 60, "first events stored")

    # Without --timezone, times are shown in the zone the browser reports.
    context = browser.new_context(viewport={"width": 1600, "height": 1100}, timezone_id="Asia/Tokyo")
    try:
        page = context.new_page()
        page.goto(f"{live_stack['url']}/blocked")
        expect(page.get_by_test_id("stSidebar").get_by_text("Asia/Tokyo", exact=True)).to_be_visible(timeout=30_000)
        count = page.get_by_test_id("stMetric").filter(has_text="Matching attempts").get_by_test_id("stMetricValue")
        expect(count).to_have_text(f"{before + 4:,}", timeout=30_000)

        more = ["GLOBEX-6", "GLOBEX-7", "DROP-8", "GLOBEX-9", "GLOBEX-10"]
        publish_now(live_stack["bootstrap"], live_stack["topic"], tmp_path / "second", more)
        expect(count).to_have_text(f"{before + 9:,}", timeout=30_000)  # the live fragment, no reload
        assert page.evaluate("performance.getEntriesByType('navigation').length") == 1

        for path, (title, drawn) in PAGES.items():
            query = "?call_id=first-4" if path == "call" else ""
            # The default page lives at the root; its url_path is only its name in the menu.
            page.goto(f"{live_stack['url']}/{'' if path == 'overview' else path}{query}")
            expect(page.get_by_role("heading", name=title)).to_be_visible(timeout=30_000)
            expect(page.get_by_text("Page not found")).to_have_count(0)
            expect(page.get_by_text(drawn).first).to_be_visible(timeout=30_000)
            # Drawn: the script is not running and no element waits for its data.
            expect(page.get_by_test_id("stApp")).to_have_attribute(
                "data-test-script-state", "notRunning", timeout=30_000
            )
            expect(page.get_by_test_id("stSkeleton")).to_have_count(0, timeout=30_000)
            assert page.locator("img[src*='evil.example'], a[href*='evil.example']").count() == 0
            if path == "impact":
                # The shadow rule's one divergent call (ACME-5), and the command that replays it.
                metric = page.get_by_test_id("stMetric").filter(has_text="Divergent")
                expect(metric.get_by_test_id("stMetricValue")).to_have_text("1")
                expect(page.get_by_text("callgate replay --policy POLICY_FILE").first).to_be_visible()
            page.screenshot(path=str(screenshots / f"{path}.png"), full_page=True)
        # The hostile denial is on the call page, verbatim, as text.
        page.goto(f"{live_stack['url']}/call?call_id=first-4")
        expect(page.get_by_text("onerror=alert(1)", exact=False).first).to_be_visible(timeout=30_000)
        assert page.locator("img[src*='evil.example'], a[href*='evil.example']").count() == 0
    finally:
        context.close()
    assert sorted(p.name for p in screenshots.glob("*.png")) == sorted(f"{p}.png" for p in PAGES)


@pytest.fixture
def signed_dashboard(signed_store: Any, tmp_path: Path) -> Iterator[str]:
    """`callgate dashboard --db` over a copy of the signed store, trusting the signing gate's key; its URL."""
    db = tmp_path / "signed.duckdb"
    shutil.copyfile(signed_store.path, db)
    port = free_port("127.0.0.1")
    cli = [sys.executable, "-c", "from callgate.cli import main; main()"]
    dashboard = subprocess.Popen(
        [*cli, "dashboard", "--db", str(db), "--port", str(port), "--trusted-keys", str(signed_store.keys)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert dashboard.stdout is not None
        url = f"http://127.0.0.1:{port}"
        line = dashboard.stdout.readline()
        assert line.startswith(f"dashboard at {url}"), line
        yield url
    finally:
        stop(dashboard)
        if dashboard.stdout is not None:
            dashboard.stdout.close()


def test_signed_coverage_and_a_downloaded_proof_in_a_real_browser(
    browser: Any, signed_dashboard: str, signed_store: Any, screenshots: Path
) -> None:
    """The Coverage page shows the signed check failing; the Proof button of a covered call shows the
    proof verified with the trusted key and downloads proof-<event_id>.json, which `check_proof`
    accepts with the gate's key, and the call's proofs download holds a verifying proof per event; the
    Proof button of an uncovered call, and its proofs download, say why there is none."""
    from playwright.sync_api import expect

    event_id = next(e.event_id for e in signed_store.events if getattr(e, "call_id", None) == "s-3")
    # A folder of their own: the other test checks that its folder holds exactly its pages.
    shots = screenshots / "signed"
    shots.mkdir(exist_ok=True)
    # A laptop's screen: the violations table's last column ends on it.
    context = browser.new_context(viewport={"width": 1440, "height": 900}, accept_downloads=True)
    try:
        page = context.new_page()
        page.goto(f"{signed_dashboard}/coverage")
        expect(page.get_by_text("FAIL: signed")).to_be_visible(timeout=30_000)
        expect(page.get_by_text("Violations: signed")).to_be_visible()
        expect(page.get_by_test_id("stApp")).to_have_attribute("data-test-script-state", "notRunning")
        grid = page.get_by_test_id("stDataFrame").last
        grid.scroll_into_view_if_needed()
        headers = grid.locator("[role=columnheader]")
        expect(headers.first).to_be_attached(timeout=30_000)
        assert not any("_" in header for header in headers.all_text_contents()), headers.all_text_contents()
        assert all(scroll <= width for scroll, width in fits(page)), fits(page)
        box = grid.bounding_box()
        assert box is not None
        assert box["x"] + box["width"] <= 1440, box
        page.screenshot(path=str(shots / "coverage.png"))

        page.goto(f"{signed_dashboard}/call?call_id=s-3")
        page.get_by_role("button", name="Proof", exact=True).click(timeout=30_000)
        expect(page.get_by_text("signed by a trusted key")).to_be_visible(timeout=30_000)
        downloaded = download(page, "Download proof")
        assert downloaded.suggested_filename == f"proof-{event_id}.json"
        doc = json.loads(Path(downloaded.path()).read_text(encoding="utf-8"))
        assert check_proof(doc, signed_store.key).ok
        page.screenshot(path=str(shots / "call-proof.png"), full_page=True)
        # The call's evidence: every own event's proof, one a line, each verifying with the gate's key.
        downloaded = download(page, "Download inclusion proofs (JSON lines)")
        assert downloaded.suggested_filename == "call-s-3-proofs.jsonl"
        docs = [json.loads(line) for line in Path(downloaded.path()).read_text(encoding="utf-8").splitlines()]
        assert docs
        assert all("no_proof" not in d and check_proof(d, signed_store.key).ok for d in docs)
        assert event_id in {json.loads(d["event"])["event_id"] for d in docs}

        page.goto(f"{signed_dashboard}/call?call_id=u-0")
        page.get_by_role("button", name="Proof", exact=True).click(timeout=30_000)
        expect(page.get_by_text("is not covered by any stored checkpoint")).to_be_visible(timeout=30_000)
        downloaded = download(page, "Download inclusion proofs (JSON lines)")
        docs = [json.loads(line) for line in Path(downloaded.path()).read_text(encoding="utf-8").splitlines()]
        assert docs
        assert all("is not covered by any stored checkpoint" in d["no_proof"] for d in docs)
    finally:
        context.close()


def fits(page: Any) -> list[tuple[int, int]]:
    """Each table's (scroll width, width) in pixels: a wider scroll means columns cut off at the right."""
    widths = page.evaluate(
        "Array.from(document.querySelectorAll('[data-testid=stDataFrame] .dvn-scroller'))"
        ".map(e => [e.scrollWidth, e.clientWidth])"
    )
    return [(int(a), int(b)) for a, b in widths]


def metric(page: Any, label: str) -> Any:
    return page.get_by_test_id("stMetric").filter(has_text=label).get_by_test_id("stMetricValue")


def test_console_keeps_its_place_and_shows_its_evidence_at_1440_px(
    browser: Any, live_stack: dict[str, Any], screenshots: Path, tmp_path: Path
) -> None:
    """At 1440x900 with Live on: a selected Blocked attempts row stays on its call while new rows
    arrive, and Open call detail opens that call; the tenant filter is still set after Call detail ->
    Run -> Blocked attempts; the call of a policy rule shows the rule id and the policy version, the
    stored event and a download of its events; Pipeline health averages over the minutes the pipeline
    ran; no table is wider than its place."""
    from playwright.sync_api import expect

    before = stored_attempts(live_stack["api"])
    first = ["ACME-0", "GLOBEX-1", "DROP-2", "GLOBEX-3"]
    assert publish_now(live_stack["bootstrap"], live_stack["topic"], tmp_path / "console", first) == (3, 1)
    until(lambda: blocked_in_store(live_stack["api"]) == before + 4, 60, "first events stored")
    shots = screenshots / "console"
    shots.mkdir(exist_ok=True)
    context = browser.new_context(viewport={"width": 1440, "height": 900}, accept_downloads=True)
    try:
        page = context.new_page()
        page.goto(f"{live_stack['url']}/blocked")
        expect(metric(page, "Matching attempts")).to_have_text(f"{before + 4:,}", timeout=30_000)
        page.get_by_test_id("stExpander").filter(has_text="Filters").locator("summary").click()
        page.get_by_label("Tenant", exact=True).last.fill("acme")
        page.get_by_label("Tenant", exact=True).last.press("Enter")
        expect(page).to_have_url(re.compile(r"f_tenant=acme"), timeout=30_000)
        expect(metric(page, "Matching attempts")).to_have_text(f"{before + 4:,}", timeout=30_000)
        expect(page.get_by_test_id("stApp")).to_have_attribute("data-test-script-state", "notRunning", timeout=30_000)
        assert all(scroll <= width for scroll, width in fits(page)), fits(page)

        # Select the newest row (the first): its call id is shown, and Live pauses. Live redraws
        # the grid every second until then, so a click that lands during a redraw is made again.
        grid = page.get_by_test_id("stDataFrame").first
        shown = page.get_by_text(re.compile(r"^Selected call: "))
        deadline = time.monotonic() + 60
        while not shown.is_visible():
            assert time.monotonic() < deadline, "no row could be selected in 60 s"
            grid.scroll_into_view_if_needed()  # the opened filters push it down
            box = grid.bounding_box()
            assert box is not None
            page.mouse.click(box["x"] + 16, box["y"] + 35 + 17)
            with contextlib.suppress(AssertionError):
                expect(shown).to_be_visible(timeout=5_000)
        selected = (shown.text_content() or "").removeprefix("Selected call: ")
        assert selected.startswith("console-")
        expect(page.get_by_text("Live is paused while a row is selected")).to_be_visible(timeout=30_000)
        page.screenshot(path=str(shots / "blocked-selected.png"), full_page=True)

        # Newer attempts arrive above the selected row; the next run of the page still opens it.
        publish_now(live_stack["bootstrap"], live_stack["topic"], tmp_path / "console-more", ["GLOBEX-4", "GLOBEX-5"])
        until(lambda: blocked_in_store(live_stack["api"]) == before + 6, 60, "second events stored")
        expect(shown).to_have_text(f"Selected call: {selected}", timeout=30_000)
        page.get_by_role("button", name="Open call detail").click()
        expect(page.get_by_role("heading", name="Call detail")).to_be_visible(timeout=30_000)
        expect(page.get_by_label("Call id")).to_have_value(selected, timeout=30_000)

        # Call detail -> Run -> Blocked attempts: the tenant filter is as it was left.
        page.get_by_role("button", name="Open its run").click(timeout=30_000)
        expect(page.get_by_role("heading", name="Run", exact=True)).to_be_visible(timeout=30_000)
        expect(page.get_by_text("Story", exact=True)).to_be_visible(timeout=30_000)
        page.get_by_test_id("stSidebarNav").get_by_role("link", name="Blocked attempts", exact=True).click()
        expect(page.get_by_role("heading", name="Blocked attempts")).to_be_visible(timeout=30_000)
        expect(page.get_by_label("Tenant", exact=True).last).to_have_value("acme", timeout=30_000)
        expect(page).to_have_url(re.compile(r"f_tenant=acme"), timeout=30_000)
        expect(metric(page, "Matching attempts")).to_have_text(f"{before + 6:,}", timeout=30_000)
        page.screenshot(path=str(shots / "blocked-back.png"), full_page=True)

        # The call a policy rule denied: rule id, policy version, the stored event, its evidence.
        page.goto(f"{live_stack['url']}/call?call_id=console-0")
        expect(page.get_by_text("deny-acme-0").first).to_be_visible(timeout=30_000)
        version = hashlib.sha256(SHADOW_ORDERS.encode()).hexdigest()
        expect(page.get_by_text(version).first).to_be_visible()
        expect(page.get_by_text('"call_id": "console-0"').first).to_be_visible()
        expect(page.get_by_test_id("stApp")).to_have_attribute("data-test-script-state", "notRunning")
        assert all(scroll <= width for scroll, width in fits(page)), fits(page)
        downloaded = download(page, "Download evidence (events as JSON lines)")
        assert downloaded.suggested_filename == "call-console-0.jsonl"
        lines = Path(downloaded.path()).read_text(encoding="utf-8").splitlines()
        stored = ApiReader(live_stack["api"], timeout_s=5).query("call_detail", {"call_id": "console-0"}).rows
        assert [json.loads(line)["event_id"] for line in lines] == [row["event_id"] for row in stored]
        assert {json.loads(line)["call_id"] for line in lines} == {"console-0"}
        page.screenshot(path=str(shots / "call-evidence.png"), full_page=True)

        # Pipeline health: every event was stored minutes ago at most, so the rate is not a
        # fifteenth of them.
        page.goto(f"{live_stack['url']}/pipeline")
        expect(metric(page, "Events stored")).not_to_have_text("0", timeout=30_000)
        stored_events = int((metric(page, "Events stored").text_content() or "0").replace(",", ""))
        rate = int((metric(page, "Events a minute").text_content() or "0").replace(",", ""))
        minutes_ran = max(1.0, (time.monotonic() - live_stack["started"]) / 60)
        assert rate * minutes_ran >= stored_events * 0.9, (rate, stored_events, minutes_ran)
        page.screenshot(path=str(shots / "pipeline.png"), full_page=True)
    finally:
        context.close()
