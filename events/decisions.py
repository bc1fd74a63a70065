"""Reviewers' decisions on approval requests, over Kafka: the decisions topic.

A decision is a sealed `ApprovalResolvedEvent` (the reviewer's desk writes it, `consumers.approvals`)
sent twice: to the events topic, where the materializer stores it like any event, and to the
decisions topic (`DECISIONS_TOPIC`, keyed by approval id), which waiting gates read.

`KafkaDecisions` is the gates' side: it reads the decisions topic from its beginning (a decision
taken while no gate was running, before a paused run is resumed in a new process, is found there),
keeps the decisions by approval id, and wakes waiters when one arrives. It fits
`interceptor_core.approvals.DecisionSource`; `RemoteApprovals(KafkaDecisions(...))` is an approval
handler. Who may write to the decisions topic may approve: give only the desk write access (Kafka
ACLs), and every gate read access.

`ApiDecisions` is the other way for a gate that cannot reach Kafka: it asks the read API for the
requests it waits for (the named query `approval_request`, whose `decision` column is the deciding
event) every `interval_s`, with a token that may read them (a `tenant:<id>`, `auditor` or `reviewer`
role).

Imports aiokafka (for `KafkaDecisions` and `DecisionPublisher`) when they start; import this module
only where decisions are read or written.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from typing import Any, Final

from events.codec import encode_event, parse_event
from events.kafka import DEFAULT_TOPIC
from events.models import ApprovalResolvedEvent

__all__ = ["DECISIONS_TOPIC", "ApiDecisions", "DecisionPublisher", "KafkaDecisions"]

log = logging.getLogger(__name__)

DECISIONS_TOPIC: Final = "callgate.decisions"
"""The default decisions topic (one partition: decisions are few, and read whole)."""


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

    def __init__(self, url: str, *, token: str | None = None, interval_s: float = 0.5, timeout_s: float = 5.0) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"the read API's URL must look like http://HOST:PORT, got {url!r}")
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self.url = url.rstrip("/")
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._token = token
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

    def _ask(self, approval_id: str) -> ApprovalResolvedEvent | None:
        query = urllib.parse.urlencode({"approval_id": approval_id})
        headers = {"Accept": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        request = urllib.request.Request(f"{self.url}/v1/queries/approval_request?{query}", headers=headers)  # noqa: S310
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310
            rows = json.loads(response.read()).get("rows") or []
        decision = rows[0].get("decision") if rows else None
        if decision is None:
            return None
        event = parse_event(decision)
        if not isinstance(event, ApprovalResolvedEvent) or event.approval_id != approval_id:
            raise ValueError(f"the stored decision of {approval_id} is not an ApprovalResolved of it")
        return event

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
