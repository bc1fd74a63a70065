"""Signed checkpoints of a producer's chain: the RFC 6962 Merkle root over its events' hashes,
signed with the gate's Ed25519 key as a C2SP signed note, emitted into the chain itself.

A `Checkpointer` belongs to one producer (built with `collect_leaves=True`, so it keeps its
events' hashes as it seals). Its thread folds them into the producer's Merkle tree (off the call
path: about 1 µs per event, bench/gate_overhead.py), signs the root and emits a `Checkpoint` event
through the gate's fan-out:

- after `checkpoint_events` events not yet covered by a checkpoint;
- `checkpoint_s` seconds after the first such event;
- every `heartbeat_s` seconds while idle (a checkpoint of the same tree size: silence is provable);
- once more, with `closing` set, when the gate closes.

Checkpoints are events of the chain, so each covers the checkpoints before it; a checkpoint alone
never asks for another. The signed body (docs/events.md, *Checkpoints*):

    callgate/<producer_id>
    <tree_size>
    <base64 of the 32-byte root>
    callgate-time <RFC 3339 time, microseconds, Z>
    callgate-heartbeat-s <heartbeat_s>
    callgate-closing            (only on the closing checkpoint)

then the C2SP signature line (`events.signing.signed_note`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from events.chain import Producer
from events.signing import SigningKey, checkpoint_body, signed_note

log = logging.getLogger("callgate.events.checkpoints")

ORIGIN_PREFIX = "callgate/"
"""A producer's checkpoint origin is this prefix and its `producer_id`."""


def checkpoint_extensions(at: datetime, heartbeat_s: float, closing: bool) -> list[str]:
    """The extension lines of a checkpoint's signed body."""
    stamp = at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    lines = [f"callgate-time {stamp}", f"callgate-heartbeat-s {heartbeat_s:g}"]
    if closing:
        lines.append("callgate-closing")
    return lines


class Checkpointer:
    """Emits the signed checkpoints of one producer; see the module docstring.

    `emit(fields)` seals and fans out a `Checkpoint` event built from `fields` (the gate's own
    envelope is added by the caller). `noted()` is called by the gate after each event that is not
    a checkpoint; it costs an integer increment and, at the thresholds, one `Event.set`.
    """

    def __init__(
        self,
        producer: Producer,
        key: SigningKey,
        emit: Callable[[dict[str, Any]], object],
        *,
        checkpoint_events: int = 1000,
        checkpoint_s: float = 5.0,
        heartbeat_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if checkpoint_events < 1:
            raise ValueError(f"checkpoint_events must be at least 1, got {checkpoint_events!r}")
        if checkpoint_s <= 0 or heartbeat_s <= 0:
            raise ValueError(f"checkpoint_s and heartbeat_s must be positive, got {checkpoint_s!r}, {heartbeat_s!r}")
        self.producer = producer
        self.key = key
        self.checkpoint_events = checkpoint_events
        self.checkpoint_s = checkpoint_s
        self.heartbeat_s = heartbeat_s
        self._emit = emit
        self._clock = clock
        self._start_lock = threading.Lock()
        self._uncovered = 0
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.emitted = 0
        self.failures = 0

    # -- the call path ---------------------------------------------------------------------------

    def noted(self) -> None:
        """One more event that no checkpoint covers yet (racy by design: a trigger, not a count)."""
        self._uncovered += 1
        # Only at the two thresholds: waking the thread costs more than the rest of this. A count
        # that races past one is caught by `checkpoint_s`.
        if self._uncovered == 1 or self._uncovered == self.checkpoint_events:
            if self._thread is None:
                self._start()
            self._wake.set()

    # -- lifecycle -------------------------------------------------------------------------------

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="callgate-checkpoints", daemon=True)
                self._thread.start()

    def close(self) -> None:
        """Stop the thread and emit the closing checkpoint (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        thread = self._thread
        if thread is not None:
            thread.join()
        self.checkpoint(closing=True)

    # -- the thread ------------------------------------------------------------------------------

    def _run(self) -> None:
        last = self._clock()
        first_uncovered: float | None = None
        while True:
            # Cleared before the state is read: a `noted` after the reads wakes the wait below.
            self._wake.clear()
            if self._closed:
                return
            now = self._clock()
            if self._uncovered and first_uncovered is None:
                first_uncovered = now
            due = last + self.heartbeat_s
            if first_uncovered is not None:
                due = min(due, first_uncovered + self.checkpoint_s)
            if self._uncovered >= self.checkpoint_events or now >= due:
                self.checkpoint()
                last, first_uncovered = self._clock(), None
                continue
            self._wake.wait(due - now)

    def checkpoint(self, *, closing: bool = False) -> None:
        """Fold the new hashes into the tree, sign its root and emit the checkpoint now."""
        try:
            self._uncovered = 0
            size, root = self.producer.tree_root()
            at = datetime.now(UTC)
            body = checkpoint_body(
                ORIGIN_PREFIX + self.producer.producer_id,
                size,
                root,
                checkpoint_extensions(at, self.heartbeat_s, closing),
            )
            note = signed_note(body, self.key)
            self._emit(
                {
                    "time": at,
                    "tree_size": size,
                    "root": root.hex(),
                    "closing": closing,
                    "heartbeat_s": self.heartbeat_s,
                    "key_id": self.key.key_id,
                    "note": note.decode("utf-8"),
                }
            )
            self.emitted += 1
        except Exception:
            self.failures += 1
            log.exception("callgate could not emit a checkpoint of producer %s", self.producer.producer_id)
