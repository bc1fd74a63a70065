"""What LangChain's two routes share: the call in flight the gate's tool body runs, the run of a
call, LangGraph's interrupt for approvals, and running a coroutine from sync code.

Private: `interceptor_core.integrations.langchain` (the wrapped tools) and `_langchain_agents` (the
middleware) build on it; it imports neither.
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import functools
import sys
from asyncio import events as _loops
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any, Literal, NamedTuple, TypeVar

import pydantic_core
from langchain_core.runnables.config import var_child_runnable_config
from langchain_core.tools import BaseTool

# LangChain's own test for a RunnableConfig parameter: the original gets its config exactly when
# LangChain would pass it.
from pydantic import BaseModel, ConfigDict, StrictBool, create_model

from interceptor_core.approvals import Approval, ApprovalHandler
from interceptor_core.context import RunContext, ToolContext
from interceptor_core.exceptions import ToolApprovalRequiredError
from interceptor_core.gate import AgentScope
from interceptor_core.integrations._approval_probe import AskedApproval, approval_asked
from interceptor_core.integrations._schema import schema_model, schema_tool
from interceptor_core.results import ToolResult
from interceptor_core.tools import Tool

RUN_CONFIG_KEY = "callgate_run"
"""Where an invocation's `config["configurable"]` may carry the `RunContext` of its calls."""

T = TypeVar("T")


# -- what the gate's tool body runs --------------------------------------------------------------


class PendingCall:
    """One LangChain call in flight: what the gate's tool body runs once the chain allows it.

    The adapter sets it in `PENDING` (in its own task or thread) around `scope.call`; the body,
    which runs in a copy of that context, claims it once. Not shared between calls.
    """

    __slots__ = ("escaped", "name", "sync", "taken")

    def __init__(self, name: str, *, sync: bool) -> None:
        self.name = name
        self.sync = sync
        self.taken = False
        self.escaped: BaseException | None = None
        """An exception LangChain or LangGraph must see (the tool's own, an interrupt, invalid
        arguments), re-raised once the gate has recorded the call."""

    async def execute(self, args: dict[str, Any]) -> Any:
        """Run the tool with `args` (the chain's, possibly rewritten); return what the chain's
        after-interceptors and the outcome event see."""
        raise NotImplementedError


PENDING: ContextVar[PendingCall | None] = ContextVar("callgate_langchain_call", default=None)


class AnsweredFailure(Exception):  # a signal to the gate, not an error of the caller's
    """The tool failed and LangChain has already answered the failure (an error `ToolMessage`, as
    the tool's `handle_tool_error` or the ToolNode made it): the gate records the call's error
    outcome, and the adapter returns LangChain's answer instead of raising this."""


RETRY_TAG = "retry:attempt:"
"""How LangChain's `with_retry` tags the callbacks of each attempt after the first."""


def attempt_call_id(tool_call_id: str | None, tags: Sequence[str] | None) -> str | None:
    """The events' call id of one attempt of a tool call: the model's id, with `#N` for the Nth
    attempt of a `with_retry` (each attempt is its own call, with its own outcome and approval).
    None when the invocation carries no id (the gate makes a new one per call)."""
    if tool_call_id is None or not tags:
        return tool_call_id
    for tag in tags:
        if tag.startswith(RETRY_TAG):
            return f"{tool_call_id}#{tag[len(RETRY_TAG) :]}"
    return tool_call_id


