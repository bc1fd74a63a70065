"""In a real browser, against `callgate dashboard --db ... --auth tokens.yaml` over a store of real agent
runs (one server for the module): a wrong token is refused; a tenant administrator's login shows its
tenant's numbers only (equal to plain SQL counts) and its CSV export holds its rows only; the Run
page of a nested run shows the parent and child calls in order; a link restores the filters, the
page and the picked call after the login; and every page is drawn, each saved as a screenshot in the
folder the test prints. Debian's chromium, headless, driven by Playwright."""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from callgate.broker import free_port

from .conftest import download

pytestmark = pytest.mark.integration

# Each page a login may reach, its title and text that shows once its data is drawn.
PAGES = {
    "Overview": "Top denied",
    "Blocked attempts": "Open call detail",
    "Call detail": "Call id",
    "Run": "Find a run",
    "Trends": "Denial reasons new in this window",
    "Policy impact": "No call in this window met a shadow decision",
    "Coverage": "coverage checks",
    "Pipeline health": "Dead letters",
}


@pytest.fixture(scope="module")
def served(run_store: Any, token_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`callgate dashboard --db` over a copy of the run store, logins checked against the token file; its URL."""
    db = tmp_path_factory.mktemp("login-dashboard") / "runs.duckdb"
    shutil.copyfile(run_store.path, db)
    port = free_port("127.0.0.1")
    cli = [sys.executable, "-c", "from callgate.cli import main; main()"]
    command = [*cli, "dashboard", "--db", str(db), "--port", str(port), "--auth", str(token_file), "--timezone", "UTC"]
    dashboard = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert dashboard.stdout is not None
        url = f"http://127.0.0.1:{port}"
        line = dashboard.stdout.readline()
        assert line.startswith(f"dashboard at {url}"), line
        yield url
    finally:
        dashboard.terminate()
        try:
            dashboard.wait(30)
        except subprocess.TimeoutExpired:
            dashboard.kill()
            dashboard.wait()
        if dashboard.stdout is not None:
            dashboard.stdout.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where this module's screenshots go: $CALLGATE_SCREENSHOT_DIR/login, or a fresh temporary folder; printed."""
    configured = os.environ.get("CALLGATE_SCREENSHOT_DIR")
    folder = Path(configured) / "login" if configured else tmp_path_factory.mktemp("dashboard-login-screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\ndashboard login screenshots: {folder}")
    return folder


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context (a session of its own) and its page."""
    context = browser.new_context(viewport={"width": 1600, "height": 1100}, accept_downloads=True)
    try:
        yield context.new_page()
    finally:
        context.close()


def drawn(page: Any) -> None:
    """Wait until the script has finished and no element waits for its data."""
    from playwright.sync_api import expect

    expect(page.get_by_test_id("stApp")).to_have_attribute("data-test-script-state", "notRunning", timeout=30_000)
    expect(page.get_by_test_id("stSkeleton")).to_have_count(0, timeout=30_000)


def log_in(page: Any, token: str) -> None:
    from playwright.sync_api import expect

    field = page.get_by_label("Token")
    expect(field).to_be_visible(timeout=30_000)
    field.fill(token)
    page.get_by_role("button", name="Log in").click()


def metric(page: Any, label: str) -> Any:
    return page.get_by_test_id("stMetric").filter(has_text=label).get_by_test_id("stMetricValue").first


def open_filters(page: Any) -> None:
    """Open Blocked attempts' filters (and page size and CSV), collapsed so that a phone's first screen
    shows the results."""
    from playwright.sync_api import expect

    expander = page.get_by_test_id("stExpander").filter(has_text="Filters, page size and CSV")
    expander.locator("summary").click()
    expect(expander.get_by_label("Tool", exact=True)).to_be_visible(timeout=30_000)


def nav(page: Any, title: str) -> None:
    """Open a page through the sidebar's menu (a reload would be a new session, logged out)."""
    page.get_by_test_id("stSidebarNav").get_by_role("link", name=title, exact=True).click()


def test_a_wrong_token_is_refused(page: Any, served: str, shots: Path) -> None:
    """The login asks for a token before anything of the store shows, and refuses one it does not know."""
    from playwright.sync_api import expect

    page.goto(served)
    log_in(page, "tok-nobody")
    expect(page.get_by_text("This token was refused.")).to_be_visible(timeout=30_000)
    expect(page.get_by_test_id("stMetric")).to_have_count(0)
    assert "tok-nobody" not in page.url
    page.screenshot(path=str(shots / "login-refused.png"), full_page=True)


def test_a_tenant_login_shows_only_its_tenant(
    page: Any, served: str, run_store: Any, tokens: dict[str, str], shots: Path
) -> None:
    """Logged in with globex's token: the Overview's calls and blocked figures and the Blocked
    attempts count are globex's plain SQL counts; the CSV export holds globex's rows only; the pages
    that read every tenant are not offered; the token never reaches the URL."""
    from playwright.sync_api import expect

    count = run_store.scalar
    calls = count(
        "select count(*) from events where tenant = 'globex' and type in ('ToolUse', 'ToolDenied', 'Blocked')"
    )
    blocked = count("select count(*) from blocked_attempts where tenant = 'globex'")
    assert calls < count("select count(*) from events where type in ('ToolUse', 'ToolDenied', 'Blocked')")

    page.goto(served)
    log_in(page, tokens["globex-admin"])
    expect(metric(page, "Calls")).to_have_text(f"{calls:,}", timeout=30_000)
    expect(metric(page, "Denied")).to_have_text(
        str(count("select count(*) from events where tenant = 'globex' and type = 'ToolDenied'"))
    )
    drawn(page)
    page.screenshot(path=str(shots / "tenant-overview.png"), full_page=True)
    nav_links = page.get_by_test_id("stSidebarNav").get_by_role("link")
    titles = [text.strip() for text in nav_links.all_inner_texts()]
    assert "Coverage" not in titles
    assert "Pipeline health" not in titles

    nav(page, "Blocked attempts")
    expect(metric(page, "Matching attempts")).to_have_text(str(blocked), timeout=30_000)
    open_filters(page)
    downloaded = download(page, "Download CSV of this filter")
    rows = list(csv.DictReader(io.StringIO(Path(downloaded.path()).read_text(encoding="utf-8"))))
    assert len(rows) == blocked
    assert {row["tenant"] for row in rows} == {"globex"}
    assert tokens["globex-admin"] not in page.url
    drawn(page)
    page.screenshot(path=str(shots / "tenant-blocked.png"), full_page=True)


def test_the_run_page_of_a_nested_run(page: Any, served: str, tokens: dict[str, str], shots: Path) -> None:
    """A link to the Run page of run-desk, opened and logged in, shows the desk's calls in order with
    the research agent's and the helper run's calls indented under the call that ran them, and the
    block that stopped the run."""
    from playwright.sync_api import expect

    page.goto(f"{served}/run?run_id=run-desk")
    log_in(page, tokens["acme-admin"])
    story = page.get_by_test_id("stCode").filter(has_text="ask_research")
    expect(story).to_be_visible(timeout=30_000)
    lines = [line.rstrip() for line in story.inner_text().splitlines() if line.strip()]
    expected = [
        "ask_research: allowed (ok)",
        "    get_order: allowed (ok)",
        "delegate: allowed (ok)",
        "    get_order: denied (deny) [desk-rules]",
        "run_sql: blocked (block) [desk-rules]",
    ]
    positions = [next(i for i, line in enumerate(lines) if line == want) for want in expected]
    assert positions == sorted(positions), lines
    expect(page.get_by_text("a call was blocked, which stopped the run").first).to_be_visible()
    drawn(page)
    page.screenshot(path=str(shots / "run-nested.png"), full_page=True)


def test_a_link_restores_filters_page_and_call(page: Any, served: str, run_store: Any, tokens: dict[str, str]) -> None:
    """A link to Blocked attempts with a window, a tenant filter, a page size and a call, opened and
    logged in, shows exactly that; changing a filter changes the address."""
    from playwright.sync_api import expect

    call_id = next(e.call_id for e in run_store.events if getattr(e, "tool", None) == "run_sql" and e.type == "Blocked")
    page.goto(f"{served}/blocked?window=30d&f_tenant=acme&page_size=50&call={call_id}")
    log_in(page, tokens["auditor"])
    acme = run_store.scalar("select count(*) from blocked_attempts where tenant = 'acme'")
    expect(metric(page, "Matching attempts")).to_have_text(str(acme), timeout=30_000)
    expect(page.get_by_label("Tenant", exact=True).last).to_have_value("acme")
    expect(page.get_by_role("combobox", name="Window")).to_have_value("Last 30 days")
    expect(page.get_by_role("combobox", name="Call", exact=True)).to_have_value(call_id)
    expect(page.get_by_text("Filtered by tenant acme.")).to_be_visible()
    open_filters(page)
    expect(page.get_by_role("combobox", name="Rows per page")).to_have_value("50")
    tool = page.get_by_label("Tool", exact=True)
    tool.fill("run_sql")
    tool.press("Enter")
    expect(page).to_have_url(re.compile(r"[?&]f_tool=run_sql(&|$)"), timeout=30_000)
    assert "f_tenant=acme" in page.url


def test_on_a_phone_the_first_screen_shows_the_blocked_attempts(
    browser: Any, served: str, tokens: dict[str, str], shots: Path
) -> None:
    """At 390x844 the filters of Blocked attempts are collapsed: the table's first row is within the
    first screen, unscrolled; opened, the filters are there."""
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    try:
        page = context.new_page()
        page.goto(f"{served}/blocked?window=30d")
        log_in(page, tokens["auditor"])
        grid = page.get_by_test_id("stDataFrame").first
        expect(grid).to_be_visible(timeout=30_000)
        drawn(page)
        assert page.evaluate("window.scrollY") == 0
        box = grid.bounding_box()
        # The header row and the first result row (each about 35 px) end above the screen's bottom edge.
        assert box is not None
        assert box["y"] + 2 * 35 <= 844, box
        page.screenshot(path=str(shots / "blocked-phone.png"))
        open_filters(page)
        expect(page.get_by_label("Tenant", exact=True).last).to_be_visible()
    finally:
        context.close()


def test_every_page_is_drawn(page: Any, served: str, tokens: dict[str, str], shots: Path) -> None:
    """An auditor is offered every page; each draws its data without an error; a screenshot of each."""
    from playwright.sync_api import expect

    page.goto(served)
    log_in(page, tokens["auditor"])
    expect(metric(page, "Calls")).to_be_visible(timeout=30_000)
    for title, shown in PAGES.items():
        nav(page, title)
        expect(page.get_by_role("heading", name=title, exact=True)).to_be_visible(timeout=30_000)
        expect(page.get_by_text(shown).first).to_be_visible(timeout=30_000)
        drawn(page)
        expect(page.get_by_test_id("stException")).to_have_count(0)
        page.screenshot(path=str(shots / f"{title.lower().replace(' ', '-')}.png"), full_page=True)
    assert len(list(shots.glob("*.png"))) >= len(PAGES)


SHOWN_TIME = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}")
"""A time as every page shows it: `YYYY-MM-DD HH:MM:SS`, no `T`, no fraction, no offset."""


