"""`Gate(audit="required" | "best_effort")`: what a call does while an audit sink cannot take events,
what `sink_stats()` says about it, and what is logged. Real sinks on real failures: a JsonlSink on
/dev/full (every write fails with ENOSPC), a path whose parent is a file, a path that points at
/dev/full and then at a real file."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider

from events import JsonlSink, MemorySink, read_jsonl, verify_chain
from events.otel import OtelSink
from interceptor_core import ConfigurationError, Gate, RunContext, Tool, ToolBlockedError

from .conftest import Effects

ENOSPC = "write failed: [Errno 28] No space left on device"
FULL = f"audit unavailable: JsonlSink(/dev/full): {ENOSPC}"
ARGS = {"order_id": "A-1", "amount_cents": 100}
RUN = RunContext(tenant="acme", principal="u-1")


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What callgate logged at WARNING and above, one message per record."""
    return [r.getMessage() for r in caplog.records if r.name.startswith("callgate") and r.levelno >= logging.WARNING]


async def refused(agent: Any, n: int) -> list[ToolBlockedError]:
    """Make n calls, each expected to end Blocked; their errors."""
    errors = []
    for i in range(n):
        with pytest.raises(ToolBlockedError) as raised:
            await agent.call("refund", {**ARGS, "order_id": f"A-{i}"}, run=RUN)
        errors.append(raised.value)
    return errors


@pytest.fixture(autouse=True)
def _log_warnings(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="callgate")


class TestRequired:
    async def test_a_full_disk_blocks_new_calls_and_no_tool_body_runs(
        self, refund: Tool[Any, Any], effects: Effects
    ) -> None:
        """Once the JSONL sink's write failed, every new call ends Blocked (cause
        audit_unavailable, decided by "audit") with the sink and the error in the reason."""
        memory = MemorySink()
        gate = Gate("shop", sinks=[JsonlSink("/dev/full"), memory])
        agent = gate.agent("desk", tools=[refund])
        await gate.flush()  # the ToolsRegistered event met the full disk
        errors = await refused(agent, 3)
        assert [e.reason for e in errors] == [FULL] * 3
        assert (errors[0].interceptor, errors[0].tool) == ("audit", "refund")
        assert effects.names() == []
        blocked = memory.of_type("Blocked")
        assert [(e.cause, e.decided_by, e.reason) for e in blocked] == [("audit_unavailable", "audit", FULL)] * 3  # type: ignore[attr-defined]
        await gate.close()

    async def test_sink_stats_count_what_was_never_stored(self, refund: Tool[Any, Any]) -> None:
        """While the disk is full the events are held (pending) and the sink says why; after
        close every one of them is counted failed, exactly."""
        gate = Gate("shop", sinks=[JsonlSink("/dev/full")])
        agent = gate.agent("desk", tools=[refund])
        await gate.flush()
        await refused(agent, 4)
        await gate.flush()
        (stats,) = gate.sink_stats().values()
        assert (stats.emitted, stats.pending, stats.failed, stats.exported, stats.dropped) == (5, 5, 0, 0, 0)
        assert (stats.available, stats.error, stats.role) == (False, f"JsonlSink(/dev/full): {ENOSPC}", "audit")
        await gate.close()
        (stats,) = gate.sink_stats().values()
        assert (stats.emitted, stats.pending, stats.failed, stats.exported) == (5, 0, 5, 0)

    async def test_recovery_lets_calls_run_and_keeps_every_event(
        self, tmp_path: Path, refund: Tool[Any, Any], effects: Effects, caplog: pytest.LogCaptureFixture
    ) -> None:
        """The events path points at /dev/full, then at a real file: refused calls' events are
        held, the next attempt writes them all, calls run again; the file holds the gate's whole
        chain without a gap; the log has one line when the writes fail and one at recovery."""
        path = tmp_path / "events.jsonl"
        path.symlink_to("/dev/full")
        gate = Gate("shop", sinks=[JsonlSink(path)])
        agent = gate.agent("desk", tools=[refund])
        await gate.flush()
        await refused(agent, 5)
        (tmp_path / "repointed").symlink_to(tmp_path / "real.jsonl")
        os.replace(tmp_path / "repointed", path)  # space is back
        await gate.flush()  # the next attempt: held events written
        result = await agent.call("refund", ARGS, run=RUN)
        assert result.ok
        assert effects.names() == ["refund"]
        await gate.close()
        stored = read_jsonl(tmp_path / "real.jsonl")
        assert [e.type for e in stored] == ["ToolsRegistered", *["Blocked"] * 5, "ToolUse"]
        assert verify_chain(stored).ok
        logged = lines(caplog)
        assert len(logged) == 2, logged
        assert logged[0] == f"JsonlSink({path}): {ENOSPC}; holding 1 events and trying again"
        assert logged[1].startswith(f"JsonlSink({path}) recovered after ")
        (stats,) = gate.sink_stats().values()
        assert (stats.failed, stats.exported, stats.available) == (0, 7, False)  # closed now

    async def test_one_log_line_per_state_change_not_per_batch(
        self, refund: Tool[Any, Any], caplog: pytest.LogCaptureFixture
    ) -> None:
        """Many refused calls, many failed attempts: one line when the writes fail, one at close."""
        gate = Gate("shop", sinks=[JsonlSink("/dev/full", max_batch=1)])
        agent = gate.agent("desk", tools=[refund])
        await gate.flush()
        for _ in range(10):
            await refused(agent, 5)
            await gate.flush()
        await gate.close()
        assert lines(caplog) == [
            f"JsonlSink(/dev/full): {ENOSPC}; holding 1 events and trying again",
            f"JsonlSink(/dev/full) closed with 51 events it could not store ({ENOSPC})",
        ]

    async def test_a_sink_whose_emit_raised_blocks_until_an_emit_works(
        self, refund: Tool[Any, Any], effects: Effects, caplog: pytest.LogCaptureFixture
    ) -> None:
        """An emit that raises makes its sink unavailable; the next refused call's Blocked event
        is the probe: once an emit works again, calls run. Logged once each way."""

        class Unplugged:
            """An audit sink whose emit raises while it is unplugged."""

            def __init__(self) -> None:
                self.unplugged = True

            def emit(self, event: Any) -> None:
                if self.unplugged:
                    raise ConnectionError("collector unplugged")

        sink = Unplugged()
        gate = Gate("shop", sinks=[sink])
        agent = gate.agent("desk", tools=[refund])
        (error,) = await refused(agent, 1)
        assert error.reason == "audit unavailable: Unplugged: emit raised ConnectionError: collector unplugged"
        sink.unplugged = False
        await refused(agent, 1)  # its Blocked event reaches the sink again
        assert (await agent.call("refund", ARGS, run=RUN)).ok
        assert effects.names() == ["refund"]
        (stats,) = gate.sink_stats().values()
        assert (stats.emitted, stats.failed, stats.available) == (2, 2, True)
        logged = lines(caplog)
        assert len(logged) == 2, logged
        assert logged[0] == (
            "Unplugged: emit raised ConnectionError: collector unplugged"
            " (new calls are refused until it takes one again)"
        )
        assert logged[1].startswith("Unplugged takes events again after ")
        assert logged[1].endswith(" s; 2 events failed meanwhile")

    async def test_a_sink_whose_available_raises_blocks(self, refund: Tool[Any, Any], effects: Effects) -> None:
        """An audit sink that cannot even say whether it can store counts as one that cannot."""

        class Confused:
            @property
            def available(self) -> bool:
                raise RuntimeError("state unknown")

            def emit(self, event: Any) -> None: ...

        gate = Gate("shop", sinks=[Confused()])
        agent = gate.agent("desk", tools=[refund])
        (error,) = await refused(agent, 1)
        assert error.reason == "audit unavailable: Confused: available raised RuntimeError: state unknown"
        assert effects.names() == []
        (stats,) = gate.sink_stats().values()
        assert (stats.available, stats.error) == (False, "Confused: available raised RuntimeError: state unknown")