def outside_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call a sync tool body as LangChain would, with no event loop running in the thread.

    The sync route drives the chain on an event loop in the calling thread; the body runs inside
    it, and a body that starts a loop of its own (`asyncio.run`, a nested sync agent) must not find
    ours, as it would not ungated. The loop is paused in this call, so hiding it is safe.
    """
    loop = _loops._get_running_loop()
    _loops._set_running_loop(None)
    try:
        return fn(*args, **kwargs)
    finally:
        _loops._set_running_loop(loop)


def gate_tool(original: BaseTool, timeout_s: float | None) -> Tool[Any, Any]:
    """The gate's tool for `original`: its name, description and model-facing JSON Schema.

    A tool with a pydantic `args_schema` is validated by LangChain itself, as it would be ungated
    (invalid arguments still pass the chain, then LangChain answers them), so the gate only takes
    the arguments as a JSON object; a JSON Schema `args_schema`, which LangChain does not check,
    is checked by the gate.
    """
    name = original.name

    async def body(args: dict[str, Any], _ctx: ToolContext) -> Any:
        pending = PENDING.get()
        if pending is None or pending.taken or pending.name != name:
            # Called through the scope directly (`scope.call`), not by LangChain: the whole tool runs.
            return await original.ainvoke(args)
        pending.taken = True
        try:
            return await pending.execute(args)
        except AnsweredFailure:
            raise
        except Exception as exc:
            # The tool's own exception (or LangGraph's interrupt): the gate records the call's
            # error outcome, then the adapter raises it, so LangChain meets it as it would ungated
            # (the tool's handle_tool_error, the ToolNode's handle_tool_errors, a with_retry).
            pending.escaped = exc
            raise

    schema = input_schema(original)
    if isinstance(original.args_schema, dict):
        return schema_tool(name, original.description, schema, body, timeout_s=timeout_s)
    model = schema_model(name, schema)
    model.validate_schema = None

    async def run(args: BaseModel, ctx: ToolContext) -> Any:
        return await body(args.model_dump(), ctx)

    run.__annotations__ = {"args": model, "ctx": ToolContext, "return": Any}
    run.__qualname__ = run.__name__ = f"{name}_via_langchain"
    return Tool(run, name=name, description=original.description, timeout_s=timeout_s)


def input_schema(tool: BaseTool) -> dict[str, Any]:
    schema = tool.tool_call_schema
    if isinstance(schema, dict):
        return schema
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return schema.model_json_schema()
    return {"type": "object", "properties": {}}


def run_of(config: Mapping[str, Any] | None, default: RunContext, context: object = None) -> RunContext:
    """The call's `RunContext`: from the config's `configurable`, else `context`, else `default`."""
    given = ((config or {}).get("configurable") or {}).get(RUN_CONFIG_KEY)
    if isinstance(given, RunContext):
        return given
    return context if isinstance(context, RunContext) else default


# -- RequireApproval as LangGraph's interrupt() ----------------------------------------------------

APPROVAL_INTERRUPT = "callgate.approval"
"""The `kind` of the payload of an interrupt that asks for a call's approval."""

_RESUMED = "approved through LangGraph's interrupt (Command(resume=...))"


class ApprovalResume(BaseModel):
    """The answer to a call paused for approval, as `Command(resume=...)` gives it: a JSON object
    `{"approved": true | false, "by": "who decided", "note": "...", "call_id": "..."}` (`by`,
    `note` and `call_id` optional, except `call_id` on a ToolNode of `gate_tools` tools; the note
    of a refusal is what the model reads), or a bare `true` / `false` (not on a ToolNode). A
    `call_id` must be the payload's. Anything else is refused by LangGraph (a `ValidationError`;
    the resumed run fails, nothing runs, and the interrupt stays open)."""

    model_config = ConfigDict(extra="forbid", strict=True, title="CallgateApprovalResume")

    approved: bool
    """Whether the call may run."""
    by: str | None = None
    """Who decided (the `ApprovalResolved` event records it)."""
    note: str | None = None
    """Recorded with the decision; on a refusal, also what the model reads after the refusal."""
    call_id: str | None = None
    """The call this answers (the payload's `call_id`)."""


class DeskResume(BaseModel):
    """The answer that defers to the reviewers' desk: `{"approval_id": "..."}`, the id of the call's
    request (the interrupt payload's `approval_id`). Accepted where the integration was given a
    `desk` (a `RemoteApprovals`): the gate then asks it for the decision taken on that request (from
    the console, the command line or the read API), honours it only for this exact call, signed by
    a trusted key when the desk has `trusted_keys`, and claims it (used once) before the tool runs.
    An approval id that is not the call's own is refused by LangGraph, as any other answer."""

    model_config = ConfigDict(extra="forbid", strict=True, title="CallgateDeskResume")

    approval_id: str
    """The call's request (its id names the call: no `call_id` is needed)."""


