"""Running the tool: its own task and context, worker threads, timeouts, errors as results."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import Any

import anyio
import pytest

from events import MemorySink
from interceptor_core import (
    Block,
    CallgateError,
    ConfigurationError,
    Gate,
    LimitExceededError,
    RunContext,
    ToolApprovalRequiredError,
    ToolBlockedError,
    ToolCall,
    ToolContext,
    UnmediatedAccessError,
    tool,
)
from interceptor_core.audit import digest

marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="caller")


class TestTheToolBody:
    async def test_exception_is_an_error_result_with_type_and_text(self) -> None:
        """A tool that raises comes back as kind="error" carrying the exception's type and text."""

        @tool
        async def explode() -> str:
            raise PermissionError("disk is read-only")

        result = await Gate("g").invoke(explode, {})
        assert (result.kind, result.message) == ("error", "PermissionError: disk is read-only")
        assert result.to_model_text() == "Tool error: PermissionError: disk is read-only"

    async def test_timeout_is_an_error_result(self) -> None:
        """A tool that runs past timeout_s is cancelled and reported as a timeout."""
        never = asyncio.Event()
        cancelled = asyncio.Event()

        @tool(timeout_s=0.05)
        async def hang() -> str:
            try:
                await never.wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return "never"

        result = await Gate("g").invoke(hang, {})
        assert (result.kind, result.message) == ("error", "timed out after 0.05 s")
        assert cancelled.is_set()

    async def test_a_tools_own_timeout_error_is_not_the_gates(self) -> None:
        """A TimeoutError raised by the body itself is reported as such, not as the gate's timeout."""

        @tool
        async def upstream() -> str:
            raise TimeoutError("upstream API timed out")

        result = await Gate("g").invoke(upstream, {})
        assert result.message == "TimeoutError: upstream API timed out"

    async def test_sync_tool_runs_in_a_worker_thread(self) -> None:
        """A sync body runs off the event loop's thread."""

        @tool
        def where() -> int:
            return threading.get_ident()

        result = await Gate("g").invoke(where, {})
        assert result.value != threading.get_ident()

    async def test_sync_tool_timeout(self) -> None:
        """A sync body past its timeout is reported as a timeout (its thread finishes on its own)."""
        release = threading.Event()

        @tool(timeout_s=0.05)
        def stuck() -> str:
            release.wait(5)
            return "late"

        try:
            result = await Gate("g").invoke(stuck, {})
        finally:
            release.set()
        assert result.message == "timed out after 0.05 s"

    async def test_a_suspending_body_stays_in_one_task(self) -> None:
        """A body runs in one task (the caller's) from its first step to its last, so what it enters
        before an await it leaves in the same task."""

        @tool
        async def which_task() -> list[int]:
            first = id(asyncio.current_task())
            await asyncio.sleep(0)
            return [first, id(asyncio.current_task())]

        result = await Gate("g").invoke(which_task, {})
        assert result.value == [id(asyncio.current_task())] * 2

    async def test_context_changes_stay_in_the_tool(self) -> None:
        """A body's context-variable changes never leak into the caller, whether it suspends or not."""

        @tool
        async def meddle(suspend: bool) -> str:
            marker.set("tool")
            if suspend:
                await asyncio.sleep(0)
            return marker.get()

        gate = Gate("g")
        for suspend in (False, True):
            result = await gate.invoke(meddle, {"suspend": suspend})
            assert result.value == "tool"
            assert marker.get() == "caller"

    async def test_caller_cancellation_cancels_the_tool(self) -> None:
        """Cancelling the caller cancels the tool's task too."""
        started, never, cancelled = asyncio.Event(), asyncio.Event(), asyncio.Event()

        @tool
        async def slow() -> str:
            started.set()
            try:
                await never.wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return ""

        call = asyncio.create_task(Gate("g").invoke(slow, {}))
        await started.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.wait_for(cancelled.wait(), 5)


class TestToolContext:
    async def test_context_carries_run_call_id_scope_and_cost(self) -> None:
        """ToolContext has the run, the stable call id, the scope path; reported cost reaches the result."""
        seen: list[ToolContext] = []

        @tool
        async def charge(ctx: ToolContext, cents: int) -> str:
            seen.append(ctx)
            ctx.report_cost(0.25)
            ctx.report_cost(0.5)
            return "ok"

        run = RunContext(tenant="acme", principal="u-1", thread_id="t-1", metadata={"ticket": 7})
        agent = Gate("shop").workflow("support").agent("desk", tools=[charge])
        result = await agent.call("charge", {"cents": 1}, run=run, call_id="idem-1")
        (ctx,) = seen
        assert ctx.run is run
        assert ctx.call_id == "idem-1" == result.call_id
        assert str(ctx.scope) == "shop/support/desk/charge"
        assert ctx.tool_name == "charge"
        assert result.cost_usd == pytest.approx(0.75)

    def test_negative_cost_is_refused(self) -> None:
        """report_cost takes only non-negative amounts."""
        ctx = ToolContext(RunContext(), "c", None)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="non-negative"):
            ctx.report_cost(-1)

    async def test_call_ids_are_unique(self) -> None:
        """Without an explicit call id every call gets its own."""

        @tool
        def noop() -> None:
            return None

        gate = Gate("g")
        ids = {(await gate.invoke(noop, {})).call_id for _ in range(50)}
        assert len(ids) == 50


