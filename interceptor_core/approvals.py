"""Asking a human: what the approval handler receives and may answer, and the durable request.

A call whose chain returned `RequireApproval` becomes an `ApprovalRequest` bound to that exact call:
its `approval_id` is derived from the call id, the digest of the validated arguments and the policy
version (`approval_id_for`), so the same call asked again, in this process or after a resume in
another one, asks for the same id, and a call whose arguments changed asks for a new one.

`RemoteApprovals` is an approval handler that waits for a reviewer's decision arriving from outside
the process (a `DecisionSource`: the decisions topic on Kafka, `events.decisions.KafkaDecisions`, the
read API, `events.decisions.ApiDecisions`, or any other) and honours it only for the exact call: same
approval id, call id, argument digest and policy version, decided before the request expires, signed
by a trusted key (when given `trusted_keys`), and used once: once per process always, and once per
deployment when an `ApprovalClaims` (the read API's claim route) grants it.

A request is recorded once: a call asked again under the same approval id (resumed by a new process
after its first one was killed, or by its framework after a pause) records no second
`ApprovalRequested` when the gate's handler can tell it is recorded already (`RecordedRequests`:
the read API, `events.decisions.ApiDecisions`); its first ask's expiry then stands.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from events.chain import canonical_json
from interceptor_core.context import RunContext
from interceptor_core.exceptions import ConfigurationError

if TYPE_CHECKING:
    from events.models import ApprovalResolvedEvent
    from events.signing import VerifyingKey

__all__ = [
    "PER_PROCESS",
    "Approval",
    "ApprovalClaims",
    "ApprovalHandler",
    "ApprovalRequest",
    "DecisionSource",
    "PerProcess",
    "RecordedRequests",
    "RemoteApprovals",
    "approval_id_for",
    "args_digest",
    "expiry",
]

log = logging.getLogger(__name__)


def args_digest(args: Mapping[str, Any]) -> str:
    """SHA-256 hex of the canonical JSON (sorted keys, no spaces) of `args` in JSON mode: what a
    request and its decision are bound to."""
    return hashlib.sha256(canonical_json(args)).hexdigest()


def approval_id_for(call_id: str, digest: str, policy_version: str | None) -> str:
    """The id of the request for one call: the first 32 hex digits of the SHA-256 of the call id,
    the arguments' digest and the policy version (empty when none), joined by newlines."""
    material = "\n".join((call_id, digest, policy_version or ""))
    return hashlib.sha256(material.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """One call waiting for a human. `args` are the arguments as the tool would get them.

    `approval_id`, `args_digest`, `policy_version`, `rule` and `expires_at` bind the request to the
    exact call (see the module docstring); the `ApprovalRequested` event carries them.
    """

    tool: str
    args: Mapping[str, Any]
    reason: str
    run: RunContext
    call_id: str
    requested_by: tuple[str, ...] = ()
    approval_id: str = ""
    args_digest: str = ""
    policy_version: str | None = None
    rule: str | None = None
    expires_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Approval:
    """A reviewer's answer: `approved`, who answered (`by`), and a `note` (shown to the model on refusal).

    `event_id` is set when the answer was already recorded as an `ApprovalResolved` event by the
    reviewer's side (a decision from the console, the CLI or the read API): the gate then records no
    second one.
    """

    approved: bool
    by: str | None = None
    note: str | None = None
    event_id: str | None = None


ApprovalHandler: TypeAlias = Callable[[ApprovalRequest], "Awaitable[bool | Approval] | bool | Approval"]
"""An async callable (sync is accepted too) that answers an `ApprovalRequest`: `True`/`False` or an
`Approval`. No answer within the gate's `approval_timeout_s`, an exception or another return value
is a refusal (recorded with the reason in `ApprovalResolved.error`)."""


class DecisionSource(Protocol):
    """Where reviewers' decisions arrive from (the decisions topic; a poll of the read API; a test's list).

    `decisions(approval_id)` is every decision seen so far for that id, oldest first, and returns
    at once. `changed()` returns an event set (in the waiter's loop) whenever a new decision arrives,
    so a waiter re-reads instead of polling. Both are called from the gate's event loop.
    """

    def decisions(self, approval_id: str) -> list[ApprovalResolvedEvent]: ...

    def changed(self) -> asyncio.Event: ...


_UNTRUSTED = "not a trusted desk's decision"


class ApprovalClaims(Protocol):
    """The arbiter of "used once" across processes (`events.decisions.ApiDecisions`: the read API's
    claim route, recorded in the store). `claim` is awaited from the gate's loop just before an
    approved call runs; it returns None when this process may run it, else why not (claimed by
    another process, not reachable in time: the call is then refused)."""

    async def claim(self, request: ApprovalRequest, decision: ApprovalResolvedEvent) -> str | None: ...


class RecordedRequests(Protocol):
    """Where a gate learns that the request of a call is recorded already (`events.decisions.ApiDecisions`:
    the read API's `approval_request` query). `recorded(request)` returns the request as it was
    recorded (`request` with the stored expiry) when the store holds a request of its approval id
    for the same call id, argument digest and policy version, pending or decided; None when it
    holds none. It may raise when it cannot tell (the gate then records the request: one request
    too many is better than none). Awaited from the gate's loop."""

    async def recorded(self, request: ApprovalRequest) -> ApprovalRequest | None: ...


class PerProcess:
    """`RemoteApprovals(..., claims=PER_PROCESS)`: an approval is used once by this handler, not
    claimed across the deployment (see `RemoteApprovals`)."""

    def __repr__(self) -> str:
        return "PER_PROCESS"


PER_PROCESS = PerProcess()


class RemoteApprovals:
    """An approval handler waiting for a reviewer's decision from a `DecisionSource`.

    A decision is honoured only when its `approval_id`, `call_id`, `args_digest` and `policy_version`
    equal the request's, it was taken before the request's `expires_at`, it is signed by one of
    `trusted_keys` (when given: key id -> `events.signing.VerifyingKey`, or the path of a `.pub`
    file or directory, as `callgate keygen` writes them), and this handler has not honoured that
    approval id before. Anything else is ignored (logged, and counted in `ignored`; unsigned or
    forged ones also in `forged`) and the wait goes on, until the request expires: then it answers
    nothing and the gate records the refusal. The wait is cancelled with its run.

    An approval is then claimed from `claims` (default: the source itself when it can claim, as
    `ApiDecisions` can): a refused claim refuses the call, with a note saying the approval was used
    elsewhere, so the model can ask again. A source that cannot claim (`KafkaDecisions`) needs
    `claims=ApiDecisions(...)`, or `claims=PER_PROCESS` to accept that an approval is used once
    per process only (a decision read by two processes would run in both); without either it is a
    `ConfigurationError`, never a silent weaker "once". Safe for many concurrent calls on one loop.

    `recorded(request)` tells the gate whether the request is recorded already, from `records`
    (default: `claims` or the source, whichever can tell, as `ApiDecisions` can): the gate then
    records no second `ApprovalRequested` for a call asked again (see the module docstring).
    """

    def __init__(
        self,
        source: DecisionSource,
        *,
        trusted_keys: Mapping[str, VerifyingKey] | str | os.PathLike[str] | None = None,
        claims: ApprovalClaims | PerProcess | None = None,
        records: RecordedRequests | None = None,
    ) -> None:
        self.source = source
        if isinstance(trusted_keys, str | os.PathLike):
            from events.signing import load_trusted_keys

            trusted_keys = load_trusted_keys(trusted_keys)
        self.trusted_keys = dict(trusted_keys) if trusted_keys is not None else None
        """The desk keys a decision must be signed by (None: signatures are not checked)."""
        if claims is None:
            if not callable(getattr(source, "claim", None)):
                raise ConfigurationError(
                    f"RemoteApprovals({type(source).__name__}(...)): this source cannot hold an approval to one use "
                    "across processes; pass claims=ApiDecisions(url, token=...) (the read API claims it once per "
                    "deployment), or claims=PER_PROCESS to accept once per process"
                )
            claims = source  # type: ignore[assignment]
        self.claims: ApprovalClaims | None = None if isinstance(claims, PerProcess) else claims
        """Where an approval is claimed before its call runs (None: once per process only)."""
        if records is None:
            found: Any = next((r for r in (self.claims, source) if callable(getattr(r, "recorded", None))), None)
            records = found
        self.records = records
        """Where `recorded` asks (None: it answers None)."""
        self.ignored = 0
        """Decisions ignored so far (for another call, expired, used, unsigned or forged)."""
        self.forged = 0
        """Of those, decisions not signed by a trusted key."""
        self._used: set[str] = set()

    async def __call__(self, request: ApprovalRequest) -> Approval:
        """Wait for the decision of `request` (see the class docstring); raises `TimeoutError` once
        the request expired (the gate records that as no answer)."""
        deadline = None if request.expires_at is None else request.expires_at.timestamp()
        seen: set[str] = set()
        while True:
            changed = self.source.changed()
            for decision in self.source.decisions(request.approval_id):
                if (why := self._mismatch(request, decision)) is not None:
                    if decision.event_id not in seen:  # each ignored decision logged and counted once
                        seen.add(decision.event_id)
                        self.ignored += 1
                        self.forged += why.startswith(_UNTRUSTED)
                        log.warning("approval %s: decision %s ignored: %s", request.approval_id, decision.event_id, why)
                    continue
                self._used.add(request.approval_id)
                if decision.approved and self.claims is not None:
                    refused = await self.claims.claim(request, decision)
                    if refused is not None:
                        log.warning("approval %s: not run here: %s", request.approval_id, refused)
                        by = f" by {decision.by}" if decision.by else ""
                        return Approval(False, note=f"it was approved{by}, but {refused}; ask again")
                return Approval(decision.approved, by=decision.by, note=decision.note, event_id=decision.event_id)
            remaining = None if deadline is None else deadline - time.time()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"approval {request.approval_id} expired without a decision")
            async with asyncio.timeout(remaining):
                await changed.wait()

    async def recorded(self, request: ApprovalRequest) -> ApprovalRequest | None:
        """`request` as recorded already, asked of `records` (see `RecordedRequests`); None when it
        is not recorded or nothing can tell. Raises what `records` raises."""
        return None if self.records is None else await self.records.recorded(request)

    def _mismatch(self, request: ApprovalRequest, decision: ApprovalResolvedEvent) -> str | None:
        if decision.approval_id != request.approval_id or decision.call_id != request.call_id:
            return "it is for another call"
        if decision.args_digest != request.args_digest:
            return "it was given for other arguments"
        if decision.policy_version != request.policy_version:
            return "it was given under another policy version"
        if request.expires_at is not None and decision.time > request.expires_at:
            return "it came after the request expired"
        if self.trusted_keys is not None:
            from events.decisions import decision_problem

            if (problem := decision_problem(decision, self.trusted_keys)) is not None:
                return f"{_UNTRUSTED}: {problem}"
        if request.approval_id in self._used:
            return "this approval was used already"
        return None


def expiry(timeout_s: float) -> datetime:
    """The expiry of a request asked now that waits `timeout_s` seconds (UTC, whole milliseconds)."""
    at = datetime.now(UTC) + timedelta(seconds=timeout_s)
    return at.replace(microsecond=at.microsecond // 1000 * 1000)