def test_coverage_and_pipeline_show_times_as_every_page_does(
    page: Any, served: str, tokens: dict[str, str], shots: Path
) -> None:
    """Coverage's "Checked at" and Pipeline health's last event time read `YYYY-MM-DD HH:MM:SS` in
    the dashboard's zone, as every table does (they showed ISO text with microseconds); the events
    a minute have a thousands separator's form and a label that fits."""
    from playwright.sync_api import expect

    page.goto(served)
    log_in(page, tokens["auditor"])
    expect(metric(page, "Calls")).to_be_visible(timeout=30_000)
    nav(page, "Coverage")
    checked = page.get_by_text(re.compile(r"^Checked at "))
    expect(checked).to_be_visible(timeout=30_000)
    drawn(page)
    text = checked.inner_text()
    assert re.fullmatch(rf"Checked at {SHOWN_TIME.pattern} \(UTC\); the verdict is kept for a minute\.", text), text
    page.screenshot(path=str(shots / "coverage-times.png"), full_page=True)

    nav(page, "Pipeline health")
    expect(page.get_by_text("Last event time (UTC)")).to_be_visible(timeout=30_000)
    drawn(page)
    last = page.get_by_test_id("stCode").first.inner_text().strip()
    assert SHOWN_TIME.fullmatch(last), last
    per_minute = metric(page, "Events a minute").inner_text()
    assert re.fullmatch(r"\d{1,3}(,\d{3})*", per_minute), per_minute
    page.screenshot(path=str(shots / "pipeline-times.png"), full_page=True)