class TestErrors:
    def test_all_errors_derive_from_callgate_error(self) -> None:
        """One root for every error callgate raises."""
        for cls in (
            ConfigurationError,
            ToolBlockedError,
            ToolApprovalRequiredError,
            LimitExceededError,
            UnmediatedAccessError,
        ):
            assert issubclass(cls, CallgateError)

    def test_errors_say_where(self) -> None:
        """str() of an error names tool, call id and interceptor when known."""
        error = ToolBlockedError("bad", tool="t", call_id="c", interceptor="i")
        assert str(error) == "Run blocked: bad [tool=t, call_id=c, interceptor=i]"


class TestToolTask:
    """An async tool body runs in one task from its first step to its last."""

    async def test_a_cancel_scope_entered_before_the_first_await(self) -> None:
        """anyio's cancel scope (as httpx and MCP clients open) entered at once and left after an
        await stays in one task, and the tool's result comes back."""

        @tool
        async def scoped() -> str:
            """Opens a cancel scope first."""
            with anyio.CancelScope():
                await asyncio.sleep(0)
            return "done"

        result = await Gate("g").invoke(scoped, {})
        assert (result.kind, result.value) == ("ok", "done")

    async def test_a_timeout_entered_first_cancels_the_tool_not_the_caller(self) -> None:
        """asyncio.timeout entered before the first await cuts the tool's own wait."""

        @tool
        async def slow() -> str:
            """Waits past its own deadline."""
            async with asyncio.timeout(0.01):
                await asyncio.Event().wait()
            return "never"

        result = await Gate("g").invoke(slow, {})
        assert result.kind == "error"
        assert "TimeoutError" in (result.message or "")


