"""The materializer: a Kafka consumer group that turns decision events into the DuckDB audit store.

Per batch, one DuckDB transaction stores the rows and the partition offsets; the Kafka commit
follows the DuckDB commit. The store's offsets are the truth: on assignment each partition seeks to
them, so a crash between the two commits replays at most one batch, and the `event_id` key drops the
duplicates. An offset the broker no longer has (it lost its log) restarts that partition from the
earliest offset; deduplication absorbs the replay. Undecodable messages become dead letters and
never stop a partition.

`--drain` (what CI runs) reads every assigned partition to its end offset as of the start, records
the chain gaps still open, commits and returns.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from consumers.store import AuditStore, IngestResult, RawRecord

log = logging.getLogger("callgate.materializer")


@dataclass
class RunSummary:
    """What one run of the materializer did."""

    batches: int = 0
    records: int = 0
    stored: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    chain_breaks: int = 0
    gaps_recorded: int = 0
    partitions: list[int] = field(default_factory=list)
    ingest_seconds: float = 0.0
    """From the first batch received to the end of the run (group join excluded)."""


@dataclass
class _State:
    last_batch_at: float | None = None
    error: str | None = None
    lag: dict[int, int] = field(default_factory=dict)


class Materializer:
    """Consumes `topic` on `bootstrap` into the store at `db_path`.

    - `group`: the consumer group (its committed offsets are advisory; the store's are the truth).
    - `api`: ("host", port) to serve `/healthz`, `/metrics` and `/v1/queries/...` while running.
    - `gap_grace_s`: in a continuous run, a chain gap is recorded once it has stayed open this long.
    - `consumer_options` go to `aiokafka.AIOKafkaConsumer`.

    Opening the store raises `StoreLockedError` before anything touches Kafka when another process
    holds the file. `run` blocks (async) until `stop()` or, with `drain=True`, the end of the topic.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        db_path: str,
        *,
        group: str = "callgate-materializer",
        api: tuple[str, int] | None = None,
        batch_max: int = 5000,
        poll_ms: int = 500,
        gap_grace_s: float = 60.0,
        join_timeout_s: float = 60.0,
        **consumer_options: Any,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.db_path = db_path
        self.group = group
        self.batch_max = batch_max
        self.poll_ms = poll_ms
        self.gap_grace_s = gap_grace_s
        self.join_timeout_s = join_timeout_s
        self.consumer_options = consumer_options
        self.store = AuditStore(db_path)
        self._stop = asyncio.Event()
        self._state = _State()
        self._api_address = api
        self.api: Any = None
        self.metrics: Any = None

    def stop(self) -> None:
        """Ask the run to finish the batch in hand, commit and return. Safe from a signal handler
        on the event loop's thread."""
        self._stop.set()

    # -- the read API ----------------------------------------------------------------------------

    def start_api(self) -> None:
        """Serve the read API at the `api` address given (idempotent); `self.api.url` says where."""
        if self.api is not None:
            return
        from consumers.api import ApiServer, HealthStatus, build_app
        from consumers.metrics import MaterializerMetrics
        from consumers.runner import StoreQueryRunner

        self.metrics = MaterializerMetrics()
        state = self._state

        metrics = self.metrics

        def health() -> HealthStatus:
            return HealthStatus(
                ok=state.error is None,
                detail=state.error or "consuming",
                last_batch_at=metrics.last_batch_at,
                last_event_at=metrics.last_event_at,
                lag_total=metrics.lag_total(),
            )

        app = build_app(StoreQueryRunner(self.store), self.metrics, health)
        host, port = self._api_address or ("127.0.0.1", 0)
        self.api = ApiServer(app, host=host, port=port)
        self.api.start()

    # -- the loop --------------------------------------------------------------------------------

    async def run(self, *, drain: bool = False) -> RunSummary:
        """Consume until `stop()` (or, with `drain`, the end offsets as of the start)."""
        from aiokafka import AIOKafkaConsumer, TopicPartition
        from aiokafka.structs import OffsetAndMetadata

        summary = RunSummary()
        if self._api_address is not None:
            self.start_api()
        if drain and not await _topic_exists(self.bootstrap, self.topic, self.consumer_options):
            # Nothing was ever published: an empty drain, not a consumer left waiting for a join.
            log.warning("topic %s does not exist on %s; nothing to drain", self.topic, self.bootstrap)
            return summary

        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_records=self.batch_max,
            **self.consumer_options,
        )
        store = self.store
        listener = _listener(self, consumer)
        consumer.subscribe([self.topic], listener=listener)
        await consumer.start()
        try:
            ends: dict[Any, int] | None = None
            first_batch_at: float | None = None
            deadline = time.monotonic() + self.join_timeout_s
            last_gap_check = time.monotonic()
            while not self._stop.is_set():
                batch = await consumer.getmany(timeout_ms=self.poll_ms, max_records=self.batch_max)
                assigned = consumer.assignment()
                if drain and ends is None:
                    if not assigned:
                        if time.monotonic() > deadline:
                            raise TimeoutError(
                                f"no partition of {self.topic} was assigned within {self.join_timeout_s} s"
                            )
                        continue
                    ends = await consumer.end_offsets(list(assigned))
                    summary.partitions = sorted(tp.partition for tp in assigned)
                records = [record for rows in batch.values() for record in rows]
                if records and first_batch_at is None:
                    first_batch_at = time.perf_counter()
                if records:
                    offsets = {(tp.topic, tp.partition): rows[-1].offset + 1 for tp, rows in batch.items() if rows}
                    raw = [RawRecord(r.topic, r.partition, r.offset, r.key, r.value, r.timestamp) for r in records]
                    started = time.perf_counter()
                    result = await asyncio.get_running_loop().run_in_executor(None, store.ingest, raw, offsets)
                    # The store committed first: a failed Kafka commit only costs a replay.
                    try:
                        await consumer.commit(
                            {TopicPartition(t, p): OffsetAndMetadata(o, "") for (t, p), o in offsets.items()}
                        )
                    except Exception as exc:
                        log.warning("Kafka offset commit failed (%s); the store's offsets stand", exc)
                    summary.batches += 1
                    summary.records += len(records)
                    summary.stored += result.stored
                    summary.duplicates += result.duplicates
                    summary.dead_letters += result.dead_letters
                    summary.chain_breaks += result.chain_breaks
                    self._state.last_batch_at = time.time()
                    self._record_metrics(records, result, time.perf_counter() - started)
                await self._update_lag(consumer, assigned)
                if drain and ends is not None and await _reached(consumer, ends):
                    break
                if not drain and time.monotonic() - last_gap_check > min(self.gap_grace_s, 30.0):
                    last_gap_check = time.monotonic()
                    older = datetime.now(UTC) - timedelta(seconds=self.gap_grace_s)
                    summary.gaps_recorded += await asyncio.get_running_loop().run_in_executor(
                        None, functools.partial(store.close_open_gaps, older_than=older)
                    )
            if drain:
                summary.gaps_recorded += store.close_open_gaps()
            if first_batch_at is not None:
                summary.ingest_seconds = time.perf_counter() - first_batch_at
        except Exception as exc:
            self._state.error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            await consumer.stop()
        return summary

    def _record_metrics(self, records: list[Any], result: IngestResult, seconds: float) -> None:
        if self.metrics is None:
            return
        self.metrics.record_batch(
            stored_by_type=result.stored_by_type,
            duplicates=result.duplicates,
            dead_letters_by_reason=result.dead_letters_by_reason,
            chain_breaks_by_kind=result.chain_breaks_by_kind,
            seconds=seconds,
            records=len(records),
            last_event_time=result.last_event_time,
        )

    async def _update_lag(self, consumer: Any, assigned: Any) -> None:
        for tp in assigned:
            high = consumer.highwater(tp)
            if high is None:
                continue
            try:
                position = await consumer.position(tp)
            except Exception as exc:  # a partition revoked mid-way: its lag is no longer ours to report
                log.debug("no position for %s: %s", tp, exc)
                continue
            lag = max(0, high - position)
            self._state.lag[tp.partition] = lag
            if self.metrics is not None:
                self.metrics.set_lag(tp.topic, tp.partition, lag)

    def close(self) -> None:
        """Stop the read API and close the store (idempotent)."""
        if self.api is not None:
            self.api.stop()
            self.api = None
        self.store.close()


