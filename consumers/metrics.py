"""The materializer's Prometheus metrics, kept in a registry of their own.

`MaterializerMetrics` never touches prometheus-client's global registry, so several materializers
(or several tests) can live in one process without "Duplicated timeseries" errors. The read API
serves `render()` at `GET /metrics`.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from consumers.checkpoints import CHECKPOINT_BREAK_KINDS
from consumers.store import DEAD_LETTER_REASONS
from events import EVENT_TYPES

__all__ = ["CHAIN_BREAK_KINDS", "DEAD_LETTER_REASONS", "MaterializerMetrics"]

# DEAD_LETTER_REASONS (the store's): shown at 0 before the first one happens; a reason outside it
# would be accepted too and appear once counted.

CHAIN_BREAK_KINDS = ("gap", "tamper", "conflict", *CHECKPOINT_BREAK_KINDS)
"""The kinds of chain break: a missing `seq`, a hash that does not match, two events claiming one
`seq`, and what the verification of signed checkpoints finds (`consumers.checkpoints`)."""

_BATCH_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_BATCH_RECORDS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


class MaterializerMetrics:
    """Counters, gauges and histograms of one materializer, in their own `CollectorRegistry`.

    Metrics (names as scraped):

    - `callgate_events_stored_total{type}`: events stored, by wire `type`.
    - `callgate_events_duplicate_total`: events dropped because their `event_id` was already stored.
    - `callgate_dead_letters_total{reason}`: undecodable messages sent to the dead-letter table.
    - `callgate_chain_breaks_total{kind}`: chain breaks found, `kind` one of `gap`, `tamper`, `conflict`.
    - `callgate_consumer_lag{topic,partition}`: messages between the consumer's position and the end,
      for the partitions this materializer reads.
    - `callgate_partition_owned{topic,partition}`: 1 for a partition the broker lists that this
      materializer reads, 0 for one it lists that this materializer does not.
    - `callgate_partition_position{topic,partition}` and `callgate_partition_high_watermark{topic,partition}`:
      the next offset this materializer reads (owned partitions only) and the partition's end.
    - `callgate_partition_unread_seconds{topic,partition}`: how long a listed partition has gone without
      a reader (0 while it is read); alert when it exceeds the materializer's grace.
    - `callgate_batch_seconds`: histogram of the time one batch took, from poll to commit.
    - `callgate_batch_records`: histogram of the records in one batch.
    - `callgate_last_event_timestamp_seconds`: the newest event `time` stored so far (Unix seconds).
    - `callgate_last_batch_timestamp_seconds`: when the last batch was recorded (Unix seconds), so an
      alert can tell a stuck consumer from an idle topic.

    Known label values (every event type, `DEAD_LETTER_REASONS`, `CHAIN_BREAK_KINDS`) start at 0 so
    that `rate()` and `increase()` see the first increment.

    Every method is safe to call from several threads at once and never blocks on I/O.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        """This instance's registry; add collectors to it to publish them with `render()`."""
        self._lock = threading.Lock()
        self._lags: dict[tuple[str, int], int] = {}
        self._last_event_at: datetime | None = None
        self._last_batch_at: datetime | None = None

        self._stored = Counter(
            "callgate_events_stored", "Events stored, by wire type.", ["type"], registry=self.registry
        )
        self._duplicates = Counter(
            "callgate_events_duplicate",
            "Events dropped because their event_id was already stored.",
            registry=self.registry,
        )
        self._dead_letters = Counter(
            "callgate_dead_letters",
            "Messages sent to the dead-letter table, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self._chain_breaks = Counter(
            "callgate_chain_breaks",
            "Breaks found in producers' hash chains, by kind (gap, tamper, conflict).",
            ["kind"],
            registry=self.registry,
        )
        self._lag = Gauge(
            "callgate_consumer_lag",
            "Messages between the consumer's position and the end of the partition.",
            ["topic", "partition"],
            registry=self.registry,
        )
        self._owned = Gauge(
            "callgate_partition_owned",
            "1 if this materializer reads the listed partition, 0 if it does not.",
            ["topic", "partition"],
            registry=self.registry,
        )
        self._position = Gauge(
            "callgate_partition_position",
            "The next offset this materializer reads in the partition.",
            ["topic", "partition"],
            registry=self.registry,
        )
        self._high_watermark = Gauge(
            "callgate_partition_high_watermark",
            "The partition's end offset as last seen.",
            ["topic", "partition"],
            registry=self.registry,
        )
        self._unread = Gauge(
            "callgate_partition_unread_seconds",
            "Seconds a listed partition has gone without a reader (0 while it is read).",
            ["topic", "partition"],
            registry=self.registry,
        )
        self._partitions: set[tuple[str, int]] = set()
        self._batch_seconds = Histogram(
            "callgate_batch_seconds",
            "Time one batch took, from poll to commit.",
            buckets=_BATCH_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self._batch_records = Histogram(
            "callgate_batch_records",
            "Records in one batch.",
            buckets=_BATCH_RECORDS_BUCKETS,
            registry=self.registry,
        )
        self._last_event = Gauge(
            "callgate_last_event_timestamp_seconds",
            "Newest event time stored so far, in Unix seconds.",
            registry=self.registry,
        )
        self._last_batch = Gauge(
            "callgate_last_batch_timestamp_seconds",
            "When the last batch was recorded, in Unix seconds.",
            registry=self.registry,
        )
        for event_type in EVENT_TYPES:
            self._stored.labels(type=event_type)
        for reason in DEAD_LETTER_REASONS:
            self._dead_letters.labels(reason=reason)
        for kind in CHAIN_BREAK_KINDS:
            self._chain_breaks.labels(kind=kind)

    def record_batch(
        self,
        stored_by_type: Mapping[str, int],
        duplicates: int,
        dead_letters_by_reason: Mapping[str, int],
        chain_breaks_by_kind: Mapping[str, int],
        seconds: float,
        records: int,
        last_event_time: datetime | None,
    ) -> None:
        """Record what one committed batch did.

        `last_event_time` is the newest event `time` in the batch (None if it stored none); the gauge
        only moves forward, since partitions are consumed out of time order. A naive datetime is
        taken as UTC (event times are UTC). Label values outside the known sets are accepted.

        Raises `ValueError`, before recording anything, when a count, `seconds` or `records` is negative.
        """
        counts = [duplicates, records, *stored_by_type.values(), *dead_letters_by_reason.values()]
        counts.extend(chain_breaks_by_kind.values())
        if any(count < 0 for count in counts) or seconds < 0:
            raise ValueError(
                "record_batch: counts and seconds must not be negative "
                f"(stored={dict(stored_by_type)}, duplicates={duplicates}, "
                f"dead_letters={dict(dead_letters_by_reason)}, chain_breaks={dict(chain_breaks_by_kind)}, "
                f"seconds={seconds}, records={records})"
            )
        for event_type, count in stored_by_type.items():
            if count:
                self._stored.labels(type=event_type).inc(count)
        if duplicates:
            self._duplicates.inc(duplicates)
        for reason, count in dead_letters_by_reason.items():
            if count:
                self._dead_letters.labels(reason=reason).inc(count)
        for kind, count in chain_breaks_by_kind.items():
            if count:
                self._chain_breaks.labels(kind=kind).inc(count)
        self._batch_seconds.observe(seconds)
        self._batch_records.observe(records)

        now = time.time()
        with self._lock:
            self._last_batch_at = datetime.fromtimestamp(now, UTC)
            self._last_batch.set(now)
            if last_event_time is not None:
                if last_event_time.tzinfo is None:
                    last_event_time = last_event_time.replace(tzinfo=UTC)
                if self._last_event_at is None or last_event_time > self._last_event_at:
                    self._last_event_at = last_event_time
                    self._last_event.set(last_event_time.timestamp())

    def set_lag(self, topic: str, partition: int, lag: int) -> None:
        """Set the lag of one partition. A negative lag (an end offset read before the position moved)
        is recorded as 0."""
        # End offsets and positions are read at different moments, so their difference can dip below
        # zero for an instant; a negative lag would only confuse alerts.
        lag = max(lag, 0)
        with self._lock:
            self._lags[(topic, partition)] = lag
            self._lag.labels(topic=topic, partition=str(partition)).set(lag)

    def remove_lag(self, topic: str, partition: int) -> None:
        """Forget a partition's lag (after it was revoked), so no stale value is scraped. No-op if unknown."""
        with self._lock:
            if self._lags.pop((topic, partition), None) is not None:
                self._lag.remove(topic, str(partition))

    def set_partition(
        self,
        topic: str,
        partition: int,
        *,
        owned: bool,
        position: int | None,
        high_watermark: int | None,
        unread_s: float,
    ) -> None:
        """Record what the materializer knows of one partition the broker lists. `position` None (not
        owned, or not known yet) and `high_watermark` None (not known yet) leave those series out."""
        labels = {"topic": topic, "partition": str(partition)}
        with self._lock:
            self._partitions.add((topic, partition))
            self._owned.labels(**labels).set(1 if owned else 0)
            self._unread.labels(**labels).set(max(unread_s, 0.0))
            for gauge, value in ((self._position, position), (self._high_watermark, high_watermark)):
                if value is None:
                    _remove(gauge, topic, partition)
                else:
                    gauge.labels(**labels).set(value)
            if not owned and self._lags.pop((topic, partition), None) is not None:
                self._lag.remove(topic, str(partition))

    def remove_partition(self, topic: str, partition: int) -> None:
        """Forget a partition the broker no longer lists (every series of it). No-op if unknown."""
        with self._lock:
            self._partitions.discard((topic, partition))
            for gauge in (self._owned, self._unread, self._position, self._high_watermark):
                _remove(gauge, topic, partition)
            if self._lags.pop((topic, partition), None) is not None:
                self._lag.remove(topic, str(partition))

    def lag_total(self) -> int:
        """The sum of the lags last set for the partitions currently assigned."""
        with self._lock:
            return sum(self._lags.values())

    @property
    def last_event_at(self) -> datetime | None:
        """The newest event time recorded so far (UTC), or None before the first."""
        with self._lock:
            return self._last_event_at

    @property
    def last_batch_at(self) -> datetime | None:
        """When `record_batch` was last called (UTC), or None before the first batch."""
        with self._lock:
            return self._last_batch_at

    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition of this instance's registry and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def _remove(gauge: Gauge, topic: str, partition: int) -> None:
    # prometheus-client raises KeyError for a label set it never saw.
    with contextlib.suppress(KeyError):
        gauge.remove(topic, str(partition))
