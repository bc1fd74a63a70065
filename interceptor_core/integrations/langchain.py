"""LangChain and LangGraph through the gate: agent middleware, or wrapped tools for any other loop.

```python
agent = create_agent(model, tools=tools, middleware=[CallgateMiddleware(tools, gate=gate, agent="writer")])
tools = gate_tools([write_file, delete_file], gate=gate, agent="writer")  # a ToolNode, invoke, batch...
```

`CallgateMiddleware` is LangChain v1 agent middleware (`wrap_tool_call` / `awrap_tool_call`): every
tool call of the agent passes the chain before LangChain runs the tool. `gate_tools` wraps each
`BaseTool` in a `GatedTool`, which keeps the original's name, description, argument schema (the same
pydantic model), injected arguments (`InjectedToolCallId`, `InjectedState`, `ToolRuntime`) and
`response_format`, and passes every invocation (sync or async, with arguments or a model's
`ToolCall`) through the chain before it calls the original's function (a StructuredTool's own,
else its `_run` / `_arun`), once.

On both routes the events' `call_id` is the model's `tool_call` id; a denial, a tool's exception and
an invalid call are a `ToolMessage` with `status="error"` (the text the model reads); `Block` raises
`ToolBlockedError`; a `Command` or an artifact the tool returns comes back as it would ungated.
The `RunContext` of a call is `config["configurable"]["callgate_run"]` when the invocation passes
one, else (middleware) the agent's `context=` when it is a `RunContext`, else `run`.

`RequireApproval`, when the gate has no `approval_handler`, is LangGraph's own human-in-the-loop
flow on both routes: the call's durable `ApprovalRequested` is recorded (no outcome yet) and the graph
pauses with `langgraph.types.interrupt(payload)`, where the payload is JSON

    {"kind": "callgate.approval", "tool": ..., "args": {...}, "call_id": ..., "reason": ...,
     "requested_by": [...]}

(`args` as the gate holds them, after rewrites). `Command(resume=answer)` resumes it; the answer is
`{"approved": bool, "by": "who", "note": "...", "call_id": "..."}` (`ApprovalResume`: `by`, `note`
optional; `call_id`, if given, the payload's) or, with the middleware, a bare `true` / `false`. On
a ToolNode of `gate_tools` tools the answer must name its call (`call_id`): the calls of one
ToolNode step share LangGraph's interrupt order, so an answer that does not name its call could
reach another. The interrupt's `response_schema` says all this, and LangGraph refuses anything else
with a `ValidationError`, leaving the interrupt open. The resumed call passes the whole chain again
and the answer decides it (`ApprovalRequested`, `ApprovalResolved` with `by` and `note`, then its
one outcome): approved, the tool runs once; refused, the model reads an error `ToolMessage` with
the refusal, who refused and the note, and the tool never runs. Several calls waiting at once are
answered by interrupt id, `Command(resume={interrupt.id: answer, ...})`. Pausing needs a
checkpointer: without one the call raises `ToolApprovalRequiredError` saying so (the tool does not
run). A gate with an `approval_handler` asks it instead, as on every route; outside a graph run (a
tool invoked by hand) `ToolApprovalRequiredError` is raised as before. On a ToolNode route,
LangGraph resumes a node from its start: the other calls of the paused step run again, and calls of
one step that need approval pause one at a time (one task per call, as `create_agent` makes them,
has neither).

Needs `langchain-core` (the `langchain` extra); `CallgateMiddleware` also needs `langchain` (the
`langgraph` extra) and loads it on first use. Importing `interceptor_core` loads neither.
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import functools
import inspect
import sys
from asyncio import events as _loops
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeVar, get_type_hints

import pydantic_core
from langchain_core.callbacks import AsyncCallbackManagerForToolRun, CallbackManagerForToolRun
from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import var_child_runnable_config
from langchain_core.tools import BaseTool, StructuredTool

# LangChain's own test for a RunnableConfig parameter: the original gets its config exactly when
# LangChain would pass it.
from langchain_core.tools.base import _get_runnable_config_param
from pydantic import BaseModel, ConfigDict, PrivateAttr, StrictBool, ValidationError, create_model
from pydantic.v1 import ValidationError as ValidationErrorV1

from interceptor_core.approvals import Approval
from interceptor_core.context import RunContext, ToolContext
from interceptor_core.exceptions import ToolApprovalRequiredError
from interceptor_core.gate import AgentScope, Gate, Workflow
from interceptor_core.integrations._approval_probe import AskedApproval, approval_asked
from interceptor_core.integrations._schema import schema_model, schema_tool
from interceptor_core.results import ToolResult
from interceptor_core.tools import Tool

if TYPE_CHECKING:
    from interceptor_core.integrations._langchain_agents import CallgateMiddleware

__all__ = ["APPROVAL_INTERRUPT", "RUN_CONFIG_KEY", "ApprovalResume", "CallgateMiddleware", "GatedTool", "gate_tools"]

RUN_CONFIG_KEY = "callgate_run"
"""Where an invocation's `config["configurable"]` may carry the `RunContext` of its calls."""

