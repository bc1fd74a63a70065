"""Reviewers' decisions on approval requests, over Kafka: the decisions topic.

A decision is a sealed `ApprovalResolvedEvent` (the reviewer's desk writes it, `consumers.approvals`)
sent twice: to the events topic, where the materializer stores it like any event, and to the
decisions topic (`DECISIONS_TOPIC`, keyed by approval id), which waiting gates read.

`KafkaDecisions` is the gates' side: it reads the decisions topic from its beginning (a decision
taken while no gate was running, before a paused run is resumed in a new process, is found there),
keeps the decisions by approval id, and wakes waiters when one arrives. It fits
`interceptor_core.approvals.DecisionSource`; `RemoteApprovals(KafkaDecisions(...),
claims=ApiDecisions(...))` is an approval handler (it cannot claim an approval by itself).
Without signed decisions (below), who may write to the decisions topic may approve: give only the
desk write access (Kafka ACLs), and every gate read access.

`ApiDecisions` is the other way for a gate that cannot reach Kafka: it asks the read API for the
requests it waits for (the named query `approval_request`, whose `decision` column is the deciding
event) every `interval_s`, with a token that may read them (a `tenant:<id>`, `auditor` or `reviewer`
role). It also claims an approval before the call runs (`claim`: `POST /v1/approvals/{id}/claim`),
which the read API grants once per approval id for the whole deployment, and tells a gate whether
a request is stored already (`recorded`), so that a call asked again (resumed in a new process)
records no second request.

**Signed decisions.** The desk signs each decision it takes with its Ed25519 key (`callgate keygen`;
`callgate materialize --decision-key FILE`): `sign_decision` puts into the event's `signature` the
signature lines of a C2SP signed note whose body is

    callgate decision v1
    <approval id>
    <SHA-256 hex of the canonical JSON of the event, without its chain fields and signature>

so the signature covers every field a gate reads (approved, by, note, the binding to the call, the
time) and none the desk's chain adds. `decision_problem(event, keys)` says why a decision is not
signed by one of `keys` (unsigned, malformed, altered, forged or unknown signer), or None; a gate's
`RemoteApprovals(..., trusted_keys=...)` ignores, logs and counts such decisions. With signed
decisions, writing to the decisions topic no longer lets anyone approve.

Imports aiokafka (for `KafkaDecisions` and `DecisionPublisher`) when they start; import this module
only where decisions are read or written.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from events.chain import canonical_json
from events.codec import encode_event, parse_event
from events.kafka import DEFAULT_TOPIC
from events.models import ApprovalResolvedEvent
from events.signing import SigningError, SigningKey, VerifyingKey, open_signed_note, signed_note

__all__ = [
    "DECISIONS_TOPIC",
    "ApiDecisions",
    "DecisionPublisher",
    "KafkaDecisions",
    "decision_problem",
    "sign_decision",
]

log = logging.getLogger(__name__)

DECISIONS_TOPIC: Final = "callgate.decisions"
"""The default decisions topic (one partition: decisions are few, and read whole)."""

DECISION_NOTE_HEADER: Final = "callgate decision v1"
"""The first line of the note a decision's signature is over."""

_UNSIGNED_FIELDS: Final = frozenset({"hash", "prev_hash", "seq", "producer_id", "schema_version", "signature"})


def _decision_body(event: ApprovalResolvedEvent) -> bytes:
    data = {k: v for k, v in event.model_dump(mode="json").items() if k not in _UNSIGNED_FIELDS}
    digest = hashlib.sha256(canonical_json(data)).hexdigest()
    return f"{DECISION_NOTE_HEADER}\n{event.approval_id}\n{digest}\n".encode()


def sign_decision(event: ApprovalResolvedEvent, key: SigningKey) -> str:
    """The value of `event`'s `signature` field: the signature lines of the signed note of its body
    (module docstring). `event`'s chain fields and signature do not matter (the desk signs before
    it seals)."""
    body = _decision_body(event)
    return signed_note(body, key)[len(body) + 1 :].decode("utf-8")