class TestCancelledCallers:
    """What the record says when the caller is cancelled while the body runs."""

    async def test_a_started_sync_body_is_waited_for_and_its_real_outcome_recorded(self) -> None:
        """The caller's cancellation waits for the thread (it cannot be stopped); the event says
        what the body did (ok, its output digest, its duration) and that the caller was cancelled."""
        sink = MemorySink()
        started, release = threading.Event(), threading.Event()
        effects: list[str] = []

        @tool
        def pay() -> str:
            started.set()
            assert release.wait(10)
            effects.append("paid")
            return "paid 10.00"

        gate = Gate("g", sinks=[sink])
        call = asyncio.create_task(gate.invoke(pay, {}))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        call.cancel()
        await asyncio.sleep(0)  # sleep-ok: one loop turn, so the cancellation reaches the call first
        assert not call.done()  # still waiting for the body
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert effects == ["paid"]
        (event,) = sink.of_type("ToolUse")
        assert (event.outcome, event.cancelled, event.error) == ("ok", True, None)  # type: ignore[attr-defined]
        assert event.output_digest == digest("paid 10.00")  # type: ignore[attr-defined]
        assert event.duration_ms > 0  # type: ignore[attr-defined]

    async def test_a_sync_body_that_fails_after_the_cancel_records_its_error(self) -> None:
        sink = MemorySink()
        started, release = threading.Event(), threading.Event()

        @tool
        def pay() -> str:
            started.set()
            assert release.wait(10)
            raise RuntimeError("card declined")

        gate = Gate("g", sinks=[sink])
        call = asyncio.create_task(gate.invoke(pay, {}))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
        call.cancel()
        await asyncio.sleep(0)  # sleep-ok: one loop turn, so the cancellation reaches the call first
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await call
        (event,) = sink.of_type("ToolUse")
        assert (event.outcome, event.cancelled) == ("error", True)  # type: ignore[attr-defined]
        assert event.error == "RuntimeError: card declined"  # type: ignore[attr-defined]

    async def test_a_queued_sync_body_never_runs_once_its_caller_is_gone(self) -> None:
        """With every worker busy, a cancelled call's body is dropped before it starts."""
        sink = MemorySink()
        ran: list[str] = []
        hold = threading.Event()
        loop = asyncio.get_running_loop()
        from concurrent.futures import ThreadPoolExecutor

        executor = ThreadPoolExecutor(max_workers=1)
        loop.set_default_executor(executor)
        try:
            blocker = loop.run_in_executor(None, hold.wait, 10)

            @tool
            def pay() -> str:
                ran.append("paid")
                return "paid"

            gate = Gate("g", sinks=[sink])
            call = asyncio.create_task(gate.invoke(pay, {}))
            deadline = loop.time() + 10
            while not any(e.type == "ToolsRegistered" for e in sink.events) and loop.time() < deadline:
                await asyncio.sleep(0.001)  # sleep-ok: polling with a deadline until the call reached the gate
            for _ in range(5):
                await asyncio.sleep(0)  # sleep-ok: a few loop turns, so the body is queued behind the blocker
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            hold.set()
            await blocker
            await loop.run_in_executor(None, lambda: None)  # the queue has drained
            assert ran == []
            (event,) = sink.of_type("ToolUse")
            assert (event.outcome, event.cancelled) == ("cancelled", True)  # type: ignore[attr-defined]
        finally:
            hold.set()
            executor.shutdown(wait=True)

    async def test_a_block_in_a_parallel_turn_records_the_siblings_real_outcome(self) -> None:
        """As an adapter does with a parallel turn: the calls run in a task group, one is blocked,
        the group cancels its sibling mid-body; the sibling's sync body finishes and says so."""
        sink = MemorySink()
        started, release = threading.Event(), threading.Event()

        @tool
        def export_report() -> str:
            started.set()
            assert release.wait(10)
            return "exported"

        @tool
        async def drop_table() -> str:
            await asyncio.get_running_loop().run_in_executor(None, started.wait, 10)
            return "dropped"

        class NoDrops:
            name = "no-drops"

            def before_tool_call(self, call: ToolCall) -> Block | None:
                return Block("destructive SQL") if call.tool_name == "drop_table" else None

        gate = Gate("g", interceptors=[NoDrops()], sinks=[sink])
        desk = gate.agent("desk", tools=[export_report, drop_table])
        run = RunContext(tenant="acme")

        loop = asyncio.get_running_loop()
        exporting: list[asyncio.Task[Any]] = []

        async def release_once_cancelled() -> None:
            # The export's body goes on only after the group has cancelled its caller.
            deadline = loop.time() + 10
            while not (exporting and exporting[0].cancelling()) and loop.time() < deadline:
                await asyncio.sleep(0.001)  # sleep-ok: polling with a deadline for the group's cancel
            release.set()

        async def drop_after_export_started() -> None:
            await loop.run_in_executor(None, started.wait, 10)
            await desk.call("drop_table", {}, run=run)

        async def parallel_turn() -> None:
            async with asyncio.TaskGroup() as group:
                exporting.append(group.create_task(desk.call("export_report", {}, run=run)))
                group.create_task(drop_after_export_started())

        releaser = asyncio.create_task(release_once_cancelled())
        with pytest.raises(ExceptionGroup) as caught:
            await parallel_turn()
        await releaser
        assert caught.group_contains(ToolBlockedError)
        by_tool = {e.tool: e for e in sink.events if e.type in ("ToolUse", "Blocked")}
        assert by_tool["drop_table"].type == "Blocked"
        export = by_tool["export_report"]
        assert (export.type, export.outcome, export.cancelled) == ("ToolUse", "ok", True)  # type: ignore[attr-defined]

    async def test_an_async_body_cut_short_says_it_had_started(self) -> None:
        sink = MemorySink()
        started = asyncio.Event()

        @tool
        async def slow() -> str:
            started.set()
            await asyncio.Event().wait()
            return ""

        call = asyncio.create_task(Gate("g", sinks=[sink]).invoke(slow, {}))
        await started.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        (event,) = sink.of_type("ToolUse")
        assert (event.outcome, event.cancelled, event.error) == ("cancelled", True, "cancelled")  # type: ignore[attr-defined]
        assert event.duration_ms > 0  # type: ignore[attr-defined]


class TestInlineTools:
    async def test_an_inline_sync_tool_runs_on_the_loop_thread(self) -> None:
        """inline=True: no worker thread, same result, same record."""
        sink = MemorySink()
        threads: list[int] = []

        @tool(inline=True)
        def add(a: int, b: int) -> int:
            threads.append(threading.get_ident())
            return a + b

        @tool
        def add_threaded(a: int, b: int) -> int:
            threads.append(threading.get_ident())
            return a + b

        gate = Gate("g", sinks=[sink])
        assert (await gate.invoke(add, {"a": 2, "b": 3})).value == 5
        assert (await gate.invoke(add_threaded, {"a": 2, "b": 3})).value == 5
        assert threads[0] == threading.get_ident() != threads[1]
        assert [e.outcome for e in sink.of_type("ToolUse")] == ["ok", "ok"]  # type: ignore[attr-defined]

    async def test_an_inline_tool_that_raises_is_an_error_result(self) -> None:
        @tool(inline=True)
        def broken() -> str:
            raise ValueError("no")

        result = await Gate("g").invoke(broken, {})
        assert (result.kind, result.message) == ("error", "ValueError: no")

    def test_inline_is_for_sync_tools(self) -> None:
        async def body() -> str:
            return ""

        with pytest.raises(ConfigurationError, match="inline=True is for sync tools"):
            tool(inline=True)(body)
