"""The reviewer's desk: deciding durable approval requests, and the read API's write route.

`ApprovalDesk.decide` is the one place the rule lives:

- deciding needs the `reviewer` role; a reviewer who also holds `tenant:<id>` roles decides only
  those tenants' requests (one without decides every tenant's);
- nobody decides a request made under their own principal (four eyes);
- only a pending request is decided (not decided yet, not expired), once.

A decision is an `ApprovalResolved` event naming the reviewer's authenticated subject in `by`,
sealed into the desk's own chain and published (`events.decisions.DecisionPublisher`: to the events
topic, where it is stored, and to the decisions topic, where the waiting gate reads it).

`approval_routes` adds `POST /v1/approvals/{approval_id}` to the read API: a JSON body
`{"decision": "approve" | "deny", "note": "..."}`; 200 with the decision, 400 for a bad body, 403
(not a reviewer, another tenant, one's own request), 404 (no such request, or not visible to this
tenant reviewer), 409 (already decided or expired), 503 (the decision could not be published: it is
not taken). Every attempt is an access-log line (query `approval:approve` / `approval:deny`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from consumers.auth import REVIEWER, Forbidden, Identity
from events.chain import Producer, new_event_id
from events.models import ApprovalResolvedEvent

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from consumers.access_log import AccessLog

__all__ = ["ApprovalDesk", "DecisionConflict", "DecisionError", "RequestNotFound", "approval_routes", "post_decision"]

log = logging.getLogger(__name__)

MAX_NOTE_CHARS = 2000
"""The longest note a reviewer may give (the model reads it on a refusal)."""


class DecisionError(Exception):
    """A decision the desk did not take; `status` is the read API's answer."""

    status = 400


class RequestNotFound(DecisionError):
    """No such approval request (or none this reviewer may see)."""

    status = 404


class DecisionConflict(DecisionError):
    """The request is no longer pending (decided, or expired)."""

    status = 409


class Publisher(Protocol):
    """Sends a sealed decision where gates and the store get it; blocks until it is acknowledged and
    raises when it cannot be (`events.decisions.DecisionPublisher`)."""

    def publish(self, event: ApprovalResolvedEvent) -> None: ...


class ApprovalDesk:
    """Decides approval requests read from the store with the named query `approval_request`.

    `lookup(approval_id)` returns the request's row (as that query gives it) or None; `publisher`
    sends the decision. `decide` blocks (a store read, a publish) and is safe from several threads:
    decisions of one request are taken one at a time, and a request decided here is not decided
    again before the store has the decision.
    """

    def __init__(
        self,
        lookup: Callable[[str], Mapping[str, Any] | None],
        publisher: Publisher,
        *,
        gate: str = "callgate-desk",
        producer: Producer | None = None,
    ) -> None:
        self.lookup = lookup
        self.publisher = publisher
        self.gate = gate
        self.producer = producer or Producer()
        self._lock = threading.Lock()
        self._decided: dict[str, str] = {}

    def decide(
        self, identity: Identity, approval_id: str, *, approved: bool, note: str | None = None
    ) -> ApprovalResolvedEvent:
        """Take `identity`'s decision on request `approval_id` and publish it; returns the event.

        Raises `Forbidden` (no reviewer role, another tenant's request, one's own request),
        `RequestNotFound`, `DecisionConflict` (decided or expired), `DecisionError` (a bad note), and
        what the publisher raises (the decision is then not taken).
        """
        if REVIEWER not in identity.roles:
            raise Forbidden("deciding approval requests needs the reviewer role")
        if note is not None and len(note) > MAX_NOTE_CHARS:
            raise DecisionError(f"the note is {len(note)} characters long; at most {MAX_NOTE_CHARS}")
        request = self.lookup(approval_id)
        if request is None:
            raise RequestNotFound(f"no approval request {approval_id!r}")
        tenants = identity.tenants
        if tenants and request.get("tenant") not in tenants:
            # The other tenant is not named: a tenant reviewer learns nothing of it.
            raise Forbidden(
                f"request {approval_id} is not of a tenant this reviewer decides ({', '.join(sorted(tenants))} only)"
            )
        if request.get("principal") is not None and request.get("principal") == identity.subject:
            raise Forbidden(
                f"request {approval_id} was made under {identity.subject!r}: nobody decides their own request"
            )
        with self._lock:
            if approval_id in self._decided:
                raise DecisionConflict(f"request {approval_id} was already decided ({self._decided[approval_id]})")
            status = request.get("status")
            if status != "pending":
                by = request.get("decided_by")
                raise DecisionConflict(f"request {approval_id} is {status}" + (f" by {by}" if by else ""))
            expires = _time(request.get("expires_at"))
            now = datetime.now(UTC)
            if expires is not None and expires <= now:
                raise DecisionConflict(f"request {approval_id} expired at {expires.isoformat()}")
            requested = _time(request.get("requested_at")) or now
            fields: dict[str, Any] = {
                "event_id": new_event_id(),
                "time": now,
                "gate": request.get("gate") or self.gate,
                "workflow": request.get("workflow"),
                "agent": request.get("agent"),
                "tool": request.get("tool"),
                "call_id": request.get("call_id"),
                "run_id": request.get("run_id"),
                "tenant": request.get("tenant"),
                "principal": request.get("principal"),
                "approved": approved,
                "by": identity.subject,
                "note": note or None,
                "waited_ms": round(max(0.0, (now - requested).total_seconds()) * 1000, 3),
                "approval_id": approval_id,
                "args_digest": request.get("args_digest"),
                "policy_version": request.get("policy_version"),
            }
            event = self.producer.seal(ApprovalResolvedEvent, fields)
            self.publisher.publish(event)
            self._decided[approval_id] = f"{'approved' if approved else 'denied'} by {identity.subject}"
        log.info("approval %s %s by %s", approval_id, "approved" if approved else "denied", identity.subject)
        return event


