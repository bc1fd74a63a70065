"""`tool(...)`: a plain function (sync or async) becomes a `Tool` the gate can mediate."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar, cast, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, TypeAdapter, create_model

from interceptor_core.context import ToolContext
from interceptor_core.exceptions import ConfigurationError

In = TypeVar("In")
Out = TypeVar("Out")

DEFAULT_TIMEOUT_S = 60.0


class Tool(Generic[In, Out]):
    """A function the gate can call, with its input model, output type and limits.

    Built by `tool(...)`; immutable in use. `fn` is the undecorated function, for unit tests.
    Calling a `Tool` object directly is not possible on purpose: calls go through a scope.
    """

    __slots__ = (
        "_args_style",
        "_ctx_param",
        "crossing",
        "description",
        "exclude_interceptors",
        "fn",
        "inline",
        "input_model",
        "interceptors",
        "is_async",
        "max_result_chars",
        "name",
        "output_adapter",
        "output_type",
        "timeout_s",
    )

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        timeout_s: float | None = None,
        interceptors: Sequence[object] = (),
        exclude_interceptors: Sequence[str] = (),
        max_result_chars: int | None = None,
        inline: bool = False,
        localns: Mapping[str, Any] | None = None,
    ) -> None:
        self.fn = fn
        self.crossing: str | None = None
        """Set by an MCP gateway on the tools that stand for a crossing other than a tool call
        (a resource read, a prompt get, a sampling request...); their events carry it."""
        self.name = name or fn.__name__
        if not self.name.replace("_", "").replace("-", "").replace(".", "").isalnum():
            raise ConfigurationError(
                f"tool name {self.name!r} may only hold letters, digits, '_', '-' and '.'", tool=self.name
            )
        self.description = description if description is not None else inspect.cleandoc(fn.__doc__ or "")
        if timeout_s is not None and timeout_s <= 0:
            raise ConfigurationError(f"timeout_s must be positive, got {timeout_s!r}", tool=self.name)
        self.timeout_s = timeout_s if timeout_s is not None else DEFAULT_TIMEOUT_S
        if max_result_chars is not None and max_result_chars < 1:
            raise ConfigurationError(f"max_result_chars must be at least 1, got {max_result_chars!r}", tool=self.name)
        self.max_result_chars = max_result_chars
        self.interceptors = tuple(interceptors)
        self.exclude_interceptors = tuple(exclude_interceptors)
        self.is_async = inspect.iscoroutinefunction(fn)
        if inline and self.is_async:
            raise ConfigurationError(
                "inline=True is for sync tools; an async tool already runs on the loop", tool=self.name
            )
        self.inline = inline
        self._inspect_signature(localns)

    def _inspect_signature(self, localns: Mapping[str, Any] | None) -> None:
        try:
            hints = get_type_hints(self.fn, localns=dict(localns) if localns else None, include_extras=True)
        except Exception as exc:
            raise ConfigurationError(
                f"cannot resolve the type hints of {self.fn.__qualname__}: {exc}", tool=self.name
            ) from exc
        params = list(inspect.signature(self.fn).parameters.values())
        self._ctx_param: str | None = None
        plain: list[inspect.Parameter] = []
        for param in params:
            annotation = hints.get(param.name, inspect.Parameter.empty)
            if annotation is ToolContext:
                self._ctx_param = param.name
                continue
            if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                raise ConfigurationError(
                    f"tool parameters must be named; *{param.name} / **{param.name} cannot be described to a model",
                    tool=self.name,
                )
            plain.append(param)

        first = plain[0] if plain else None
        first_type = hints.get(first.name) if first else None
        if first is not None and isinstance(first_type, type) and issubclass(first_type, BaseModel):
            if len(plain) > 1:
                raise ConfigurationError(
                    f"{self.fn.__qualname__} takes its arguments as the model {first_type.__name__}; "
                    f"move {', '.join(repr(p.name) for p in plain[1:])} into that model",
                    tool=self.name,
                )
            # The function takes its arguments as one model instance.
            self.input_model: type[BaseModel] = first_type
            self._args_style = ("model", first.name)
        else:
            fields: dict[str, Any] = {}
            for param in plain:
                if param.name not in hints:
                    raise ConfigurationError(
                        f"parameter {param.name!r} of {self.fn.__qualname__} has no type annotation; "
                        "a model needs one to call the tool",
                        tool=self.name,
                    )
                default = ... if param.default is inspect.Parameter.empty else param.default
                fields[param.name] = (hints[param.name], default)
            model_name = "".join(part.capitalize() for part in self.name.replace("-", "_").split("_")) + "Args"
            self.input_model = create_model(model_name, __config__=ConfigDict(extra="forbid"), **fields)
            self._args_style = ("kwargs", "")

        self.output_type: Any = hints.get("return", Any)
        if self.output_type is type(None):
            self.output_type = None
        self.output_adapter: TypeAdapter[Any] = TypeAdapter(self.output_type)

    def definition(self) -> dict[str, Any]:
        """What a model is shown: name, description and the input JSON Schema.

        The schema appears under both `parameters` (the OpenAI function format) and `input_schema`
        (the MCP and Anthropic format), so the dict plugs into either without translation.
        """
        schema = self.input_model.model_json_schema()
        return {
            "name": self.name,
            "description": self.description,
            "parameters": schema,
            "input_schema": schema,
        }

    def bind(self, args: BaseModel, ctx: ToolContext) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The positional and keyword arguments to call `fn` with, from validated args."""
        style, param = self._args_style
        kwargs: dict[str, Any]
        if style == "model":
            kwargs = {param: args}
        else:
            kwargs = {name: getattr(args, name) for name in type(args).model_fields}
        if self._ctx_param is not None:
            kwargs[self._ctx_param] = ctx
        return (), kwargs

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"


