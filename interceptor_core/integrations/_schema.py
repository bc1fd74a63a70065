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
        if type(data) is not dict and not isinstance(data, Mapping):  # the ABC check is the slow one
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


Accepts = Callable[[Any], bool]
"""A quick test of an instance against a schema: True only when jsonschema would accept it too."""

_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment", "deprecated", "format"})
"""Keywords that never make an instance invalid (`format` is not asserted: no format checker)."""

_OBJECT_KEYWORDS = frozenset({"properties", "required", "additionalProperties"})

_TYPES: dict[str, Accepts] = {
    "string": lambda v: isinstance(v, str),
    # Stricter than jsonschema (which also takes 1.0, and any numbers.Number): a miss only means
    # jsonschema decides.
    "integer": lambda v: type(v) is int,
    "number": lambda v: type(v) is int or type(v) is float,
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def _accept_all(v: Any) -> bool:
    return True


def _any_of(tests: list[Accepts]) -> Accepts:
    return lambda v: any(test(v) for test in tests)


def _all_of(tests: list[Accepts]) -> Accepts:
    return lambda v: all(test(v) for test in tests)


def _one_of_strings(members: frozenset[str]) -> Accepts:
    return lambda v: isinstance(v, str) and v in members


def _every_item(test: Accepts) -> Accepts:
    # `items` applies to arrays only: anything else passes it (its `type`, if any, decides).
    return lambda v: not isinstance(v, list) or all(test(item) for item in v)


def _quick(schema: Any) -> Accepts | None:
    """A quick test for `schema` when it uses only plain keywords (types, properties, required,
    additionalProperties as a bool, items, anyOf, string enums, annotations), else None.

    What tool schemas mostly are (a function's parameters, an MCP tool's arguments), checked in a
    few µs where jsonschema takes tens. It is a pre-check only: an instance it does not accept, and
    any schema it does not cover, go to jsonschema, so the verdicts and the messages stay
    jsonschema's.
    """
    if schema is True:
        return _accept_all
    if not isinstance(schema, dict):
        return None
    tests: list[Accepts] = []
    for key, value in schema.items():
        if key in _ANNOTATIONS or key in _OBJECT_KEYWORDS:
            continue
        if key == "type":
            names = [value] if isinstance(value, str) else value
            if not isinstance(names, list) or not names or any(n not in _TYPES for n in names):
                return None
            kinds = [_TYPES[n] for n in names]
            tests.append(kinds[0] if len(kinds) == 1 else _any_of(kinds))
        elif key == "enum":
            if not isinstance(value, list) or not value or not all(isinstance(e, str) for e in value):
                return None
            tests.append(_one_of_strings(frozenset(value)))
        elif key == "anyOf":
            options = [_quick(option) for option in value] if isinstance(value, list) else []
            known = [option for option in options if option is not None]
            if not known or len(known) != len(options):
                return None
            tests.append(_any_of(known))
        elif key == "items":
            each = _quick(value)
            if each is None:
                return None
            tests.append(_every_item(each))
        else:
            return None
    if _OBJECT_KEYWORDS & schema.keys():
        # `"type": "object"` beside them (a tool's arguments): one test does both.
        only_objects = schema.get("type") == "object"
        members = _object_quick(schema, only_objects)
        if members is None:
            return None
        if only_objects:
            tests.remove(_TYPES["object"])
        tests.append(members)
    if not tests:
        return _accept_all
    return tests[0] if len(tests) == 1 else _all_of(tests)


def _object_quick(schema: dict[str, Any], only_objects: bool) -> Accepts | None:
    """The quick test of `properties`, `required` and a boolean `additionalProperties` (and of
    the type, with `only_objects`)."""
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if not isinstance(properties, dict) or not isinstance(required, list) or not isinstance(extra, bool):
        return None
    if not all(isinstance(r, str) for r in required):
        return None
    tests: dict[str, Accepts] = {}
    for key, sub in properties.items():
        test = _quick(sub)
        if test is None:
            return None
        tests[key] = test
    needed = tuple(required)
    closed = not extra

    def members(v: Any) -> bool:
        if not isinstance(v, dict):
            return not only_objects  # the keywords apply to objects only
        for key in needed:
            if key not in v:
                return False
        for key, item in v.items():
            test = tests.get(key)
            if test is None:
                if closed:
                    return False
            elif not test(item):
                return False
        return True

    return members


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
    # Only for the default dialect: a schema naming its own ($schema) has its own type rules.
    quick = _quick(schema) if "$schema" not in schema else None

    def check(data: Any) -> list[str]:
        if quick is not None and quick(data):
            return []
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