def _time(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


def approval_routes(
    desk: ApprovalDesk,
    identify: Callable[[Request], Awaitable[Identity | Response]],
    access_log: AccessLog | None,
) -> list[Route]:
    """The read API's write route (module docstring), authenticated by the API's own `identify`."""
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from consumers.access_log import AccessRecord

    async def decide(request: Request) -> Response:
        identity = await identify(request)
        if not isinstance(identity, Identity):
            return identity
        started, at = time.perf_counter(), datetime.now(UTC)
        approval_id: str = request.path_params["approval_id"]
        decision, note, problem = _body(await request.body())
        status, body = 400, {"error": problem}
        if problem is None:
            try:
                event = await run_in_threadpool(
                    desk.decide, identity, approval_id, approved=decision == "approve", note=note
                )
            except Forbidden as exc:
                status, body = 403, {"error": str(exc)}
            except DecisionError as exc:
                status, body = exc.status, {"error": str(exc)}
            except Exception:
                log.exception("read API: the decision on %s could not be published", approval_id)
                status, body = 503, {"error": "the decision could not be recorded; it was not taken, try again"}
            else:
                status = 200
                body = {
                    "approval_id": approval_id,
                    "decision": decision,
                    "by": event.by,
                    "note": event.note,
                    "event_id": event.event_id,
                    "call_id": event.call_id,
                }
        if access_log is not None:
            record = AccessRecord(
                time=at,
                subject=identity.subject,
                roles=tuple(sorted(identity.roles)),
                query=f"approval:{decision or 'invalid'}",
                params={"approval_id": approval_id, "note": note},
                status=status,
                row_count=None,
                duration_ms=(time.perf_counter() - started) * 1000,
            )
            try:
                await run_in_threadpool(access_log.record, record)
            except Exception:
                log.exception("read API: cannot record %s's decision on %s", identity.subject, approval_id)
                if status == 200:
                    # The decision stands (it was published); say that its access line is missing.
                    body["warning"] = "the decision was taken but its access-log line could not be written"
        return JSONResponse(body, status_code=status)

    return [Route("/v1/approvals/{approval_id}", decide, methods=["POST"])]


def _body(raw: bytes) -> tuple[str | None, str | None, str | None]:
    """(decision, note, problem) from a request body."""
    try:
        data = json.loads(raw or b"null")
    except ValueError:
        return None, None, 'the body must be JSON: {"decision": "approve" | "deny", "note": "..."}'
    if not isinstance(data, dict):
        return None, None, 'the body must be a JSON object: {"decision": "approve" | "deny", "note": "..."}'
    unknown = sorted(set(data) - {"decision", "note"})
    if unknown:
        return None, None, f"unknown field {unknown[0]!r}; the body takes decision and note"
    decision, note = data.get("decision"), data.get("note")
    if decision not in ("approve", "deny"):
        return None, None, f'"decision" must be "approve" or "deny", got {decision!r}'
    if note is not None and not isinstance(note, str):
        return decision, None, '"note" must be text'
    return decision, note, None


def post_decision(
    url: str,
    approval_id: str,
    *,
    approved: bool,
    note: str | None = None,
    token: str | None = None,
    timeout_s: float = 30.0,
    ssl_context: Any = None,
) -> tuple[int, dict[str, Any]]:
    """POST a decision to the read API at `url` (http://HOST:PORT); (status, JSON body). Raises
    `OSError` when the API cannot be reached. Blocks."""
    import urllib.error
    import urllib.parse
    import urllib.request

    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"the read API's URL must look like http://HOST:PORT, got {url!r}")
    body = json.dumps({"decision": "approve" if approved else "deny", "note": note}).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token.strip()}"
    path = f"/v1/approvals/{urllib.parse.quote(approval_id, safe='')}"
    request = urllib.request.Request(url.rstrip("/") + path, data=body, headers=headers, method="POST")  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=ssl_context) as response:  # noqa: S310
            status, raw = int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        status, raw = int(exc.code), exc.read()
    try:
        data = json.loads(raw)
    except ValueError:
        data = {"error": raw[:200].decode("utf-8", "replace")}
    return status, data if isinstance(data, dict) else {"error": str(data)}