class TestBestEffort:
    async def test_calls_run_and_the_counters_say_what_was_lost(
        self, refund: Tool[Any, Any], effects: Effects, caplog: pytest.LogCaptureFixture
    ) -> None:
        """With audit="best_effort" a full disk stops nothing: the calls run, the sink holds and
        then counts their events as failed, and warns once."""
        gate = Gate("shop", sinks=[JsonlSink("/dev/full")], audit="best_effort")
        agent = gate.agent("desk", tools=[refund])
        await gate.flush()
        for i in range(6):
            assert (await agent.call("refund", {**ARGS, "order_id": f"A-{i}"}, run=RUN)).ok
        assert len(effects.names()) == 6
        await gate.flush()
        (stats,) = gate.sink_stats().values()
        assert (stats.pending, stats.available, stats.error) == (7, False, f"JsonlSink(/dev/full): {ENOSPC}")
        await gate.close()
        assert gate.sink_stats()["0:JsonlSink"].failed == 7
        assert lines(caplog) == [
            f"JsonlSink(/dev/full): {ENOSPC}; holding 1 events and trying again",
            f"JsonlSink(/dev/full) closed with 7 events it could not store ({ENOSPC})",
        ]

    async def test_a_raising_sink_is_counted_and_logged_once(
        self, refund: Tool[Any, Any], caplog: pytest.LogCaptureFixture
    ) -> None:
        """An emit that keeps raising costs a count per event and one log line, not a call."""

        class Broken:
            def emit(self, event: Any) -> None:
                raise OSError("disk gone")

        gate = Gate("shop", sinks=[Broken()], audit="best_effort")
        agent = gate.agent("desk", tools=[refund])
        for _ in range(5):
            assert (await agent.call("refund", ARGS, run=RUN)).ok
        assert gate.sink_stats()["0:Broken"].failed == 6
        assert lines(caplog) == ["Broken: emit raised OSError: disk gone (counted; calls go on)"]


