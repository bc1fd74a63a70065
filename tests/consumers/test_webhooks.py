"""Approval webhooks: per tenant, Slack/Teams-shaped JSON, an HMAC signature the receiver checks,
retries counted, never blocking; posted to a real HTTP server on loopback."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from consumers.webhooks import ApprovalNotifier, Webhook, WebhookError, load_webhooks, signature

SECRET = b"s3cret"


class Receiver:
    """A loopback HTTP server that answers `statuses` in turn (then 200) and keeps what it got."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses
        self.got: list[tuple[dict[str, str], bytes]] = []
        self.arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                with receiver.arrived:
                    receiver.got.append((dict(self.headers), body))
                    receiver.arrived.notify_all()
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def wait_for(self, count: int) -> None:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.got) >= count, timeout=20), self.got

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver([])
    yield server
    server.close()


def request(approval_id: str, tenant: str = "acme", status: str = "pending") -> dict[str, Any]:
    return {
        "approval_id": approval_id,
        "status": status,
        "tool": "refund",
        "tenant": tenant,
        "principal": "u-1",
        "reason": "Refunds over 100.00 need a reviewer.",
        "expires_at": "2026-01-01T00:05:00+00:00",
    }


class Store:
    """What the notifier reads: the pending rows, and each request by id."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}

    def pending(self) -> list[dict[str, Any]]:
        return [row for row in self.rows.values() if row["status"] == "pending"]

    def lookup(self, approval_id: str) -> dict[str, Any] | None:
        return self.rows.get(approval_id)


class TestNotifier:
    def test_a_new_request_is_posted_signed_to_its_tenants_webhooks(self, receiver: Receiver) -> None:
        """acme's request goes to acme's webhook and the all-tenants one, not globex's; the body has
        Slack/Teams' text; the signature verifies over the bytes received."""
        store = Store()
        store.rows["a1"] = request("a1")
        other = Receiver([])
        try:
            hooks = [
                Webhook(receiver.url, SECRET, "acme"),
                Webhook(other.url, b"other", "globex"),
                Webhook(receiver.url, SECRET, None),
            ]
            notifier = ApprovalNotifier(store.pending, store.lookup, hooks, console_url="http://console:8501")
            notifier.poll()
            notifier.poll()  # announced once
            for item in list(notifier._queue.queue):
                assert item is not None
                notifier.deliver(*item)
            receiver.wait_for(2)
            assert other.got == []
        finally:
            other.close()
        assert len(receiver.got) == 2
        headers, body = receiver.got[0]
        assert headers["X-Callgate-Signature"] == signature(SECRET, headers["X-Callgate-Timestamp"], body)
        data = json.loads(body)
        assert "needs a reviewer" in data["text"]
        assert "http://console:8501/approvals" in data["text"]
        assert data["callgate"]["event"] == "requested"
        assert data["callgate"]["approval_id"] == "a1"
        assert notifier.sent == 2

    def test_an_expiry_is_posted_and_a_decision_is_not(self, receiver: Receiver) -> None:
        """A request that left the pending list expired is announced as expired; a decided one is not."""
        store = Store()
        store.rows["a1"], store.rows["a2"] = request("a1"), request("a2")
        notifier = ApprovalNotifier(store.pending, store.lookup, [Webhook(receiver.url, SECRET)])
        notifier.poll()
        store.rows["a1"]["status"], store.rows["a2"]["status"] = "expired", "approved"
        notifier.poll()
        bodies = []
        while not notifier._queue.empty():
            item = notifier._queue.get()
            assert item is not None
            bodies.append(json.loads(item[1]))
        assert [(b["callgate"]["event"], b["callgate"]["approval_id"]) for b in bodies] == [
            ("requested", "a1"),
            ("requested", "a2"),
            ("expired", "a1"),
        ]

    def test_a_failing_receiver_is_retried_and_counted(self) -> None:
        """Two 500s then 200: delivered on the third attempt, two retries counted; a receiver that
        always fails is given up after `attempts` and counted as failed."""
        flaky = Receiver([500, 503])
        try:
            notifier = ApprovalNotifier(list, lambda _: None, [], attempts=3, backoff_s=0.01)
            assert notifier.deliver(Webhook(flaky.url, SECRET), b"{}")
            assert (len(flaky.got), notifier.sent, notifier.retried, notifier.failed) == (3, 1, 2, 0)
            flaky.statuses = [500] * 3
            assert not notifier.deliver(Webhook(flaky.url, SECRET), b"{}")
            assert (notifier.failed, notifier.retried) == (1, 4)
        finally:
            flaky.close()

    def test_posting_runs_off_the_polling_thread(self, receiver: Receiver) -> None:
        """Started, the notifier polls and posts on threads of its own: a request is posted without
        the caller doing anything but adding it."""
        store = Store()
        notifier = ApprovalNotifier(store.pending, store.lookup, [Webhook(receiver.url, SECRET)])
        notifier.start(interval_s=0.05)
        try:
            store.rows["a1"] = request("a1")
            receiver.wait_for(1)
        finally:
            notifier.stop()
        assert json.loads(receiver.got[0][1])["callgate"]["approval_id"] == "a1"


class TestTheFile:
    def test_a_file_is_read_with_secrets_from_the_environment(self, tmp_path: Path) -> None:
        """url, secret_env and tenant; the secret comes from the variable named."""
        path = tmp_path / "hooks.yaml"
        path.write_text("webhooks:\n  - {url: 'https://hooks.example/x', secret_env: HOOK, tenant: acme}\n")
        (hook,) = load_webhooks(path, {"HOOK": "abc"})
        assert (hook.url, hook.secret, hook.tenant) == ("https://hooks.example/x", b"abc", "acme")

    @pytest.mark.parametrize(
        ("text", "culprit"),
        [
            ("webhooks:\n  - {url: 'ftp://x', secret_env: HOOK}\n", "url"),
            ("webhooks:\n  - {url: 'https://x', secret_env: MISSING}\n", "secret_env"),
            ("webhooks:\n  - {url: 'https://x', secret_env: HOOK, secret: s}\n", "unknown key 'secret'"),
            ("hooks: []\n", "one key"),
        ],
    )
    def test_a_bad_file_names_the_culprit(self, tmp_path: Path, text: str, culprit: str) -> None:
        """A bad URL, an unset secret variable, an unknown key, a wrong top level: WebhookError naming it."""
        path = tmp_path / "hooks.yaml"
        path.write_text(text)
        with pytest.raises(WebhookError, match=culprit):
            load_webhooks(path, {"HOOK": "abc"})
