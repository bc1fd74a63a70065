"""Gate tools described by a JSON Schema instead of a Python signature.

MCP servers and agent frameworks describe a tool's input as JSON Schema. `schema_tool` makes a
`Tool` whose input model is permissive (any JSON object) but validates against that schema, and
whose `definition()` shows the schema exactly as the server or framework gave it.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

from interceptor_core.context import ToolContext
from interceptor_core.exceptions import ConfigurationError
from interceptor_core.tools import Tool

ToolBody = Callable[[dict[str, Any], ToolContext], Awaitable[Any]]
"""What runs when the gate lets a call through: the (validated, possibly rewritten) arguments as a
plain dict, and the call's context."""


class SchemaArgs(BaseModel):
    """The input model of a tool described by JSON Schema: any object the schema accepts.

    The arguments are kept as extra fields, so `model_dump()` gives them back unchanged.
    `model_json_schema()` is the schema the tool was built from.
    """

    model_config = ConfigDict(extra="allow", frozen=True)
    json_schema: ClassVar[dict[str, Any]] = {}
    validate_schema: ClassVar[Callable[[Any], list[str]] | None] = None

    @model_validator(mode="before")
    @classmethod
    def _check_schema(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            raise PydanticCustomError(
                "json_schema", "the arguments must be a JSON object, got {got}", {"got": type(data).__name__}
            )
        check = cls.validate_schema
        if check is not None:
            problems = check(data)
            if problems:
                raise PydanticCustomError("json_schema", "{problems}", {"problems": "; ".join(problems)})
        return data


def _replace_schema(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    # pydantic calls this with the schema it derived from the (empty) model: show the real one.
    schema.clear()
    schema.update(copy.deepcopy(getattr(cls, "json_schema", {})))


def _validator(name: str, schema: dict[str, Any]) -> Callable[[Any], list[str]]:
    """A check of arguments against `schema`, built once. Raises `ConfigurationError` for a schema
    that is not valid JSON Schema."""
    import jsonschema  # a dependency of the MCP SDK and of the dashboard; loaded with the integrations only

    validator_class = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        validator_class.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ConfigurationError(f"tool {name!r} has an invalid input schema: {exc.message}", tool=name) from exc
    validator = validator_class(schema)

    def check(data: Any) -> list[str]:
        problems = []
        for error in sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path))):
            where = "/".join(str(p) for p in error.absolute_path) or "(arguments)"
            problems.append(f"{where}: {error.message}")
        return problems

    return check


def schema_model(name: str, schema: Mapping[str, Any]) -> type[SchemaArgs]:
    """A `SchemaArgs` subclass for `schema` (an object schema; a missing `type` means object)."""
    schema = dict(copy.deepcopy(schema))
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    model_name = "".join(part.capitalize() for part in name.replace("-", "_").replace(".", "_").split("_")) + "Args"
    return type(
        model_name,
        (SchemaArgs,),
        {
            "__module__": __name__,
            "model_config": ConfigDict(extra="allow", frozen=True, json_schema_extra=_replace_schema),
            "json_schema": schema,
            "validate_schema": staticmethod(_validator(name, schema)),
        },
    )


def schema_tool(
    name: str,
    description: str,
    input_schema: Mapping[str, Any],
    body: ToolBody,
    *,
    output_type: Any = Any,
    timeout_s: float | None = None,
    interceptors: Sequence[object] = (),
    exclude_interceptors: Sequence[str] = (),
    max_result_chars: int | None = None,
) -> Tool[Any, Any]:
    """A `Tool` whose input is `input_schema` (JSON Schema) and whose body is `body(args, ctx)`.

    The gate validates arguments against the schema (an invalid call is an `error` result and the
    body does not run); interceptors see the arguments as a plain mapping, and `Rewrite` is
    checked against the schema again. `definition()` shows `input_schema` unchanged. Raises
    `ConfigurationError` for a bad name or an invalid schema.
    """
    model = schema_model(name, input_schema)

    async def run(args: SchemaArgs, ctx: ToolContext) -> Any:
        return await body(args.model_dump(), ctx)

    # Real classes rather than strings, so the signature resolves without this module's namespace.
    run.__annotations__ = {"args": model, "ctx": ToolContext, "return": output_type}
    run.__qualname__ = run.__name__ = f"{name}_via_schema"
    return Tool(
        run,
        name=name,
        description=description,
        timeout_s=timeout_s,
        interceptors=interceptors,
        exclude_interceptors=exclude_interceptors,
        max_result_chars=max_result_chars,
    )
