"""The reviewer's desk: deciding durable approval requests, and the read API's write route.

`ApprovalDesk.decide` is the one place the rule lives:

- deciding needs the `reviewer` role; a reviewer who also holds `tenant:<id>` roles decides only
  those tenants' requests (one without decides every tenant's);
- nobody decides a request made under their own principal (four eyes);
- only a pending request is decided (not decided yet, not expired), once.

A decision is an `ApprovalResolved` event naming the reviewer's authenticated subject in `by`,
sealed into the desk's own chain and published (`events.decisions.DecisionPublisher`: to the events
topic, where it is stored, and to the decisions topic, where the waiting gate reads it).

With a signing key (`callgate materialize --decision-key FILE`, a `callgate keygen` key) the desk
signs every decision (`events.decisions.sign_decision`): gates given its public key honour no other.

**Claims.** An approval is honoured once per deployment: before an approved call runs, its gate
claims the approval (`ApprovalDesk.claim`), and the store is the arbiter: the claim is a row of
`approval_claims`, inserted in one store transaction only when no row for that approval id exists
(a lake runs the transaction again on a conflict with another writer's, and then sees the winner's
row). Exactly one claim succeeds; every other claimant is told who holds it.

`approval_routes` adds to the read API:

- `POST /v1/approvals/{approval_id}`: a JSON body `{"decision": "approve" | "deny", "note": "..."}`;
  200 with the decision, 400 for a bad body, 403 (not a reviewer, another tenant, one's own
  request), 404 (no such request, or not visible to this tenant reviewer), 409 (already decided or
  expired), 503 (the decision could not be published: it is not taken).
- `POST /v1/approvals/{approval_id}/claim`: a JSON body `{"call_id": ..., "args_digest": ...,
  "claimant": "..."}` from the gate about to run the approved call; 200 with the claim, 409 when
  it is claimed already (with who holds it), not approved, expired, or for another call or other
  arguments, 403/404 as above for a token that may not read the request, 503 when the store
  cannot record it (the call does not run). Any token that may read the request may claim it.

Every attempt is an access-log line (query `approval:approve`, `approval:deny`, `approval:claim`).
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
from consumers.store import CREATE_APPROVAL_CLAIMS
from events.chain import Producer, new_event_id
from events.codec import parse_event
from events.models import ZERO_HASH, ApprovalResolvedEvent

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from consumers.access_log import AccessLog
    from events.signing import SigningKey

__all__ = [
    "ApprovalDesk",
    "ClaimStore",
    "DecisionConflict",
    "DecisionError",
    "RequestNotFound",
    "StoreClaims",
    "approval_routes",
    "post_decision",
]

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


class ClaimStore(Protocol):
    """Where claims are recorded, atomically: `claim` inserts the claim of `approval_id` unless one
    exists, and returns (whether this one was inserted, the claim that holds). Blocks; raises when
    it cannot record (the claimant is then refused)."""

    def claim(self, approval_id: str, fields: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]: ...


_CLAIM_COLUMNS = ("approval_id", "call_id", "claimant", "subject", "decision_event_id", "claimed_at")


class StoreClaims:
    """Claims as rows of the audit store's `approval_claims` table (created when missing), through
    `store.transaction`: the check and the insert are one transaction, serialized with the store's
    other writes (a file has one writer; a lake runs it again after a conflicting commit)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._created = False

    def claim(self, approval_id: str, fields: Mapping[str, Any]) -> tuple[bool, dict[str, Any]]:
        def work(con: Any) -> tuple[bool, dict[str, Any]]:
            if not self._created:
                con.execute(CREATE_APPROVAL_CLAIMS)  # a store of an older schema opened elsewhere
            held = con.execute(
                f"SELECT {', '.join(_CLAIM_COLUMNS)} FROM approval_claims WHERE approval_id = ? "  # noqa: S608
                "ORDER BY claimed_at LIMIT 1",
                [approval_id],
            ).fetchone()
            if held is not None:
                return False, dict(zip(_CLAIM_COLUMNS, held, strict=True))
            row = {**{k: fields.get(k) for k in _CLAIM_COLUMNS}, "approval_id": approval_id}
            con.execute(
                f"INSERT INTO approval_claims ({', '.join(_CLAIM_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?)",  # noqa: S608
                [row[k] for k in _CLAIM_COLUMNS],
            )
            return True, row

        result: tuple[bool, dict[str, Any]] = self.store.transaction(work)
        self._created = True
        return result


