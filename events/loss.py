"""Loss reports: how a sink tells the audit store about events that a dead process took with it.

A process that dies (SIGKILL, OOM) between handing an event to its sink and the sink making it
durable loses that event, and since it is the end of the producer's chain no hole shows: the trail
looks whole. The Kafka sink keeps, per producer, the highest `seq` handed to it and the highest it
spooled, in a memory-mapped file beside its spool (written on every `emit`, it survives the death
of the process). The next sink over that spool directory finds the difference and sends a
`LossReport` record on the producer's key; the materializer stores it as a `gap` chain break at the
first lost seq, so `callgate coverage` fails that producer's chain and says why.

A loss report is not an event: it is not chained, and it claims nothing but a range of seqs that
never arrived. Wire form: one JSON object whose first key is `"type": "LossReport"`.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import struct
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from events.models import EventBase

log = logging.getLogger("callgate.events.loss")

LOSS_REPORT_TYPE = "LossReport"
_PREFIX = b'{"type":"LossReport"'


class LossReport(BaseModel):
    """Events `first_seq`..`last_seq` of `producer_id` were handed to a sink but never reached its
    spool: the process died first. `spool` names the directory where the next sink found this."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: str = LOSS_REPORT_TYPE
    report_id: str
    producer_id: str
    gate: str = ""
    first_seq: int = Field(ge=1)
    last_seq: int = Field(ge=1)
    time: datetime = Field(default_factory=lambda: datetime.now(UTC))
    spool: str = ""

    def detail(self) -> str:
        """One line for an operator: what was lost and how it was found."""
        span = f"seq {self.first_seq}" if self.first_seq == self.last_seq else f"seqs {self.first_seq}..{self.last_seq}"
        return (
            f"{span} lost before reaching the spool (the producer's process died, or its sink dropped "
            f"them); reported by the next sink over {self.spool or 'its spool'}"
        )


def encode_loss_report(report: LossReport) -> bytes:
    """The record value of a report (compact JSON, `type` first)."""
    return json.dumps(report.model_dump(mode="json"), separators=(",", ":")).encode()


def parse_loss_report(value: bytes) -> LossReport | None:
    """The report a record value carries, or None when the value is not a loss report (an event, or
    anything else). A value that starts like a report but is not a valid one raises `ValueError`."""
    if not value.startswith(_PREFIX):
        return None
    try:
        report = LossReport.model_validate_json(value)
    except ValidationError as exc:
        raise ValueError(f"malformed loss report: {exc.errors()[0]['msg']}") from None
    if report.last_seq < report.first_seq:
        raise ValueError(f"malformed loss report: last_seq {report.last_seq} before first_seq {report.first_seq}")
    return report


class Watermarks:
    """Per producer, the highest seq handed to a sink's `emit` and the highest seq it spooled, in a small
    memory-mapped file of the spool directory. A store into a shared mapping is in the kernel's page
    cache as soon as it is made, so it outlives a SIGKILL of the process (not a crash of the
    machine): the next sink over the directory compares the two (`left_behind`). Costs one dict
    lookup and one 8-byte store per event; `emit` may run in many threads (a lost race only
    understates a mark by an event or two). Tracks up to `_MARK_SLOTS` producers per sink."""

    def __init__(self, path: Path) -> None:
        size = _MARK.size * _MARK_SLOTS
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size != size:
                os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.left_behind: list[tuple[str, str, int, int]] = []
        """(producer id, gate, highest seq emitted, highest seq spooled) where the first is ahead."""
        for slot in range(_MARK_SLOTS):
            raw_id, raw_gate, emitted, spooled = _MARK.unpack_from(self._map, slot * _MARK.size)
            if raw_id.strip(b"\0") and emitted > spooled:
                gate = raw_gate.rstrip(b"\0").decode(errors="replace")
                self.left_behind.append((raw_id.rstrip(b"\0").decode(errors="replace"), gate, emitted, spooled))
        self._slots: dict[str, int] = {}
        self._emitted: list[int] = []
        self._spooled: list[int] = []
        self._claim = threading.Lock()
        self._warned = False

    def reset(self) -> None:
        self._map[:] = bytes(len(self._map))

    def _slot(self, event: EventBase) -> int | None:
        with self._claim:
            slot = self._slots.get(event.producer_id)
            if slot is not None:
                return slot
            if len(self._slots) >= _MARK_SLOTS:
                if not self._warned:
                    self._warned = True
                    log.warning(
                        "KafkaSink: more than %d producers; crash losses of the rest go unreported", _MARK_SLOTS
                    )
                return None
            slot = len(self._slots)
            _MARK.pack_into(
                self._map, slot * _MARK.size, event.producer_id.encode()[:32], event.gate.encode()[:32], 0, 0
            )
            self._emitted.append(0)
            self._spooled.append(0)
            self._slots[event.producer_id] = slot
            return slot

    def emitted(self, event: EventBase) -> None:
        slot = self._slots.get(event.producer_id)
        if slot is None and (slot := self._slot(event)) is None:
            return
        seq = event.seq
        if seq > self._emitted[slot]:
            self._emitted[slot] = seq
            _SEQ.pack_into(self._map, slot * _MARK.size + _EMITTED_AT, seq)

    def spooled(self, events: Sequence[EventBase]) -> None:
        highest: dict[int, int] = {}
        for event in events:
            slot = self._slots.get(event.producer_id)
            if slot is not None and event.seq > highest.get(slot, 0):
                highest[slot] = event.seq
        for slot, seq in highest.items():
            if seq > self._spooled[slot]:
                self._spooled[slot] = seq
                _SEQ.pack_into(self._map, slot * _MARK.size + _SPOOLED_AT, seq)


# A slot: producer id and gate (NUL padded), the highest seq emitted, the highest seq spooled.
_MARK = struct.Struct("<32s32sQQ")
_SEQ = struct.Struct("<Q")
_EMITTED_AT = 64
_SPOOLED_AT = 72
_MARK_SLOTS = 128


__all__ = ["LOSS_REPORT_TYPE", "LossReport", "Watermarks", "encode_loss_report", "parse_loss_report"]