def _resume_schema(call_id: str | None, *, named: bool, approval_id: str = "") -> Any:
    """What LangGraph accepts as the answer to this call's interrupt (its `response_schema`).

    A `call_id` given must be this call's. `named`: the answer must give it, because the calls of
    one task (a ToolNode step) pausing at once share LangGraph's interrupt order, and an answer
    that does not name its call could reach another one; one task per call (create_agent) is
    answered by its interrupt alone. `approval_id` (with a desk): a `DeskResume` naming it, too."""
    if call_id is None:
        return StrictBool | ApprovalResume
    own = Literal[call_id]  # type: ignore[valid-type]  # a value known only per call
    bound = create_model(
        "CallgateApprovalResume",
        __base__=ApprovalResume,
        call_id=(own, ...) if named else (own | None, None),
    )
    schema: Any = bound if named else StrictBool | bound
    if approval_id:
        request = Literal[approval_id]  # type: ignore[valid-type]
        schema = schema | create_model("CallgateDeskResume", __base__=DeskResume, approval_id=(request, ...))
    return schema


class _GraphTask(NamedTuple):
    """The LangGraph task a call runs in: whether an answer to an interrupt waits for it (it is
    being resumed), and whether the graph has a checkpointer (without one it cannot resume)."""

    resume_waiting: bool
    checkpointer: bool


def _graph_task() -> _GraphTask | None:
    """The running LangGraph task of this call, or None outside a graph (no interrupt possible)."""
    if "langgraph.types" not in sys.modules:  # a graph run has loaded it
        return None
    configurable = (var_child_runnable_config.get() or {}).get("configurable")
    if not configurable:
        return None
    scratchpad_key, checkpointer_key = _graph_keys()
    scratchpad = configurable.get(scratchpad_key)
    if scratchpad is None:
        return None
    waiting = bool(getattr(scratchpad, "resume", None)) or scratchpad.get_null_resume(False) is not None
    return _GraphTask(waiting, configurable.get(checkpointer_key) is not None)


@functools.cache
def _graph_keys() -> tuple[str, str]:
    # LangGraph's task state is private API: read defensively, and only where a graph runs.
    from langgraph._internal._constants import CONFIG_KEY_CHECKPOINTER, CONFIG_KEY_SCRATCHPAD

    return CONFIG_KEY_SCRATCHPAD, CONFIG_KEY_CHECKPOINTER


def approval_payload(name: str, call_id: str | None, asked: AskedApproval) -> dict[str, Any]:
    """The JSON-safe value of the interrupt that asks for a call's approval."""
    return {
        "kind": APPROVAL_INTERRUPT,
        "tool": name,
        "args": pydantic_core.to_jsonable_python(asked.args, fallback=repr),
        "call_id": call_id,
        "reason": asked.reason,
        "requested_by": list(asked.requested_by),
        "approval_id": asked.approval_id or None,
    }


def _approval_of(
    answer: bool | ApprovalResume | DeskResume, desk: ApprovalHandler | None
) -> Approval | ApprovalHandler:
    if isinstance(answer, bool):
        return Approval(approved=answer, note=_RESUMED if answer else None)
    if isinstance(answer, DeskResume):
        assert desk is not None  # the schema accepts a DeskResume only with a desk
        return desk
    note = answer.note if answer.note is not None or not answer.approved else _RESUMED
    return Approval(approved=answer.approved, by=answer.by, note=note)


def _ask_graph(
    name: str, call_id: str | None, asked: AskedApproval, *, named: bool, desk: ApprovalHandler | None
) -> Approval | ApprovalHandler:
    """LangGraph's `interrupt()` for this call: the answer the resumed run brings (the desk, for a
    `DeskResume`), or `GraphInterrupt` (the run pauses)."""
    from langgraph.types import interrupt

    schema = _resume_schema(call_id, named=named, approval_id=asked.approval_id if desk is not None else "")
    answer = interrupt(approval_payload(name, call_id, asked), response_schema=schema)
    return _approval_of(answer, desk)


