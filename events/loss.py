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
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field, ValidationError

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


__all__ = ["LOSS_REPORT_TYPE", "LossReport", "encode_loss_report", "parse_loss_report"]