T = TypeVar("T")


def __getattr__(name: str) -> Any:
    # The middleware subclasses langchain's AgentMiddleware, whose import takes about a second
    # (it loads langgraph): only its users pay for it, and langchain-core alone is enough otherwise.
    if name == "CallgateMiddleware":
        from interceptor_core.integrations._langchain_agents import CallgateMiddleware

        return CallgateMiddleware
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- what the gate's tool body runs --------------------------------------------------------------


class PendingCall:
    """One LangChain call in flight: what the gate's tool body runs once the chain allows it.

    The adapter sets it in `_PENDING` (in its own task or thread) around `scope.call`; the body,
    which runs in a copy of that context, claims it once. Not shared between calls.
    """

    __slots__ = ("escaped", "name", "sync", "taken")

    def __init__(self, name: str, *, sync: bool) -> None:
        self.name = name
        self.sync = sync
        self.taken = False
        self.escaped: BaseException | None = None
        """An exception LangChain or LangGraph must see (an interrupt, invalid arguments), re-raised
        once the gate has recorded the call."""

    async def execute(self, args: dict[str, Any]) -> Any:
        """Run the tool with `args` (the chain's, possibly rewritten); return what the chain's
        after-interceptors and the outcome event see."""
        raise NotImplementedError


_PENDING: ContextVar[PendingCall | None] = ContextVar("callgate_langchain_call", default=None)


def must_escape(exc: BaseException) -> bool:
    """True for LangGraph's control-flow exceptions (`interrupt()`, a parent `Command`), which end
    the node rather than the tool: the gate records them as the call's error, then they go on."""
    errors = sys.modules.get("langgraph.errors")  # loaded whenever one can be raised
    bubble = getattr(errors, "GraphBubbleUp", None)
    return bubble is not None and isinstance(exc, bubble)


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
        pending = _PENDING.get()
        if pending is None or pending.taken or pending.name != name:
            # Called through the scope directly (`scope.call`), not by LangChain: the whole tool runs.
            return await original.ainvoke(args)
        pending.taken = True
        try:
            return await pending.execute(args)
        except Exception as exc:
            if must_escape(exc):
                pending.escaped = exc
            raise

    schema = _input_schema(original)
    if isinstance(original.args_schema, dict):
        return schema_tool(name, original.description, schema, body, timeout_s=timeout_s)
    model = schema_model(name, schema)
    model.validate_schema = None

    async def run(args: BaseModel, ctx: ToolContext) -> Any:
        return await body(args.model_dump(), ctx)

    run.__annotations__ = {"args": model, "ctx": ToolContext, "return": Any}
    run.__qualname__ = run.__name__ = f"{name}_via_langchain"
    return Tool(run, name=name, description=original.description, timeout_s=timeout_s)


def _input_schema(tool: BaseTool) -> dict[str, Any]:
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


def _resume_schema(call_id: str | None, *, named: bool) -> Any:
    """What LangGraph accepts as the answer to this call's interrupt (its `response_schema`).

    A `call_id` given must be this call's. `named`: the answer must give it, because the calls of
    one task (a ToolNode step) pausing at once share LangGraph's interrupt order, and an answer
    that does not name its call could reach another one; one task per call (create_agent) is
    answered by its interrupt alone."""
    if call_id is None:
        return StrictBool | ApprovalResume
    own = Literal[call_id]  # type: ignore[valid-type]  # a value known only per call
    bound = create_model(
        "CallgateApprovalResume",
        __base__=ApprovalResume,
        call_id=(own, ...) if named else (own | None, None),
    )
    return bound if named else StrictBool | bound


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
    }


