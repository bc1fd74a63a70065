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

On both routes the events' `call_id` is the model's `tool_call` id (the Nth attempt of a
`with_retry` is its own call, `<id>#N`); a denial and an invalid call are a `ToolMessage` with
`status="error"` (the text the model reads); `Block` raises `ToolBlockedError`; a `Command` or an
artifact the tool returns comes back as it would ungated. A tool's own exception is recorded as the
call's error outcome and then raised, as ungated: the tool's `handle_tool_error`, the ToolNode's
`handle_tool_errors` or a `with_retry` deal with it, and with none of them the run raises.
The `RunContext` of a call is `config["configurable"]["callgate_run"]` when the invocation passes
one, else (middleware) the agent's `context=` when it is a `RunContext`, else `run`.

`RequireApproval`, when the gate has no `approval_handler`, is LangGraph's own human-in-the-loop
flow on both routes: the call's durable `ApprovalRequested` is recorded (no outcome yet) and the graph
pauses with `langgraph.types.interrupt(payload)`, where the payload is JSON

    {"kind": "callgate.approval", "tool": ..., "args": {...}, "call_id": ..., "reason": ...,
     "requested_by": [...], "approval_id": ...}

(`args` as the gate holds them, after rewrites; `approval_id` the recorded request's).
`Command(resume=answer)` resumes it; the answer is
`{"approved": bool, "by": "who", "note": "...", "call_id": "..."}` (`ApprovalResume`: `by`, `note`
optional; `call_id`, if given, the payload's) or, with the middleware, a bare `true` / `false`. On
a ToolNode of `gate_tools` tools the answer must name its call (`call_id`): the calls of one
ToolNode step share LangGraph's interrupt order, so an answer that does not name its call could
reach another. The interrupt's `response_schema` says all this, and LangGraph refuses anything else
with a `ValidationError`, leaving the interrupt open. The resumed call passes the whole chain again
and the answer decides it (`ApprovalRequested`, `ApprovalResolved` with `by` and `note`, then its
one outcome): approved, the tool runs once; refused, the model reads an error `ToolMessage` with
the refusal, who refused and the note, and the tool never runs. Several calls waiting at once are
answered by interrupt id, `Command(resume={interrupt.id: answer, ...})`. Given a `desk` (a
`RemoteApprovals` reaching the reviewers' desk), `Command(resume={"approval_id": ...})` answers
with the reviewer's decision instead (`DeskResume`): fetched, verified and claimed by the desk, and
no second request is recorded when the desk holds the first. Pausing needs a
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

import inspect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, get_type_hints

from langchain_core.callbacks import AsyncCallbackManagerForToolRun, CallbackManagerForToolRun
from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool

# LangChain's own test for a RunnableConfig parameter: the original gets its config exactly when
# LangChain would pass it.
from langchain_core.tools.base import _get_runnable_config_param
from pydantic import PrivateAttr, ValidationError
from pydantic.v1 import ValidationError as ValidationErrorV1

from interceptor_core.approvals import ApprovalHandler
from interceptor_core.context import RunContext
from interceptor_core.gate import AgentScope, Gate, Workflow
from interceptor_core.integrations._langchain_calls import (
    APPROVAL_INTERRUPT,
    PENDING,
    RUN_CONFIG_KEY,
    ApprovalResume,
    DeskResume,
    PendingCall,
    attempt_call_id,
    call_through_gate,
    gate_tool,
    input_schema,
    outside_loop,
    run_of,
    run_sync,
)
from interceptor_core.results import ToolResult

if TYPE_CHECKING:
    from interceptor_core.integrations._langchain_agents import CallgateMiddleware

__all__ = [
    "APPROVAL_INTERRUPT",
    "RUN_CONFIG_KEY",
    "ApprovalResume",
    "CallgateMiddleware",
    "DeskResume",
    "GatedTool",
    "gate_tools",
]

T = TypeVar("T")


def __getattr__(name: str) -> Any:
    # The middleware subclasses langchain's AgentMiddleware, whose import takes about a second
    # (it loads langgraph): only its users pay for it, and langchain-core alone is enough otherwise.
    if name == "CallgateMiddleware":
        from interceptor_core.integrations._langchain_agents import CallgateMiddleware

        return CallgateMiddleware
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    desk: ApprovalHandler | None


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
    def wrap(
        cls, original: BaseTool, scope: AgentScope, default_run: RunContext, desk: ApprovalHandler | None = None
    ) -> GatedTool:
        """`original` gated by `scope` (where it must be registered); `default_run` for calls
        whose config carries no `RunContext`; `desk` for resumes that defer to the reviewers' desk."""
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
            tuple(input_schema(original).get("properties") or ()),
            _Body.of(original, sync=True),
            _Body.of(original, sync=False),
            desk,
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
        call_id = attempt_call_id(call.tool_call_id, run_manager.tags if run_manager is not None else None)
        token = PENDING.set(call)
        try:
            result = run_sync(
                lambda: call_through_gate(
                    wrapping.scope,
                    self.name,
                    call.gate_args,
                    run=run,
                    call_id=call_id,
                    named_answers=True,
                    desk=wrapping.desk,
                )
            )
        finally:
            PENDING.reset(token)
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
        token = PENDING.set(call)
        try:
            result = await call_through_gate(
                wrapping.scope,
                self.name,
                call.gate_args,
                run=run_of(config, wrapping.default_run),
                call_id=attempt_call_id(call.tool_call_id, run_manager.tags if run_manager is not None else None),
                named_answers=True,
                desk=wrapping.desk,
            )
        finally:
            PENDING.reset(token)
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
    desk: ApprovalHandler | None = None,
) -> list[GatedTool]:
    """Wrap `tools` so their invocation passes the gate; registers them in `gate.agent(agent)`
    (one `ToolsRegistered` event) before returning. Raises `ConfigurationError` for a tool name
    or schema the gate cannot take. Hand only the returned tools to the model and the ToolNode.
    `desk`: what a resume that defers to the reviewers' desk asks (module docstring)."""
    scope = gate.agent(agent, tools=[gate_tool(t, timeout_s) for t in tools], interceptors=interceptors)
    default_run = run if run is not None else RunContext()
    return [GatedTool.wrap(t, scope, default_run, desk) for t in tools]


# LangChain reads `_run`'s and `_arun`'s signature and type hints on every invocation; resolved once
# here, it need not evaluate their annotations (strings, in this module) each time.
for _hook in (GatedTool._run, GatedTool._arun):
    _hook.__annotations__ = get_type_hints(_hook)