@pytest.mark.parametrize("path", ["coverage", "pipeline"])
def test_a_tenant_login_sent_to_a_global_page_is_told_why(
    page: Any, served: str, tokens: dict[str, str], shots: Path, path: str
) -> None:
    """A tenant administrator opening a link to Coverage or Pipeline health lands on Overview with a
    warning that names the page and why it is not shown, instead of without a word."""
    from playwright.sync_api import expect

    title = {"coverage": "Coverage", "pipeline": "Pipeline health"}[path]
    page.goto(f"{served}/{path}")
    log_in(page, tokens["globex-admin"])
    expect(page.get_by_role("heading", name="Overview", exact=True)).to_be_visible(timeout=30_000)
    warning = page.get_by_test_id("stAlert").filter(has_text=f"{title} reads every tenant's events")
    expect(warning).to_be_visible(timeout=30_000)
    expect(warning).to_contain_text("Overview opened instead")
    drawn(page)
    page.screenshot(path=str(shots / f"tenant-sent-to-{path}.png"), full_page=True)
    nav(page, "Blocked attempts")
    expect(page.get_by_role("heading", name="Blocked attempts", exact=True)).to_be_visible(timeout=30_000)
    expect(page.get_by_text(f"{title} reads every tenant's events")).to_have_count(0)


