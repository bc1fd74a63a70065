"""Running the tool: its own task and context, worker threads, timeouts, errors as results."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import anyio
import pytest

from interceptor_core import (
    CallgateError,
    ConfigurationError,
    Gate,
    LimitExceededError,
    RunContext,
    ToolApprovalRequiredError,
    ToolBlockedError,
    ToolContext,
    UnmediatedAccessError,
    tool,
)

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