def decision_problem(event: ApprovalResolvedEvent, keys: Mapping[str, VerifyingKey]) -> str | None:
    """Why `event` is not a decision signed by one of `keys` (keyed by key id, as
    `events.signing.load_trusted_keys` gives them), or None when it is. Never raises."""
    if not event.signature:
        return "it is not signed"
    note = _decision_body(event) + b"\n" + event.signature.encode("utf-8")
    try:
        _, verified = open_signed_note(note, keys)
    except SigningError as exc:
        return f"its signature is malformed ({exc})"
    if not verified:
        return "its signature is not a trusted key's (forged, altered, or by a key not trusted)"
    return None


class KafkaDecisions:
    """The decisions of the decisions topic, read from its beginning, by approval id.

    `start()` (async) creates the topic if it is missing, assigns every partition and starts the
    reading task; `close()` stops it (idempotent). `decisions` and `changed` follow
    `interceptor_core.approvals.DecisionSource`; call everything from one event loop. A record that
    is not an `ApprovalResolved` event with an approval id is logged and skipped.
    """

    def __init__(self, bootstrap_servers: str, topic: str = DECISIONS_TOPIC, **consumer_options: Any) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.consumer_options = consumer_options
        self._by_id: dict[str, list[ApprovalResolvedEvent]] = defaultdict(list)
        self._changed = asyncio.Event()
        self._consumer: Any = None
        self._task: asyncio.Task[None] | None = None
        self.read = 0
        """Records read so far (decisions and skipped ones)."""

    async def start(self) -> None:
        """Create the topic if missing, assign its partitions from their beginning, start reading."""
        from aiokafka import AIOKafkaConsumer, TopicPartition

        from events.kafka import ensure_topic

        await ensure_topic(self.bootstrap_servers, self.topic, 1)
        options = {"fetch_max_wait_ms": 20, **self.consumer_options}
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap_servers, enable_auto_commit=False, group_id=None, **options
        )
        await consumer.start()
        try:
            partitions = await consumer._client.fetch_all_metadata()
            listed = sorted(partitions.partitions_for_topic(self.topic) or ())
            tps = [TopicPartition(self.topic, p) for p in listed]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
        except BaseException:
            await consumer.stop()
            raise
        self._consumer = consumer
        self._task = asyncio.create_task(self._read(), name=f"callgate-decisions-{self.topic}")

    async def _read(self) -> None:
        consumer = self._consumer
        while True:
            batches = await consumer.getmany(timeout_ms=500)
            arrived = False
            for records in batches.values():
                for record in records:
                    self.read += 1
                    try:
                        event = parse_event(record.value)
                    except Exception as exc:
                        log.warning(
                            "decisions topic %s: record at offset %d skipped: %s", self.topic, record.offset, exc
                        )
                        continue
                    if not isinstance(event, ApprovalResolvedEvent) or event.approval_id is None:
                        log.warning("decisions topic %s: offset %d is no decision; skipped", self.topic, record.offset)
                        continue
                    self._by_id[event.approval_id].append(event)
                    arrived = True
            if arrived:
                changed, self._changed = self._changed, asyncio.Event()
                changed.set()

    def decisions(self, approval_id: str) -> list[ApprovalResolvedEvent]:
        """Every decision read for `approval_id`, oldest first."""
        return list(self._by_id.get(approval_id, ()))

    def changed(self) -> asyncio.Event:
        """An event set when the next decision arrives (take it before reading `decisions`)."""
        return self._changed

    async def close(self) -> None:
        """Stop reading; idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()

    async def __aenter__(self) -> KafkaDecisions:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class DecisionPublisher:
    """Sends a reviewer's sealed decision to the events topic (keyed by its producer id, as the
    gates' sinks do, so one producer's chain stays in one partition) and to the decisions topic
    (keyed by approval id), waiting for both acknowledgements.

    `publish` blocks up to `timeout_s` and raises what the producer raised (the decision is then
    not taken: the caller answers an error); safe from several threads (one producer on a loop of
    its own thread). `close` is idempotent.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        events_topic: str = DEFAULT_TOPIC,
        decisions_topic: str = DECISIONS_TOPIC,
        *,
        timeout_s: float = 10.0,
        **producer_options: Any,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.events_topic = events_topic
        self.decisions_topic = decisions_topic
        self.timeout_s = timeout_s
        self.producer_options = producer_options
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._producer: Any = None

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="callgate-decision-publisher", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    async def _send(self, event: ApprovalResolvedEvent) -> None:
        from aiokafka import AIOKafkaProducer

        from events.kafka import ensure_topic

        if self._producer is None:
            await ensure_topic(self.bootstrap_servers, self.decisions_topic, 1)
            producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap_servers, acks="all", **self.producer_options)
            await producer.start()
            self._producer = producer
        body = encode_event(event)
        assert event.approval_id is not None  # the desk's decisions always carry one
        await self._producer.send_and_wait(self.events_topic, body, key=event.producer_id.encode())
        await self._producer.send_and_wait(self.decisions_topic, body, key=event.approval_id.encode())

    def publish(self, event: ApprovalResolvedEvent) -> None:
        """Send `event` to both topics and wait for the broker's acknowledgements (see the class)."""
        if event.approval_id is None:
            raise ValueError("a decision needs an approval_id")
        loop = self._start()
        asyncio.run_coroutine_threadsafe(self._send(event), loop).result(self.timeout_s)

    def close(self) -> None:
        """Stop the producer and its thread; idempotent."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return

        async def stop() -> None:
            if self._producer is not None:
                await self._producer.stop()
                self._producer = None

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), loop).result(self.timeout_s)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(self.timeout_s)
        loop.close()


class ApiDecisions:
    """The decisions of the requests being waited for, asked of a read API (see the module docstring).

    `decisions(approval_id)` starts watching that id; a task started by `start()` asks the API for
    every watched id each `interval_s` (one GET each, in a worker thread) until its decision is
    stored, then wakes the waiters. An unreachable API or a refused token is logged and asked again.
    Call everything from one event loop; `close()` is idempotent.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        interval_s: float = 0.5,
        timeout_s: float = 5.0,
        claimant: str | None = None,
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"the read API's URL must look like http://HOST:PORT, got {url!r}")
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.url = url.rstrip("/")
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._token = token
        self.claimant = claimant or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        """Who claims approvals (recorded with each claim): by default host, process id and a nonce."""
        self._watched: set[str] = set()
        self._found: dict[str, list[ApprovalResolvedEvent]] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        return f"ApiDecisions({self.url!r}, token={'set' if self._token else None})"  # never the token

    async def start(self) -> None:
        """Start asking (idempotent)."""
        if self._task is None:
            self._task = asyncio.create_task(self._poll(), name="callgate-api-decisions")

    def decisions(self, approval_id: str) -> list[ApprovalResolvedEvent]:
        """The decision stored for `approval_id` (none yet: an empty list, and the id is watched)."""
        found = self._found.get(approval_id)
        if found is None:
            self._watched.add(approval_id)
            return []
        return list(found)

    def changed(self) -> asyncio.Event:
        """An event set when the next decision is found."""
        return self._changed

    async def _poll(self) -> None:
        while True:
            arrived = False
            for approval_id in sorted(self._watched):
                try:
                    decision = await asyncio.to_thread(self._ask, approval_id)
                except Exception as exc:
                    log.warning("read API %s: cannot read approval %s: %s", self.url, approval_id, exc)
                    continue
                if decision is not None:
                    self._found[approval_id] = [decision]
                    self._watched.discard(approval_id)
                    arrived = True
            if arrived:
                changed, self._changed = self._changed, asyncio.Event()
                changed.set()
            await asyncio.sleep(self.interval_s)

    async def recorded(self, request: Any) -> Any:
        """`request` (an `interceptor_core.ApprovalRequest`) as the store holds it, when it holds a
        request of its approval id for the same call id, argument digest and policy version, pending
        or decided: `request` with the stored expiry (`interceptor_core.approvals.RecordedRequests`);
        else None. A stored decision is kept for `decisions`. Raises when the API cannot be asked."""
        row = await asyncio.to_thread(self._row, request.approval_id)
        if row is None:
            return None
        binding = (row.get("call_id"), row.get("args_digest"), row.get("policy_version"))
        if binding != (request.call_id, request.args_digest, request.policy_version):
            return None
        if row.get("decision") is not None and request.approval_id not in self._found:
            self._found[request.approval_id] = [self._decision_of(request.approval_id, row["decision"])]
            self._watched.discard(request.approval_id)
        expires = row.get("expires_at")
        return dataclasses.replace(request, expires_at=datetime.fromisoformat(expires) if expires else None)

    def _row(self, approval_id: str) -> dict[str, Any] | None:
        query = urllib.parse.urlencode({"approval_id": approval_id})
        headers = {"Accept": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        request = urllib.request.Request(f"{self.url}/v1/queries/approval_request?{query}", headers=headers)  # noqa: S310
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310
            rows = json.loads(response.read()).get("rows") or []
        return dict(rows[0]) if rows else None

    def _ask(self, approval_id: str) -> ApprovalResolvedEvent | None:
        row = self._row(approval_id)
        decision = row.get("decision") if row else None
        if decision is None:
            return None
        return self._decision_of(approval_id, decision)

    @staticmethod
    def _decision_of(approval_id: str, decision: Any) -> ApprovalResolvedEvent:
        event = parse_event(decision)
        if not isinstance(event, ApprovalResolvedEvent) or event.approval_id != approval_id:
            raise ValueError(f"the stored decision of {approval_id} is not an ApprovalResolved of it")
        return event

    async def claim(self, request: Any, decision: ApprovalResolvedEvent) -> str | None:
        """Claim the approval of `request` (an `interceptor_core.ApprovalRequest`) for this process,
        just before its call runs (`interceptor_core.approvals.ApprovalClaims`): None when the read
        API granted it, else why not. An unreachable API or a 5xx is asked again every `interval_s`
        until the request expires (at most `timeout_s` without an expiry); then the claim is
        refused: the call never runs on an unrecorded claim."""
        deadline = time.monotonic() + (
            max(0.0, request.expires_at.timestamp() - time.time()) if request.expires_at else self.timeout_s
        )
        while True:
            try:
                status, body = await asyncio.to_thread(self._post_claim, request)
            except Exception as exc:
                status, body = 0, {"error": f"{type(exc).__name__}: {exc}"}
            if status == 200:
                return None
            error = str(body.get("error") or body)
            if 0 < status < 500:
                return error
            if time.monotonic() >= deadline:
                return f"its claim could not be recorded ({error})"
            log.warning(
                "read API %s: claim of approval %s not recorded (%s); asking again",
                self.url,
                request.approval_id,
                error,
            )
            await asyncio.sleep(self.interval_s)

    def _post_claim(self, request: Any) -> tuple[int, dict[str, Any]]:
        body = json.dumps(
            {"call_id": request.call_id, "args_digest": request.args_digest, "claimant": self.claimant}
        ).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        path = f"/v1/approvals/{urllib.parse.quote(request.approval_id, safe='')}/claim"
        post = urllib.request.Request(self.url + path, data=body, headers=headers, method="POST")  # noqa: S310
        try:
            with urllib.request.urlopen(post, timeout=self.timeout_s) as response:  # noqa: S310
                status, raw = int(response.status), response.read()
        except urllib.error.HTTPError as exc:
            status, raw = int(exc.code), exc.read()
        try:
            data = json.loads(raw)
        except ValueError:
            # Not the claim route's answer: an API without a reviewers' desk, or something else.
            shown = raw[:200].decode("utf-8", "replace")
            data = {"error": f"{self.url} has no claim route (a read API with the reviewers' desk?): {shown}"}
        return status, data if isinstance(data, dict) else {"error": str(data)}

    async def close(self) -> None:
        """Stop asking; idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def __aenter__(self) -> ApiDecisions:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