def _approval_of(answer: bool | ApprovalResume) -> Approval:
    if isinstance(answer, bool):
        return Approval(approved=answer, note=_RESUMED if answer else None)
    note = answer.note if answer.note is not None or not answer.approved else _RESUMED
    return Approval(approved=answer.approved, by=answer.by, note=note)


def _ask_graph(name: str, call_id: str | None, asked: AskedApproval, *, named: bool) -> Approval:
    """LangGraph's `interrupt()` for this call: the answer the resumed run brings, or
    `GraphInterrupt` (the run pauses)."""
    from langgraph.types import interrupt

    answer = interrupt(approval_payload(name, call_id, asked), response_schema=_resume_schema(call_id, named=named))
    return _approval_of(answer)


async def call_through_gate(
    scope: AgentScope,
    name: str,
    args: dict[str, Any],
    *,
    run: RunContext,
    call_id: str | None,
    named_answers: bool = False,
) -> ToolResult:
    """`scope.call`, with LangGraph's `interrupt()` as the approval flow when the chain requires
    approval and the gate has no `approval_handler` (on both routes; see `CallgateMiddleware`).

    In a graph task: the call that needs approval records its durable `ApprovalRequested` (no
    outcome) and pauses the run; the resumed run's answer decides it, passing the whole chain again
    (`ApprovalRequested` under the same approval id, `ApprovalResolved`, then its one outcome).
    Without a checkpointer the run cannot resume: `ToolApprovalRequiredError` saying so, the tool
    not run. Outside a graph, or with a handler, this is `scope.call`. `named_answers`: an answer must name the call it
    answers (see `_resume_schema`)."""
    task = _graph_task() if scope.gate.approval_handler is None else None
    if task is None:
        return await scope.call(name, args, run=run, call_id=call_id)
    from langgraph.errors import GraphInterrupt

    pause: GraphInterrupt | None = None
    if task.resume_waiting and (asked := await approval_asked(scope, name, args, run, call_id)) is not None:
        try:
            approval = _ask_graph(name, call_id, asked, named=named_answers)
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
        approval = _ask_graph(name, call_id, asked, named=named_answers)  # raises GraphInterrupt: the run pauses
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


# -- gate_tools ----------------------------------------------------------------------------------------

_CALL_KEY = "__callgate_call__"


class _Body(NamedTuple):
    """How to run one side (sync or async) of an original tool, worked out once when it is wrapped."""

    fn: Callable[..., Any]
    """The StructuredTool's own function or coroutine, else the tool's `_run` / `_arun`."""
    manager_as: str | None
    """The keyword that takes LangChain's callbacks: "callbacks" (a function that takes them, with
    the child manager) or "run_manager" (a `_run` that takes the manager itself), or None."""
    config_as: str | None
    """The keyword of the function's `RunnableConfig` parameter, if it has one."""

    @classmethod
    def of(cls, original: BaseTool, *, sync: bool) -> _Body:
        fn = getattr(original, "func" if sync else "coroutine", None)
        if isinstance(original, StructuredTool) and fn is not None:
            # What StructuredTool._run / _arun do per call, decided here once.
            takes_callbacks = "callbacks" in inspect.signature(fn).parameters
            return cls(fn, "callbacks" if takes_callbacks else None, _get_runnable_config_param(fn))
        # What BaseTool.run / arun inspect: _arun if the tool has its own, else the _run it falls back to.
        method = original._run if sync or type(original)._arun is BaseTool._arun else original._arun
        takes_manager = "run_manager" in inspect.signature(method).parameters
        return cls(
            original._run if sync else original._arun,
            "run_manager" if takes_manager else None,
            _get_runnable_config_param(method),
        )

    def keywords(self, run_manager: Any, config: RunnableConfig) -> dict[str, Any]:
        """The keywords the function takes besides the tool's arguments."""
        keywords: dict[str, Any] = {}
        if self.manager_as == "callbacks" and run_manager is not None:
            keywords["callbacks"] = run_manager.get_child()
        elif self.manager_as == "run_manager" and run_manager is not None:
            keywords["run_manager"] = run_manager
        if self.config_as is not None:
            keywords[self.config_as] = config
        return keywords