class _Exploding(SpanProcessor):
    """A span processor that fails on every span it is given."""

    def on_start(self, span: Span, parent_context: Any = None) -> None:
        raise RuntimeError("processor on fire")

    def on_end(self, span: ReadableSpan) -> None:
        raise RuntimeError("processor on fire")


class TestObservability:
    async def test_a_failing_otel_sink_never_blocks(self, refund: Tool[Any, Any], effects: Effects) -> None:
        """OpenTelemetry that fails at every span is counted in its own failures; calls run."""
        provider = TracerProvider(shutdown_on_exit=False)
        provider.add_span_processor(_Exploding())
        memory = MemorySink()
        gate = Gate("shop", sinks=[OtelSink(provider), memory])
        agent = gate.agent("desk", tools=[refund])
        for _ in range(3):
            assert (await agent.call("refund", ARGS, run=RUN)).ok
        assert len(effects.names()) == 3
        stats = gate.sink_stats()["0:OtelSink"]
        assert (stats.role, stats.available) == ("observability", True)
        assert stats.failed >= 3
        assert [e.type for e in memory.events] == ["ToolsRegistered", "ToolUse", "ToolUse", "ToolUse"]
        await gate.close()

    async def test_an_observability_sink_whose_emit_raises_never_blocks(
        self, refund: Tool[Any, Any], effects: Effects
    ) -> None:
        """A sink declaring role "observability" may fail at every event: calls run, it is counted."""

        class Dashboard:
            role = "observability"

            def emit(self, event: Any) -> None:
                raise ConnectionError("dashboard down")

        gate = Gate("shop", sinks=[Dashboard()])
        assert (await gate.agent("desk", tools=[refund]).call("refund", ARGS, run=RUN)).ok
        stats = gate.sink_stats()["0:Dashboard"]
        assert (stats.failed, stats.available, stats.role) == (2, False, "observability")


class TestConfiguration:
    @pytest.mark.parametrize(
        ("where", "why"),
        [
            ("file/events.jsonl", "{tmp}/file is not a directory"),
            ("missing/events.jsonl", "the directory {tmp}/missing does not exist"),
        ],
        ids=["parent-is-a-file", "missing-directory"],
    )
    def test_a_sink_that_cannot_start_fails_when_the_gate_is_built(self, tmp_path: Path, where: str, why: str) -> None:
        """The gate starts its sinks: a JSONL path that cannot be written is a ConfigurationError
        naming the sink, the path and what is wrong."""
        (tmp_path / "file").write_text("not a directory")
        path = tmp_path / where
        with pytest.raises(ConfigurationError) as raised:
            Gate("shop", sinks=[JsonlSink(path)])
        assert str(raised.value) == f"JsonlSink({path}) cannot start: {why.format(tmp=tmp_path)}"

    def test_a_sink_whose_start_raises_something_else_is_named(self) -> None:
        """Any other failure of start() is a ConfigurationError naming the sink and the error."""

        class Remote:
            name = "Remote(audit.example)"

            def emit(self, event: Any) -> None: ...

            def start(self) -> None:
                raise ConnectionRefusedError("nobody listens")

        with pytest.raises(ConfigurationError, match=r"^Remote\(audit.example\) cannot start: ConnectionRefused"):
            Gate("shop", sinks=[Remote()])

    def test_unknown_mode_and_role_are_refused(self) -> None:
        """audit= takes "required" or "best_effort"; a sink's role is "audit" or "observability"."""

        class Odd:
            role = "archive"

            def emit(self, event: Any) -> None: ...

        with pytest.raises(ConfigurationError, match="audit must be 'required' or 'best_effort'"):
            Gate("shop", audit="sometimes")  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="sink Odd has role archive"):
            Gate("shop", sinks=[Odd()])

    async def test_a_sink_without_a_role_is_an_audit_sink(self, refund: Tool[Any, Any]) -> None:
        """A sink that declares no role fails closed: the unknown is audit."""

        class Plain:
            available = False
            unavailable_reason = "Plain: offline"

            def emit(self, event: Any) -> None: ...

        gate = Gate("shop", sinks=[Plain()])
        with pytest.raises(ToolBlockedError, match="audit unavailable: Plain: offline"):
            await gate.agent("desk", tools=[refund]).call("refund", ARGS, run=RUN)