def test_a_link_to_call_or_run_asks_the_server_only_where_it_is(
    page: Any, served: str, run_store: Any, tokens: dict[str, str], shots: Path
) -> None:
    """Opened directly by link, `/call?call_id=...` and `/run?run_id=...` draw their page, and no request
    of the browser answers 404 (Streamlit's page looked for its server under the page's path first:
    `/call/_stcore/health` and `/call/_stcore/host-config`)."""
    from playwright.sync_api import expect

    failed: list[str] = []
    asked: list[str] = []
    page.on(
        "response",
        lambda response: failed.append(f"{response.status} {response.url}") if response.status >= 400 else None,
    )
    page.on("request", lambda request: asked.append(request.url))
    call_id = next(e.call_id for e in run_store.events if getattr(e, "tool", None) == "run_sql" and e.type == "Blocked")
    page.goto(f"{served}/call?call_id={call_id}")
    log_in(page, tokens["auditor"])
    expect(page.get_by_role("heading", name="Call detail", exact=True)).to_be_visible(timeout=30_000)
    expect(page.get_by_label("Call id")).to_have_value(call_id, timeout=30_000)
    drawn(page)
    page.screenshot(path=str(shots / "call-by-link.png"), full_page=True)
    page.goto(f"{served}/run?run_id=run-desk")
    log_in(page, tokens["auditor"])
    expect(page.get_by_role("heading", name="Run", exact=True)).to_be_visible(timeout=30_000)
    expect(page.get_by_test_id("stCode").filter(has_text="ask_research")).to_be_visible(timeout=30_000)
    drawn(page)
    page.screenshot(path=str(shots / "run-by-link.png"), full_page=True)
    assert failed == [], failed
    # The server was asked where it is at the root only.
    health = sorted(
        {url.removeprefix(served) for url in asked if "/_stcore/health" in url or "/_stcore/host-config" in url}
    )
    assert health == ["/_stcore/health", "/_stcore/host-config"], health


def tables_in_view(page: Any) -> list[dict[str, Any]]:
    """Each table shown on the page (not in a closed expander), scrolled into view: its headers and
    cells (the grid's accessible copy of its canvas), and where its last column's header ends, in
    the viewport's pixels. The grid draws its headers on a canvas, so the header's box is the grid's
    left edge plus the width its columns take (its scroll width): a table whose columns do not fit
    is wider inside than its box."""
    from playwright.sync_api import expect

    grids = page.locator("[data-testid=stDataFrame]:visible")
    tables = []
    for index in range(grids.count()):
        grid = grids.nth(index)
        grid.scroll_into_view_if_needed()
        # The grid's accessible copy (its headers and cells) follows its canvas.
        expect(grid.locator("[role=columnheader]").first).to_be_attached(timeout=30_000)
        tables.append(
            grid.evaluate(
                """grid => {
                    const box = grid.getBoundingClientRect();
                    const scroller = grid.querySelector('.dvn-scroller');
                    const cells = '[role=columnheader],[role=gridcell]';
                    const rows = Array.from(grid.querySelectorAll('[role=row]')).map(row =>
                        Array.from(row.querySelectorAll(cells)).map(c => c.textContent));
                    return {
                        headers: rows.length ? rows[0] : [],
                        cells: rows.slice(1),
                        right: box.left + scroller.scrollWidth,
                        inner: scroller.scrollWidth,
                        outer: scroller.clientWidth,
                        box_right: box.right,
                    };
                }"""
            )
        )
    return tables