class _ToolCall(PendingCall):
    """A `GatedTool` invocation: the original's parsed arguments, and how to run it with them."""

    __slots__ = (
        "artifact",
        "gate_args",
        "injected",
        "invalid",
        "keywords",
        "original",
        "parsed",
        "tool_call_id",
        "wrapping",
    )

    def __init__(self, wrapping: _Wrapping, raw: str | dict[str, Any], tool_call_id: str | None) -> None:
        original, visible = wrapping.original, wrapping.visible
        super().__init__(original.name, sync=True)
        self.wrapping = wrapping
        self.original = original
        self.tool_call_id = tool_call_id
        self.artifact: Any = None
        self.keywords: dict[str, Any] = {}
        """Callbacks and config for the function, set by the sync or async hook that makes the call."""
        if isinstance(raw, str):
            # A single-argument tool invoked with its input as a plain string.
            self.gate_args: dict[str, Any] = {visible[0]: raw} if visible else {}
            self.injected: dict[str, Any] = {}
        else:
            # Before parsing, which adds the injected tool call id to `raw`.
            self.gate_args = {k: v for k, v in raw.items() if k in visible}
            self.injected = {k: v for k, v in raw.items() if k not in visible}
        self.invalid: Exception | None = None
        try:
            self.parsed = original._to_args_and_kwargs(raw, tool_call_id)
        except (ValidationError, ValidationErrorV1) as exc:
            # Invalid arguments still pass the chain (it may deny, or rewrite them into valid
            # ones) and leave an outcome; then LangChain handles the error as it would ungated.
            self.parsed, self.invalid = ((), {}), exc

    async def execute(self, args: dict[str, Any]) -> Any:
        original = self.original
        body = self.wrapping.sync_body if self.sync else self.wrapping.async_body
        if args == self.gate_args:
            if self.invalid is not None:
                self.escaped = self.invalid
                raise self.invalid
            pos, kwargs = self.parsed
        else:  # rewritten by the chain: LangChain validates the new arguments as it did the old
            pos, kwargs = original._to_args_and_kwargs({**self.injected, **args}, self.tool_call_id)
        kwargs = {**kwargs, **self.keywords}
        if self.sync:
            response = outside_loop(body.fn, *pos, **kwargs)
        else:
            response = await body.fn(*pos, **kwargs)
        if original.response_format != "content_and_artifact":
            return response
        if not isinstance(response, tuple) or len(response) != 2:
            raise ValueError(
                "Since response_format='content_and_artifact' a two-tuple of the message content and raw "
                f"tool output is expected. Instead, generated response is of type: {type(response)}."
            )
        content, self.artifact = response
        return content


class _Wrapping(NamedTuple):
    """What a `GatedTool` holds besides the original's fields, in one private attribute: pydantic
    serves private attributes through `__getattr__`, so a call reads it once, not each of these."""

    original: BaseTool
    scope: AgentScope
    default_run: RunContext
    visible: tuple[str, ...]
    """The arguments the model gives (the tool call schema's properties), in order."""
    sync_body: _Body
    async_body: _Body


