"""Reviewers are told: a webhook per tenant when an approval request arrives and when it expires.

`ApprovalNotifier` watches the store's pending requests (the named queries `pending_approvals` and
`approval_request`, through the functions it is given) and posts to each webhook whose tenant is
the request's (or to a webhook for every tenant):

- the body is JSON that Slack and Microsoft Teams incoming webhooks both accept (`text`, in
  Markdown), with the request's fields under `callgate` for other receivers;
- `X-Callgate-Timestamp` (Unix seconds) and `X-Callgate-Signature: v1=<hex>`, the HMAC-SHA256 with
  the webhook's secret of `<timestamp>.<body>`: the receiver recomputes it over the bytes it got
  and refuses an old timestamp;
- a failed post (an error, a status other than 2xx) is retried with a doubling pause up to
  `attempts` times, then dropped and counted; posts run on a thread of their own, so a slow or dead
  receiver never delays a request, a decision or the store.

A notifier keeps what it announced in memory: after a restart, requests still pending are
announced again (a receiver may see one twice, never miss one).

The webhooks file (`callgate materialize --webhooks FILE`): `webhooks: [{url, secret_env, tenant}]`;
`secret_env` names the environment variable holding the secret (secrets stay out of files), `tenant`
absent means every tenant.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import queue
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

__all__ = ["ApprovalNotifier", "Webhook", "WebhookError", "load_webhooks", "signature"]

log = logging.getLogger(__name__)

Kind = Literal["requested", "expired"]


class WebhookError(ValueError):
    """A webhooks file or entry that cannot be used; the message names the file and the entry."""


@dataclass(frozen=True, slots=True)
class Webhook:
    """Where to tell reviewers: `url` (http or https), the HMAC `secret`, and the `tenant` whose
    requests it gets (None: every tenant's)."""

    url: str
    secret: bytes = field(repr=False)
    tenant: str | None = None


def load_webhooks(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> list[Webhook]:
    """The webhooks of a file (module docstring); `WebhookError` naming the culprit."""
    env = os.environ if environ is None else environ
    source = str(path)
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise WebhookError(f"{source}: cannot be read: {exc}") from None
    if not isinstance(data, dict) or set(data) != {"webhooks"} or not isinstance(data["webhooks"], list):
        raise WebhookError(f"{source}: expected one key, webhooks: [{{url, secret_env, tenant}}, ...]")
    hooks = []
    for index, item in enumerate(data["webhooks"]):
        where = f"{source}: webhooks[{index}]"
        if not isinstance(item, dict):
            raise WebhookError(f"{where}: expected a mapping with url, secret_env and tenant")
        unknown = sorted(set(item) - {"url", "secret_env", "tenant"})
        if unknown:
            raise WebhookError(f"{where}: unknown key {unknown[0]!r} (keys: url, secret_env, tenant)")
        url, secret_env, tenant = item.get("url"), item.get("secret_env"), item.get("tenant")
        parsed = urllib.parse.urlsplit(url) if isinstance(url, str) else None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise WebhookError(f"{where}: url must be an http(s) URL, got {url!r}")
        if not isinstance(secret_env, str) or not env.get(secret_env):
            raise WebhookError(f"{where}: secret_env must name a set environment variable, got {secret_env!r}")
        if tenant is not None and (not isinstance(tenant, str) or not tenant.strip()):
            raise WebhookError(f"{where}: tenant must be a tenant id, got {tenant!r}")
        hooks.append(Webhook(url, env[secret_env].encode(), tenant))
    return hooks


def signature(secret: bytes, timestamp: str, body: bytes) -> str:
    """`v1=` and the HMAC-SHA256 hex of `<timestamp>.<body>` with `secret`."""
    return "v1=" + hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def message(kind: Kind, request: Mapping[str, Any], console_url: str | None = None) -> dict[str, Any]:
    """The JSON body for one request (module docstring)."""
    approval_id = str(request.get("approval_id"))
    what = "needs a reviewer" if kind == "requested" else "expired without a decision"
    lines = [
        f"*Approval {what}*: `{request.get('tool')}` for tenant `{request.get('tenant')}`,"
        f" asked under `{request.get('principal')}`",
        f"Reason: {request.get('reason')}",
        f"Approval id: `{approval_id}`; expires {request.get('expires_at')}",
    ]
    if kind == "requested":
        if console_url:
            lines.append(f"Decide: {console_url.rstrip('/')}/approvals")
        lines.append(f"Or: `callgate approvals show {approval_id}`")
    fields = ("approval_id", "tool", "tenant", "principal", "run_id", "call_id", "reason", "rule", "expires_at")
    return {"text": "\n".join(lines), "callgate": {"event": kind, **{k: request.get(k) for k in fields}}}


Send = Callable[[str, bytes, Mapping[str, str]], int]
"""Posts a body to a URL with headers; the HTTP status (raises on a connection failure)."""


def _post(url: str, body: bytes, headers: Mapping[str, str]) -> int:
    request = urllib.request.Request(url, data=body, headers=dict(headers), method="POST")  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


class ApprovalNotifier:
    """Announces new and expired approval requests to webhooks (module docstring).

    `pending()` returns the pending requests (rows of `pending_approvals`); `lookup(approval_id)`
    one request (a row of `approval_request`) or None. `poll()` compares them with what was
    announced and queues the posts; `start(interval_s)` polls on a thread until `stop()`. Counters:
    `sent`, `retried`, `failed` (posts given up). Safe from several threads.
    """

    def __init__(
        self,
        pending: Callable[[], list[Mapping[str, Any]]],
        lookup: Callable[[str], Mapping[str, Any] | None],
        webhooks: list[Webhook],
        *,
        console_url: str | None = None,
        attempts: int = 5,
        backoff_s: float = 0.5,
        send: Send = _post,
    ) -> None:
        if attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {attempts}")
        self._pending = pending
        self._lookup = lookup
        self.webhooks = webhooks
        self.console_url = console_url
        self.attempts = attempts
        self.backoff_s = backoff_s
        self._send = send
        self._announced: dict[str, Mapping[str, Any]] = {}
        self._queue: queue.Queue[tuple[Webhook, bytes] | None] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.sent = self.retried = self.failed = 0

    def poll(self) -> None:
        """Queue a post for every request pending and not announced, and for every announced one
        that is no longer pending and has expired."""
        current = {str(row["approval_id"]): row for row in self._pending()}
        for approval_id, row in current.items():
            if approval_id not in self._announced:
                self._announced[approval_id] = row
                self._queue_posts("requested", row)
        for approval_id in [a for a in self._announced if a not in current]:
            row = self._announced.pop(approval_id)
            now = self._lookup(approval_id) or row
            if now.get("status") == "expired":
                self._queue_posts("expired", now)

    def _queue_posts(self, kind: Kind, row: Mapping[str, Any]) -> None:
        body = json.dumps(message(kind, row, self.console_url), default=str).encode()
        for hook in self.webhooks:
            if hook.tenant is None or hook.tenant == row.get("tenant"):
                self._queue.put((hook, body))

    def deliver(self, hook: Webhook, body: bytes) -> bool:
        """Post `body` to `hook`, retrying (see the class); whether it was taken. Blocks."""
        for attempt in range(self.attempts):
            if attempt:
                with self._lock:
                    self.retried += 1
                if self._stop.wait(self.backoff_s * 2 ** (attempt - 1)):
                    break
            stamp = str(int(time.time()))
            headers = {
                "Content-Type": "application/json",
                "X-Callgate-Timestamp": stamp,
                "X-Callgate-Signature": signature(hook.secret, stamp, body),
            }
            try:
                status = self._send(hook.url, body, headers)
            except Exception as exc:
                log.warning("webhook %s: post failed: %s", hook.url, exc)
                continue
            if 200 <= status < 300:
                with self._lock:
                    self.sent += 1
                return True
            log.warning("webhook %s answered %d", hook.url, status)
        with self._lock:
            self.failed += 1
        log.error("webhook %s: gave up on a post after %d attempts", hook.url, self.attempts)
        return False

    def _deliver_loop(self) -> None:
        while (item := self._queue.get()) is not None:
            self.deliver(*item)

    def _poll_loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.poll()
            except Exception:
                log.exception("approval webhooks: cannot read the pending requests")

    def start(self, interval_s: float = 1.0) -> None:
        """Poll every `interval_s` and post on threads of their own, until `stop()`."""
        self._threads = [
            threading.Thread(target=self._poll_loop, args=(interval_s,), name="callgate-webhook-poll", daemon=True),
            threading.Thread(target=self._deliver_loop, name="callgate-webhook-post", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop polling; posts already queued are tried once more, without retries. Idempotent."""
        self._stop.set()
        self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout_s)
        self._threads = []