# The pages whose tables must fit a laptop's screen: the menu entry to open, a run id to type (the
# Run page with a run open), and text once their tables are drawn.
WIDE_PAGES = {
    "overview": ("Overview", None, "Top denied"),
    "runs": ("Run", None, "Runs found"),
    "run": ("Run", "run-desk", "Story"),
    "trends": ("Trends", None, "Denial reasons new in this window"),
    "pipeline": ("Pipeline health", None, "Partitions"),
}


@pytest.fixture
def laptop(browser: Any) -> Iterator[Any]:
    """A fresh session at 1440x900, a laptop's screen."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    try:
        yield context.new_page()
    finally:
        context.close()


def test_every_table_fits_a_laptop_screen(laptop: Any, served: str, tokens: dict[str, str], shots: Path) -> None:
    """At 1440x900 the last column of every table on Overview, Run, Trends and Pipeline health ends
    within the screen and within its table (no sideways scroll to reach it); headers are words, not
    column codes; no cell reads "None"; no figure's label is cut; no "1 messages"; a screenshot of
    each table."""
    from playwright.sync_api import expect

    page = laptop
    page.goto(f"{served}/?window=30d")
    log_in(page, tokens["auditor"])
    expect(metric(page, "Calls")).to_be_visible(timeout=30_000)
    for name, (title, run_id, shown) in WIDE_PAGES.items():
        nav(page, title)
        expect(page.get_by_role("heading", name=title, exact=True)).to_be_visible(timeout=30_000)
        if run_id is not None:
            field = page.get_by_label("Run id", exact=True)
            field.fill(run_id)
            field.press("Enter")
        expect(page.get_by_text(shown, exact=True).first).to_be_visible(timeout=30_000)
        drawn(page)
        grids = page.locator("[data-testid=stDataFrame]:visible")
        expect(grids.first).to_be_visible(timeout=30_000)
        for index in range(grids.count()):
            grids.nth(index).scroll_into_view_if_needed()
            page.screenshot(path=str(shots / f"wide-{name}-{index}.png"))
        tables = tables_in_view(page)
        assert tables, name
        # Figures' labels are whole (Pipeline health's were cut), and counts agree with their nouns.
        labels = page.get_by_test_id("stMetricLabel")
        for index in range(labels.count()):
            cut = labels.nth(index).evaluate(
                "label => [label, ...label.querySelectorAll('*')].some(e => e.scrollWidth > e.clientWidth)"
            )
            assert not cut, (name, labels.nth(index).inner_text())
        assert not re.search(r"\b1 (messages|calls|tools|tenants|interceptors|runs|events)\b", page.inner_text("body"))
        for table in tables:
            what = (name, table["headers"])
            assert table["inner"] <= table["outer"], what
            assert table["right"] <= min(table["box_right"], 1440) + 1, what
            assert table["headers"], what
            assert not any("_" in header for header in table["headers"]), what
            assert not any(cell == "None" for row in table["cells"] for cell in row), what


def share_caption(page: Any) -> int:
    """All calls of the range, as the Trends page's interceptor caption gives them."""
    text = page.get_by_text(re.compile(r"^Share of all calls \(")).inner_text()
    found = re.search(r"\(([\d,]+) in the range", text)
    assert found, text
    return int(found.group(1).replace(",", ""))