class GatedTool(StructuredTool):
    """A LangChain tool whose every invocation passes the gate before the original runs.

    Built by `gate_tools`. Everything LangChain and LangGraph read of a tool is the original's:
    name, description, `args_schema` (the same class), injected arguments, `response_format`,
    `return_direct`, tags, metadata, callbacks; `scope` is the gate's scope. Invoking it
    (sync, async, batched, from a ToolNode) validates the input as the original would, calls the
    gate with the model's arguments and the `ToolCall`'s id, and runs the original's function
    (with the callbacks and config it takes) only for an allowed call. Safe from several threads
    and tasks at once.
    """

    _wrapping: _Wrapping = PrivateAttr()

    @classmethod
    def wrap(cls, original: BaseTool, scope: AgentScope, default_run: RunContext) -> GatedTool:
        """`original` gated by `scope` (where it must be registered); `default_run` for calls
        whose config carries no `RunContext`."""
        gated = cls(
            name=original.name,
            description=original.description,
            args_schema=original.args_schema if original.args_schema is not None else original.get_input_schema(),
            func=getattr(original, "func", None),
            coroutine=getattr(original, "coroutine", None),
            return_direct=original.return_direct,
            response_format=original.response_format,
            metadata=original.metadata,
            tags=original.tags,
            callbacks=original.callbacks,
            verbose=original.verbose,
            handle_validation_error=original.handle_validation_error,
            handle_tool_error=original.handle_tool_error,
            extras=getattr(original, "extras", None),
        )
        gated._wrapping = _Wrapping(
            original,
            scope,
            default_run,
            tuple(_input_schema(original).get("properties") or ()),
            _Body.of(original, sync=True),
            _Body.of(original, sync=False),
        )
        return gated

    @property
    def scope(self) -> AgentScope:
        """The agent scope the tool is registered in (not in `metadata`, which LangChain's callbacks
        and tracers copy and serialize on every call)."""
        return self._wrapping.scope

    @property
    def original(self) -> BaseTool:
        """The tool this one gates (never hand it to the model: its calls would bypass the gate)."""
        return self._wrapping.original

    @property
    def _injected_args_keys(self) -> frozenset[str]:
        return self._wrapping.original._injected_args_keys

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        if isinstance(self._wrapping.original, StructuredTool):
            # As the original: one without a coroutine runs `invoke` wholly on a worker thread (the
            # chain on a pooled loop there), half the cost of the chain here and a hop for the body.
            return await super().ainvoke(input, config, **kwargs)
        return await BaseTool.ainvoke(self, input, config, **kwargs)

    def _to_args_and_kwargs(self, tool_input: str | dict[str, Any], tool_call_id: str | None) -> Any:
        # BaseTool.run/arun call this with the raw input and the ToolCall's id right before _run /
        # _arun: the original parses (and validates) the input here, as it would ungated.
        return (), {_CALL_KEY: _ToolCall(self._wrapping, tool_input, tool_call_id)}

    def _run(
        self,
        *_: Any,
        config: RunnableConfig,
        run_manager: CallbackManagerForToolRun | None = None,
        **kwargs: Any,
    ) -> Any:
        call: _ToolCall = kwargs[_CALL_KEY]
        wrapping = call.wrapping
        call.keywords = wrapping.sync_body.keywords(run_manager, config)
        run = run_of(config, wrapping.default_run)
        token = _PENDING.set(call)
        try:
            result = run_sync(
                lambda: call_through_gate(
                    wrapping.scope, self.name, call.gate_args, run=run, call_id=call.tool_call_id, named_answers=True
                )
            )
        finally:
            _PENDING.reset(token)
        return self._output(call, result)

    async def _arun(
        self,
        *_: Any,
        config: RunnableConfig,
        run_manager: AsyncCallbackManagerForToolRun | None = None,
        **kwargs: Any,
    ) -> Any:
        call: _ToolCall = kwargs[_CALL_KEY]
        call.sync = False
        wrapping = call.wrapping
        call.keywords = wrapping.async_body.keywords(run_manager, config)
        token = _PENDING.set(call)
        try:
            result = await call_through_gate(
                wrapping.scope,
                self.name,
                call.gate_args,
                run=run_of(config, wrapping.default_run),
                call_id=call.tool_call_id,
                named_answers=True,
            )
        finally:
            _PENDING.reset(token)
        return self._output(call, result)

    def _output(self, call: _ToolCall, result: ToolResult) -> Any:
        if call.escaped is not None:
            raise call.escaped
        content: Any
        artifact: Any = None
        match result.kind:
            case "ok":
                content, artifact = result.value, call.artifact
            case "substituted":
                content = result.value
            case "denied" | "error":
                text = result.to_model_text()
                content = (
                    text
                    if call.tool_call_id is None
                    else ToolMessage(text, tool_call_id=call.tool_call_id, name=self.name, status="error")
                )
        return (content, artifact) if self.response_format == "content_and_artifact" else content


def gate_tools(
    tools: Sequence[BaseTool],
    *,
    gate: Gate | Workflow,
    agent: str = "langchain",
    run: RunContext | None = None,
    interceptors: Sequence[object] = (),
    timeout_s: float | None = None,
) -> list[GatedTool]:
    """Wrap `tools` so their invocation passes the gate; registers them in `gate.agent(agent)`
    (one `ToolsRegistered` event) before returning. Raises `ConfigurationError` for a tool name
    or schema the gate cannot take. Hand only the returned tools to the model and the ToolNode."""
    scope = gate.agent(agent, tools=[gate_tool(t, timeout_s) for t in tools], interceptors=interceptors)
    default_run = run if run is not None else RunContext()
    return [GatedTool.wrap(t, scope, default_run) for t in tools]


# LangChain reads `_run`'s and `_arun`'s signature and type hints on every invocation; resolved once
# here, it need not evaluate their annotations (strings, in this module) each time.
for _hook in (GatedTool._run, GatedTool._arun):
    _hook.__annotations__ = get_type_hints(_hook)