async def call_through_gate(
    scope: AgentScope,
    name: str,
    args: dict[str, Any],
    *,
    run: RunContext,
    call_id: str | None,
    named_answers: bool = False,
    desk: ApprovalHandler | None = None,
) -> ToolResult:
    """`scope.call`, with LangGraph's `interrupt()` as the approval flow when the chain requires
    approval and the gate has no `approval_handler` (on both routes; see `CallgateMiddleware`).

    In a graph task: the call that needs approval records its durable `ApprovalRequested` (no
    outcome) and pauses the run; the resumed run's answer decides it, passing the whole chain again
    (`ApprovalRequested` under the same approval id, `ApprovalResolved`, then its one outcome; with
    a `DeskResume`, no second request when the desk holds the first, and the desk's own decision).
    Without a checkpointer the run cannot resume: `ToolApprovalRequiredError` saying so, the tool
    not run. Outside a graph, or with a handler, this is `scope.call`. `named_answers`: an answer must name the call it
    answers (see `_resume_schema`). `desk`: what a `DeskResume` answer asks for the decision."""
    task = _graph_task() if scope.gate.approval_handler is None else None
    if task is None:
        return await scope.call(name, args, run=run, call_id=call_id)
    from langgraph.errors import GraphInterrupt

    pause: GraphInterrupt | None = None
    if task.resume_waiting and (asked := await approval_asked(scope, name, args, run, call_id)) is not None:
        try:
            approval = _ask_graph(name, call_id, asked, named=named_answers, desk=desk)
        except GraphInterrupt as exc:  # the answer waiting was another call's: this one pauses
            pause = exc
        else:
            return await scope.call(name, args, run=run, call_id=call_id, approval=approval)
    try:
        # With a checkpointer the run pauses and resumes this call: the request is the record.
        return await scope.call(name, args, run=run, call_id=call_id, pause_for_approval=bool(task.checkpointer))
    except ToolApprovalRequiredError as exc:
        if pause is not None:
            raise pause from None
        if not task.checkpointer:
            raise ToolApprovalRequiredError(
                f"{exc.reason}; LangGraph pauses a run for approval only with a checkpointer "
                "(create_agent(..., checkpointer=...) or graph.compile(checkpointer=...))",
                tool=exc.tool,
                call_id=exc.call_id,
                interceptor=exc.interceptor,
            ) from exc
        # The arguments as the gate holds them (rewrites applied), for the reviewer.
        asked = await approval_asked(scope, name, args, run, call_id) or AskedApproval(
            args, exc.reason, tuple((exc.interceptor or "").split(", "))
        )
        approval = _ask_graph(
            name, call_id, asked, named=named_answers, desk=desk
        )  # raises GraphInterrupt: the run pauses
    # Only when an answer was waiting after all: it decides the call, which passes the chain again.
    return await scope.call(name, args, run=run, call_id=call_id, approval=approval)


# -- sync calls -------------------------------------------------------------------------------------

_idle_loops: list[asyncio.AbstractEventLoop] = []


def run_sync(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run the coroutine `make()` builds to its end from sync code, and return its result.

    Where no loop runs in this thread (LangChain's sync paths: `invoke`, `batch`, a ToolNode's
    threads), on an idle event loop taken from a pool and given back: no loop is built per call.
    Where one runs (a sync `invoke` from async code), on a worker thread, with this thread's
    context, while this thread waits, as any sync call made there does.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _on_idle_loop(make)
    return _offload().submit(contextvars.copy_context().run, _on_idle_loop, make).result()


@functools.cache
def _offload() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(thread_name_prefix="callgate-langchain")


def _on_idle_loop(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    try:
        loop = _idle_loops.pop()  # atomic: several threads share the pool without a lock
    except IndexError:
        loop = asyncio.new_event_loop()
    try:
        task = loop.create_task(make())
        # One turn of the loop runs the task's first step: a call whose chain never waits (sync
        # interceptors, a sync tool) is done then, which spares run_until_complete's second turn.
        loop.call_soon(loop.stop)
        loop.run_forever()
        return task.result() if task.done() else loop.run_until_complete(task)
    finally:
        _idle_loops.append(loop)


@atexit.register
def _close_loops() -> None:
    while _idle_loops:
        _idle_loops.pop().close()