F = TypeVar("F", bound=Callable[..., Any])


@overload
def tool(fn: Callable[..., Any], /) -> Tool[Any, Any]: ...
@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float | None = None,
    interceptors: Sequence[object] = (),
    exclude_interceptors: Sequence[str] = (),
    max_result_chars: int | None = None,
    inline: bool = False,
) -> Callable[[Callable[..., Any]], Tool[Any, Any]]: ...
def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout_s: float | None = None,
    interceptors: Sequence[object] = (),
    exclude_interceptors: Sequence[str] = (),
    max_result_chars: int | None = None,
    inline: bool = False,
) -> Tool[Any, Any] | Callable[[Callable[..., Any]], Tool[Any, Any]]:
    """Turn a sync or async function into a `Tool`; usable bare (`@tool`) or with options.

    The input model is the pydantic model of the function's only parameter, or one built from its
    plain typed parameters; a parameter annotated `ToolContext` receives the call's context and is
    not part of it. The output type is the return annotation. `description` defaults to the
    docstring. Raises `ConfigurationError` for a signature a model cannot be shown.

    A sync function runs in a worker thread (it may block: I/O, locks, long computation), which
    costs a thread hop per call (150-250 µs on two cores). `inline=True` runs it on the event loop
    instead, for a body that never blocks: pure computation over its arguments and memory, done in
    microseconds. An inline body that blocks stalls every call and agent of the loop, and
    `timeout_s` cannot interrupt it. See docs/interceptors.md ("Sync tools").
    """

    def build(f: Callable[..., Any], localns: Mapping[str, Any]) -> Tool[Any, Any]:
        return Tool(
            f,
            name=name,
            description=description,
            timeout_s=timeout_s,
            interceptors=interceptors,
            exclude_interceptors=exclude_interceptors,
            max_result_chars=max_result_chars,
            inline=inline,
            localns=localns,
        )

    # The decorating frame's locals resolve string annotations of classes defined beside the
    # function (postponed annotations), as pydantic does for models.
    if fn is not None:
        return build(fn, sys._getframe(1).f_locals)
    return cast(Callable[[Callable[..., Any]], Tool[Any, Any]], lambda f: build(f, sys._getframe(1).f_locals))