def test_trends_shares_series_and_a_custom_range(
    laptop: Any, served: str, run_store: Any, tokens: dict[str, str], shots: Path
) -> None:
    """On Trends: every interceptor's share is of the same denominator, all calls of the range (the
    sum of the tools' calls); a series per tenant, per policy rule and per tool shows their keys;
    a custom range ending tomorrow shows the window's figures and one in the future shows none."""
    from playwright.sync_api import expect

    page = laptop
    page.goto(f"{served}/trends?window=30d&live=0")
    log_in(page, tokens["auditor"])
    expect(page.get_by_text("Denial rate per interceptor")).to_be_visible(timeout=30_000)
    drawn(page)
    calls = run_store.scalar(
        "select count(*) from events where type in ('ToolUse', 'ToolDenied', 'Substitute', 'Blocked')"
    )
    assert share_caption(page) == calls
    tools, interceptors, series, _ = tables_in_view(page)
    assert tools["headers"] == ["tool", "denied", "calls", "rate"]
    assert sum(int(row[2]) for row in tools["cells"]) == calls
    assert interceptors["headers"] == ["interceptor", "denied", "all calls", "share of all calls"]
    assert {row[2] for row in interceptors["cells"]} == {str(calls)}
    for _, denied, _, share in interceptors["cells"]:
        assert float(share) == round(int(denied) / calls, 4)
    assert series["headers"][0] == "tenant"
    tenants = {row[0] for row in series["cells"]}
    stored = run_store.scalar("select list(distinct tenant) from events where tenant is not null")
    assert tenants == set(stored)
    page.screenshot(path=str(shots / "trends-tenant.png"))

    for choice, header in (("Interceptor", "interceptor"), ("Tool", "tool"), ("Policy rule", "policy rule")):
        pick(page, "Series over time per", choice)
        # Tool and interceptor have a chart of their own above the series: their heading shows twice.
        twice = header in ("tool", "interceptor")
        expect(page.get_by_role("heading", name=f"Denial rate per {header}")).to_have_count(1 + twice, timeout=30_000)
        drawn(page)
        if header == "policy rule":
            # These runs' interceptors are no policy files: no rule to draw, and the page says so.
            expect(page.get_by_text("No policy rule denied a call in this range.")).to_be_visible()
        else:
            series = page.locator("[data-testid=stDataFrame]:visible").nth(2)
            series.scroll_into_view_if_needed()
            expect(series.locator("[role=columnheader]").first).to_have_text(header, timeout=30_000)
            table = tables_in_view(page)[2]
            assert table["headers"][0] == header, table
            assert {row[0] for row in table["cells"]} == {
                row[0] for row in (interceptors if header == "interceptor" else tools)["cells"]
            }
        page.screenshot(path=str(shots / f"trends-{header.replace(' ', '-')}.png"))

    page.get_by_text("Custom range", exact=True).click()
    expect(page.get_by_role("group", name="End date (UTC)")).to_be_visible(timeout=30_000)
    tomorrow = datetime.now(UTC).date() + timedelta(days=1)
    set_date(page, "End date (UTC)", tomorrow)
    expect(page.get_by_text(re.compile(rf"to {tomorrow:%Y-%m-%d} "))).to_be_visible(timeout=30_000)
    drawn(page)
    assert share_caption(page) == calls
    set_date(page, "End date (UTC)", tomorrow + timedelta(days=2))
    set_date(page, "Start date (UTC)", tomorrow + timedelta(days=1))
    expect(page.get_by_text(re.compile(rf"^{tomorrow + timedelta(days=1):%Y-%m-%d} \d\d:\d\d to "))).to_be_visible(
        timeout=30_000
    )
    drawn(page)
    expect(page.get_by_text("No calls in this window.").first).to_be_visible()
    assert share_caption(page) == 0
    page.screenshot(path=str(shots / "trends-custom-range.png"))


def pick(page: Any, label: str, choice: str) -> None:
    """Choose `choice` in the select box `label` (in view first: its list closes when the page scrolls)."""
    from playwright.sync_api import expect

    box = page.get_by_role("combobox", name=label)
    box.scroll_into_view_if_needed()
    expect(box).to_be_in_viewport()
    box.click()
    page.get_by_role("option", name=choice, exact=True).click()


def set_date(page: Any, label: str, day: date) -> None:
    """Type `day` into the date field `label` (a year, a month and a day to type), then leave it."""
    for part, shown in (("year", f"{day:%Y}"), ("month", f"{day:%m}"), ("day", f"{day:%d}")):
        page.get_by_role("spinbutton", name=f"{part}, {label}").click()
        page.keyboard.type(shown)
    # Leaving the field hands its value to the page.
    page.get_by_role("heading", name="Trends", exact=True).click()
