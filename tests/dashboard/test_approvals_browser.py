"""Approvals end to end, with real processes and a real browser: an agent process asks (a policy's
require_approval, waiting on the decisions topic of the embedded broker), `callgate materialize`
stores the request and serves the read API with its reviewers' desk, `callgate dashboard --login
token` shows it on the Approvals page, and a reviewer logged in with headless chromium (Debian's,
driven by Playwright) decides it. Covers an approval (the call runs once; the events read
ApprovalRequested, ApprovalResolved by that reviewer, ToolUse), a denial, an expiry, a self-approval
refused, a tenant reviewer who does not see another tenant's request, changed arguments asking
again, an agent process killed while it waits and the call resumed by a new process, and a
LangGraph agent process killed while paused and resumed from its checkpoint by a new process that
defers to the reviewers' desk (`Command(resume={"approval_id": ...})`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from callgate.broker import EmbeddedBroker, free_port
from callgate.tokens import add_token
from consumers.reader import ApiReader, SourceUnavailableError
from consumers.webhooks import signature
from events.signing import SigningKey

from .conftest import CHROMIUM_FLAGS

pytestmark = pytest.mark.integration

AGENT = Path(__file__).with_name("approval_agent.py")
GRAPH_AGENT = Path(__file__).with_name("langgraph_approval_agent.py")
CLI = [sys.executable, "-c", "from callgate.cli import main; main()"]
SUBJECTS = {
    "rev-1": ["reviewer", "auditor"],
    "rev-globex": ["reviewer", "tenant:globex"],
    "u-1": ["reviewer", "auditor"],
    "admin-1": ["admin"],
    "gate-acme": ["tenant:acme"],
}


def until(condition: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.1)  # sleep-ok: polling another process with a deadline
    return value


def stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


HOOK_SECRET = "hook-secret"  # noqa: S105 (a test's webhook secret)


class Hooks:
    """A webhook receiver on loopback: the verified JSON bodies it got."""

    def __init__(self) -> None:
        self.got: list[dict[str, Any]] = []
        hooks = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                expected = signature(HOOK_SECRET.encode(), self.headers["X-Callgate-Timestamp"], body)
                if self.headers["X-Callgate-Signature"] == expected:
                    hooks.got.append(json.loads(body)["callgate"])
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def told(self, event: str, approval_id: str) -> bool:
        return any(h["event"] == event and h["approval_id"] == approval_id for h in self.got)


class Stack:
    """The broker's topics, the materializer with its desk, the console, and agent processes."""

    def __init__(self, bootstrap: str, tmp_path: Path, tokens: dict[str, str], api: str, url: str) -> None:
        self.bootstrap = bootstrap
        self.tmp_path = tmp_path
        self.tokens = tokens
        self.api = api
        self.url = url
        self.topic = ""
        self.decisions = ""
        self.ran = tmp_path / "ran.txt"
        self.ran.touch()
        self.hooks: Hooks | None = None
        self.agents: list[subprocess.Popen[str]] = []
        self.desk_keys = tmp_path / "desk-keys"
        """The desk's public key (it signs every decision with its private one)."""

    def agent(
        self, call_id: str, amount: int = 20000, *, timeout_s: float = 120, tenant: str = "acme"
    ) -> subprocess.Popen[str]:
        spool = self.tmp_path / f"spool-{uuid.uuid4().hex[:8]}"
        args = [self.bootstrap, self.topic, self.decisions, str(spool), str(self.ran), call_id, str(amount)]
        agent = subprocess.Popen(
            [sys.executable, str(AGENT), *args, str(timeout_s), tenant, "u-1", self.api, self.tokens["gate-acme"]],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.agents.append(agent)
        return agent

    def graph_agent(self, phase: str, call_id: str) -> subprocess.Popen[str]:
        """The LangGraph agent process (`langgraph_approval_agent.py`) of `call_id`, in `phase`."""
        workdir = self.tmp_path / f"graph-{call_id}"
        workdir.mkdir(exist_ok=True)
        spool = self.tmp_path / f"spool-{uuid.uuid4().hex[:8]}"
        args = [self.bootstrap, self.topic, str(spool), str(workdir), str(self.ran), call_id]
        agent = subprocess.Popen(
            [sys.executable, str(GRAPH_AGENT), phase, *args, self.api, self.tokens["gate-acme"], str(self.desk_keys)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.agents.append(agent)
        return agent

    def stop_agents(self) -> None:
        """Every agent process this stack started is gone, whatever a test left running."""
        for agent in self.agents:
            if agent.poll() is None:
                agent.kill()
            agent.communicate()

    def query(self, name: str, **params: Any) -> list[dict[str, Any]]:
        try:
            return ApiReader(self.api, token=self.tokens["admin-1"], timeout_s=5).query(name, params).rows
        except SourceUnavailableError:
            return []

    def pending(self, call_id: str, *, other_than: str | None = None) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            rows = [r for r in self.query("pending_approvals") if r["call_id"] == call_id]
            rows = [r for r in rows if r["approval_id"] != other_than]
            return rows[0] if rows else None

        return dict(until(found, 60, f"the pending request of {call_id}"))

    def events(self, call_id: str, count: int) -> list[dict[str, Any]]:
        def stored() -> list[dict[str, Any]] | None:
            rows = [r for r in self.query("call_detail", call_id=call_id) if r["relation"] == "call"]
            return rows if len(rows) >= count else None

        return list(until(stored, 60, f"{count} events of {call_id}"))

    def runs(self, call_id: str) -> int:
        return sum(1 for line in self.ran.read_text().splitlines() if line.split()[0] == call_id)


def outcome(agent: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = agent.communicate(timeout=90)
    return dict(json.loads(out.strip().splitlines()[-1]))


@pytest.fixture
def stack(kafka_broker: EmbeddedBroker, tmp_path: Path) -> Iterator[Stack]:
    token_file = tmp_path / "tokens.yaml"
    tokens = {subject: add_token(token_file, subject, roles) for subject, roles in SUBJECTS.items()}
    api_port, ui_port = free_port("127.0.0.1"), free_port("127.0.0.1")
    api, url = f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{ui_port}"
    topic, decisions = f"approvals-{uuid.uuid4().hex[:8]}", f"decisions-{uuid.uuid4().hex[:8]}"
    hooks = Hooks()
    hooks_file = tmp_path / "hooks.yaml"
    hooks_file.write_text(f"webhooks:\n  - {{url: '{hooks.url}', secret_env: CALLGATE_TEST_HOOK, tenant: acme}}\n")
    desk_key, _ = SigningKey.generate("callgate-desk").write(tmp_path / "desk-keys")
    materializer = subprocess.Popen(
        [
            *CLI,
            "materialize",
            "--bootstrap",
            kafka_broker.bootstrap,
            "--topic",
            topic,
            "--db",
            str(tmp_path / "audit.duckdb"),
            "--api",
            f"127.0.0.1:{api_port}",
            "--auth",
            str(token_file),
            "--decisions-topic",
            decisions,
            "--webhooks",
            str(hooks_file),
            "--console-url",
            url,
            "--decision-key",
            str(desk_key),
        ],
        stdout=subprocess.DEVNULL,
        env={**os.environ, "CALLGATE_TEST_HOOK": HOOK_SECRET},
    )
    console = subprocess.Popen(
        [*CLI, "dashboard", "--api", api, "--port", str(ui_port), "--refresh", "1", "--login", "token"],
        stdout=subprocess.PIPE,
        text=True,
    )
    built = Stack(kafka_broker.bootstrap, tmp_path, tokens, api, url)
    built.topic, built.decisions, built.hooks = topic, decisions, hooks
    try:
        assert console.stdout is not None
        assert console.stdout.readline().startswith(f"dashboard at {url}")
        yield built
    finally:
        built.stop_agents()
        hooks.server.shutdown()
        hooks.server.server_close()
        stop(console)
        stop(materializer)
        if console.stdout is not None:
            console.stdout.close()


def log_in(page: Any, stack: Stack, subject: str) -> None:
    from playwright.sync_api import expect

    page.goto(f"{stack.url}/approvals")
    field = page.get_by_label("Token")
    expect(field).to_be_visible(timeout=30_000)
    field.fill(stack.tokens[subject])
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Approvals")).to_be_visible(timeout=30_000)


def request_box(page: Any, approval_id: str) -> Any:
    """The request's box on the Approvals page (reloaded through the menu until it shows)."""
    from playwright.sync_api import expect

    box = page.locator(f".st-key-request-{approval_id}")
    deadline = time.monotonic() + 60
    while box.count() == 0:
        if time.monotonic() > deadline:
            raise AssertionError(f"request {approval_id} not shown")
        page.get_by_test_id("stSidebarNav").get_by_role("link", name="Approvals", exact=True).click()
        page.wait_for_timeout(500)
    expect(box.first).to_be_visible(timeout=30_000)
    # While the page reruns, the box's elements from the run before stay drawn beside the new ones
    # (marked stale): a Note field was found twice. Only the current run's elements are used.
    return box.locator("[data-testid='stElementContainer'][data-stale='false']")


def decide(page: Any, approval_id: str, button: str, note: str) -> Any:
    box = request_box(page, approval_id)
    box.get_by_label("Note").fill(note)
    box.get_by_label("Note").press("Enter")
    box.get_by_role("button", name=button).click()
    return box


def test_a_reviewer_approves_in_the_console_and_the_call_runs_once(chromium: str, stack: Stack, tmp_path: Path) -> None:
    """Approve, self-approval refused, killed-and-resumed, changed arguments: the console decides,
    the agent processes run each approved call exactly once."""
    from playwright.sync_api import expect, sync_playwright

    # Both LangGraph processes start first, so that their imports overlap the rest; the resuming
    # one reads the checkpoint only once told to, after the pausing one is gone.
    graph_paused, graph_resumed = stack.graph_agent("pause", "call-graph"), stack.graph_agent("resume", "call-graph")
    agent = stack.agent("call-approve")
    request = stack.pending("call-approve")
    assert stack.hooks is not None
    until(lambda: stack.hooks.told("requested", request["approval_id"]), 30, "acme's webhook told")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        try:
            # The agent's own principal is refused: four eyes.
            own = browser.new_page(viewport={"width": 1400, "height": 1000})
            log_in(own, stack, "u-1")
            box = decide(own, request["approval_id"], "Approve", "mine")
            expect(box.get_by_text("nobody decides their own request")).to_be_visible(timeout=30_000)
            assert agent.poll() is None
            own.close()

            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            log_in(page, stack, "rev-1")
            box = request_box(page, request["approval_id"])
            expect(box.get_by_text("Refunds over 100.00 need a reviewer.")).to_be_visible()
            expect(box.get_by_text('"amount_cents": 20000')).to_be_visible()
            expect(box.get_by_text("big-refunds")).to_be_visible()
            page.screenshot(path=str(tmp_path / "approvals.png"), full_page=True)
            box = decide(page, request["approval_id"], "Approve", "checked with the customer")
            expect(box.get_by_text("approved by rev-1")).to_be_visible(timeout=30_000)
            assert outcome(agent)["kind"] == "ok"
            assert stack.runs("call-approve") == 1
            events = stack.events("call-approve", 3)
            assert [e["type"] for e in events] == ["ApprovalRequested", "ApprovalResolved", "ToolUse"]
            (detail,) = stack.query("approval_request", approval_id=request["approval_id"])
            assert (detail["status"], detail["decided_by"], detail["note"]) == (
                "approved",
                "rev-1",
                "checked with the customer",
            )
            # Looked up by its id, the request says who used the approval (the agent's claim).
            page.get_by_label("Approval id").fill(request["approval_id"])
            page.get_by_label("Approval id").press("Enter")
            found = page.locator(f".st-key-lookup-{request['approval_id']}")
            expect(found.get_by_text("status approved")).to_be_visible(timeout=30_000)
            expect(found.get_by_text("Used: claimed by gate-acme (gate ")).to_be_visible(timeout=30_000)

            # Killed while it waits; approved meanwhile; the call resumed by a new process runs once.
            paused = stack.agent("call-resume")
            asked = stack.pending("call-resume")
            paused.send_signal(signal.SIGKILL)
            paused.wait(10)
            box = decide(page, asked["approval_id"], "Approve", "resume it")
            expect(box.get_by_text("approved by rev-1")).to_be_visible(timeout=30_000)
            assert stack.runs("call-resume") == 0
            assert outcome(stack.agent("call-resume"))["kind"] == "ok"
            assert stack.runs("call-resume") == 1
            # One request: the new process found it in the store, and recorded only the outcome.
            resumed = stack.events("call-resume", 3)
            assert [e["type"] for e in resumed] == ["ApprovalRequested", "ApprovalResolved", "ToolUse"]

            # The same call id with other arguments asks again: a new request, not the old approval.
            # (Its expiry is waited for last, while the LangGraph case runs.)
            changed = stack.agent("call-approve", amount=30000, timeout_s=8)
            again = stack.pending("call-approve", other_than=request["approval_id"])
            assert again["args"]["amount_cents"] == 30000

            # LangGraph paused the call (its checkpoint saved) and the process is killed; a reviewer
            # approves; a new process resumes the thread with Command(resume={"approval_id": ...}),
            # and its gate fetches the desk's signed decision, claims it, and runs the call once.
            assert graph_paused.stdout is not None
            graph_id = json.loads(graph_paused.stdout.readline())["paused"]
            graph_paused.send_signal(signal.SIGKILL)
            graph_paused.wait(10)
            box = decide(page, graph_id, "Approve", "refund it")
            expect(box.get_by_text("approved by rev-1")).to_be_visible(timeout=30_000)
            assert stack.runs("call-graph") == 0
            out, _ = graph_resumed.communicate(graph_id + "\n", timeout=90)
            assert json.loads(out.strip().splitlines()[-1]) == {"status": "success", "content": "refunded 25000"}
            assert stack.runs("call-graph") == 1
            assert [e["type"] for e in stack.events("call-graph", 3)] == [
                "ApprovalRequested",
                "ApprovalResolved",
                "ToolUse",
            ]
            (graph_request,) = stack.query("approval_request", approval_id=graph_id)
            assert (graph_request["status"], graph_request["decided_by"], graph_request["claimed_by"]) == (
                "approved",
                "rev-1",
                "gate-acme",
            )

            # Nobody decides the changed arguments' request: it is refused when it expires.
            assert outcome(changed)["kind"] == "denied"
            assert stack.runs("call-approve") == 1
        finally:
            browser.close()


def test_denial_expiry_and_another_tenants_reviewer(chromium: str, stack: Stack) -> None:
    """Denied in the console: the call does not run and the model reads the note; an expired request
    leaves the list and is refused; a globex reviewer does not see acme's request."""
    from playwright.sync_api import expect, sync_playwright

    agent = stack.agent("call-deny")
    request = stack.pending("call-deny")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        try:
            globex = browser.new_page(viewport={"width": 1400, "height": 1000})
            log_in(globex, stack, "rev-globex")
            expect(globex.get_by_text("No request is waiting for a reviewer.")).to_be_visible(timeout=30_000)
            assert globex.locator(f".st-key-request-{request['approval_id']}").count() == 0
            globex.close()

            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            log_in(page, stack, "rev-1")
            box = decide(page, request["approval_id"], "Deny", "not this customer")
            expect(box.get_by_text("denied by rev-1")).to_be_visible(timeout=30_000)
            result = outcome(agent)
            assert result["kind"] == "denied"
            assert "by rev-1: not this customer" in result["message"]
            assert stack.runs("call-deny") == 0
            events = stack.events("call-deny", 3)
            assert [e["type"] for e in events] == ["ApprovalRequested", "ApprovalResolved", "ToolDenied"]

            expiring = stack.agent("call-expire", timeout_s=6)
            asked = stack.pending("call-expire")
            assert outcome(expiring)["kind"] == "denied"
            assert stack.runs("call-expire") == 0
            assert [e["type"] for e in stack.events("call-expire", 3)] == [
                "ApprovalRequested",
                "ApprovalResolved",
                "ToolDenied",
            ]
            (detail,) = stack.query("approval_request", approval_id=asked["approval_id"])
            assert detail["status"] == "expired"
            assert stack.hooks is not None
            until(lambda: stack.hooks.told("expired", asked["approval_id"]), 30, "the expiry told")
        finally:
            browser.close()