def _listener(materializer: Materializer, consumer: Any) -> Any:
    from aiokafka.abc import ConsumerRebalanceListener

    class SeekToStore(_SeekToStore, ConsumerRebalanceListener):  # type: ignore[misc]
        pass

    return SeekToStore(materializer, consumer)


class _SeekToStore:
    """On assignment, each partition seeks to the offset the store committed (the truth)."""

    def __init__(self, materializer: Materializer, consumer: Any) -> None:
        self.materializer = materializer
        self.consumer = consumer

    async def on_partitions_revoked(self, revoked: Any) -> None:
        return None

    async def on_partitions_assigned(self, assigned: Any) -> None:
        materializer = self.materializer
        stored: Mapping[int, int] = materializer.store.offsets(materializer.topic)
        for tp in assigned:
            offset = stored.get(tp.partition)
            if offset is None:
                continue
            if offset > 0 and not await self._same_log(tp, offset):
                # The broker lost its log and numbers new records from 0 again (the embedded broker
                # does on a restart): the stored offset now points into other records. Read the
                # partition from the start; the event_id key absorbs anything already stored.
                log.warning("%s no longer holds the records the store read; reading it from the start", tp)
                await self.consumer.seek_to_beginning(tp)
                continue
            self.consumer.seek(tp, offset)

    async def _same_log(self, tp: Any, offset: int) -> bool:
        """Whether the record just before the stored offset is still the one the store read."""
        from aiokafka import AIOKafkaConsumer

        materializer = self.materializer
        probe = AIOKafkaConsumer(
            bootstrap_servers=materializer.bootstrap, enable_auto_commit=False, auto_offset_reset="none"
        )
        await probe.start()
        try:
            probe.assign([tp])
            probe.seek(tp, offset - 1)
            # A fetch may start at the beginning of a compressed batch: look for the exact offset.
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    batch = await probe.getmany(tp, timeout_ms=1000, max_records=500)
                except Exception as exc:  # out of range: the log is shorter than what the store read
                    log.debug("probe of %s at %d failed: %s", tp, offset - 1, exc)
                    return False
                for record in batch.get(tp, []):
                    if record.offset == offset - 1:
                        return materializer.store.holds(tp.topic, tp.partition, record.offset, record.value)
                    if record.offset >= offset:
                        return False
            return False
        finally:
            await probe.stop()


async def _topic_exists(bootstrap: str, topic: str, options: Mapping[str, Any]) -> bool:
    from aiokafka import AIOKafkaConsumer

    probe = AIOKafkaConsumer(bootstrap_servers=bootstrap, **{k: v for k, v in options.items() if "timeout" in k})
    await probe.start()
    try:
        return topic in await probe.topics()
    finally:
        await probe.stop()


async def _reached(consumer: Any, ends: Mapping[Any, int]) -> bool:
    """True when every partition's position is at (or past) its end offset as of the start, and
    at the high watermark the last fetch reported (some brokers answer the offset request with the
    start of their last compressed batch rather than its end)."""
    for tp, end in ends.items():
        position = await consumer.position(tp)
        highwater = consumer.highwater(tp)
        if position < end or highwater is None or position < highwater:
            return False
    return True