class ApprovalDesk:
    """Decides approval requests read from the store with the named query `approval_request`, and
    grants the claims of approved ones (module docstring).

    `lookup(approval_id)` returns the request's row (as that query gives it) or None; `publisher`
    sends the decision; `signing_key` signs it (None: unsigned); `claims` records claims (None: the
    claim route answers 503). `decide` and `claim` block (a store read, a publish, a store write)
    and are safe from several threads: decisions of one request are taken one at a time, and a
    request decided here is not decided again before the store has the decision.
    """

    def __init__(
        self,
        lookup: Callable[[str], Mapping[str, Any] | None],
        publisher: Publisher,
        *,
        gate: str = "callgate-desk",
        producer: Producer | None = None,
        signing_key: SigningKey | None = None,
        claims: ClaimStore | None = None,
    ) -> None:
        self.lookup = lookup
        self.publisher = publisher
        self.gate = gate
        self.producer = producer or Producer()
        self.signing_key = signing_key
        self.claims = claims
        self._lock = threading.Lock()
        self._decided: dict[str, str] = {}
        # Approvals this desk took, by approval id: a claim may come before the store has the decision.
        self._approved: dict[str, ApprovalResolvedEvent] = {}

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
            if self.signing_key is not None:
                from events.decisions import sign_decision

                # Signed before it is sealed: the signature covers no chain field.
                unsigned = ApprovalResolvedEvent(
                    **fields, producer_id=self.producer.producer_id, seq=1, prev_hash=ZERO_HASH, hash=ZERO_HASH
                )
                fields["signature"] = sign_decision(unsigned, self.signing_key)
            event = self.producer.seal(ApprovalResolvedEvent, fields)
            self.publisher.publish(event)
            self._decided[approval_id] = f"{'approved' if approved else 'denied'} by {identity.subject}"
            if approved:
                self._approved[approval_id] = event
        log.info("approval %s %s by %s", approval_id, "approved" if approved else "denied", identity.subject)
        return event

    def claim(
        self, identity: Identity, approval_id: str, *, call_id: str, args_digest: str, claimant: str | None = None
    ) -> dict[str, Any]:
        """Claim the approval of request `approval_id` for the call about to run; returns the claim
        (approval_id, call_id, claimant, subject, decision_event_id, claimed_at).

        Raises `Forbidden` / `RequestNotFound` for a request `identity` may not read,
        `DecisionConflict` when the request is not approved (by a decision this desk can verify,
        when it signs), expired, for another call or arguments, or claimed already (naming the
        holder), and what the claim store raises (nothing is claimed then)."""
        if self.claims is None:
            raise RuntimeError("this read API records no claims")
        request = self.lookup(approval_id)
        if request is None:
            raise RequestNotFound(f"no approval request {approval_id!r}")
        tenants = identity.tenants
        everyone = identity.all_tenants or (REVIEWER in identity.roles and not tenants)
        if not everyone and request.get("tenant") not in tenants:
            raise RequestNotFound(f"no approval request {approval_id!r}")
        if request.get("call_id") != call_id or request.get("args_digest") != args_digest:
            raise DecisionConflict(f"request {approval_id} is for another call or other arguments")
        decision = self._approved.get(approval_id) or self._stored_approval(request)
        if decision is None:
            raise DecisionConflict(f"request {approval_id} is {request.get('status')}, not approved")
        expires = _time(request.get("expires_at"))
        now = datetime.now(UTC)
        if expires is not None and expires <= now:
            raise DecisionConflict(f"request {approval_id} expired at {expires.isoformat()}")
        fields = {
            "call_id": call_id,
            "claimant": claimant,
            "subject": identity.subject,
            "decision_event_id": decision.event_id,
            "claimed_at": now,
        }
        won, held = self.claims.claim(approval_id, fields)
        if not won:
            who = held.get("claimant") or held.get("subject")
            raise DecisionConflict(f"the approval of request {approval_id} was already used (claimed by {who})")
        log.info("approval %s claimed by %s (%s)", approval_id, claimant, identity.subject)
        return held

    def _stored_approval(self, request: Mapping[str, Any]) -> ApprovalResolvedEvent | None:
        """The store's approving decision of `request`, when it is one (and, when this desk signs,
        one it signed: a record written straight to the events topic approves nothing)."""
        if request.get("status") != "approved" or request.get("decision") is None:
            return None
        decision = parse_event(request["decision"])
        if not isinstance(decision, ApprovalResolvedEvent) or not decision.approved:
            return None
        if self.signing_key is not None:
            from events.decisions import decision_problem

            key = self.signing_key.public()
            if (problem := decision_problem(decision, {key.key_id: key})) is not None:
                log.warning(
                    "approval %s: the stored decision %s: %s", request.get("approval_id"), decision.event_id, problem
                )
                return None
        return decision


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

    async def logged(
        identity: Identity, at: datetime, started: float, query: str, params: dict[str, Any], status: int
    ) -> bool:
        """Write the request's access-log line; False when it could not be written (logged)."""
        if access_log is None:
            return True
        record = AccessRecord(
            time=at,
            subject=identity.subject,
            roles=tuple(sorted(identity.roles)),
            query=query,
            params=params,
            status=status,
            row_count=None,
            duration_ms=(time.perf_counter() - started) * 1000,
        )
        try:
            await run_in_threadpool(access_log.record, record)
        except Exception:
            log.exception("read API: cannot record %s's %s of %s", identity.subject, query, params["approval_id"])
            return False
        return True

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
        query, params = f"approval:{decision or 'invalid'}", {"approval_id": approval_id, "note": note}
        if not await logged(identity, at, started, query, params, status) and status == 200:
            # The decision stands (it was published); say that its access line is missing.
            body["warning"] = "the decision was taken but its access-log line could not be written"
        return JSONResponse(body, status_code=status)

    async def claim(request: Request) -> Response:
        identity = await identify(request)
        if not isinstance(identity, Identity):
            return identity
        started, at = time.perf_counter(), datetime.now(UTC)
        approval_id: str = request.path_params["approval_id"]
        given, problem = _claim_body(await request.body())
        status, body = 400, {"error": problem}
        if problem is None:
            try:
                held = await run_in_threadpool(
                    desk.claim,
                    identity,
                    approval_id,
                    call_id=given["call_id"],
                    args_digest=given["args_digest"],
                    claimant=given.get("claimant"),
                )
            except Forbidden as exc:
                status, body = 403, {"error": str(exc)}
            except DecisionError as exc:
                status, body = exc.status, {"error": str(exc)}
            except Exception:
                log.exception("read API: the claim of %s could not be recorded", approval_id)
                status, body = 503, {"error": "the claim could not be recorded; the call must not run"}
            else:
                status = 200
                body = {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in held.items()}
        params = {"approval_id": approval_id, **{k: v for k, v in given.items() if k != "args_digest"}}
        await logged(identity, at, started, "approval:claim", params, status)
        return JSONResponse(body, status_code=status)

    return [
        Route("/v1/approvals/{approval_id}", decide, methods=["POST"]),
        Route("/v1/approvals/{approval_id}/claim", claim, methods=["POST"]),
    ]


def _claim_body(raw: bytes) -> tuple[dict[str, Any], str | None]:
    """(fields, problem) from a claim's body."""
    usage = 'the body must be a JSON object: {"call_id": "...", "args_digest": "...", "claimant": "..."}'
    try:
        data = json.loads(raw or b"null")
    except ValueError:
        return {}, usage
    if not isinstance(data, dict):
        return {}, usage
    unknown = sorted(set(data) - {"call_id", "args_digest", "claimant"})
    if unknown:
        return {}, f"unknown field {unknown[0]!r}; the body takes call_id, args_digest and claimant"
    for name in ("call_id", "args_digest"):
        if not isinstance(data.get(name), str) or not data[name]:
            return {}, f'"{name}" must be non-empty text'
    if data.get("claimant") is not None and not isinstance(data["claimant"], str):
        return {}, '"claimant" must be text'
    return data, None


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
