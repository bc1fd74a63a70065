"""The quick pre-check of JSON-Schema tools (`_schema._quick`), on Pydantic AI's path and the other
integrations': it never accepts what jsonschema refuses, and it covers the schemas tools have."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic_ai.toolsets import FunctionToolset

from interceptor_core.integrations._schema import _quick, schema_tool

TYPES = ["string", "integer", "number", "boolean", "null", "array", "object"]

leaf_schemas = st.one_of(
    st.fixed_dictionaries(
        {"type": st.sampled_from(TYPES)}, optional={"title": st.just("T"), "format": st.just("email")}
    ),
    st.fixed_dictionaries({"type": st.lists(st.sampled_from(TYPES), min_size=1, max_size=3, unique=True)}),
    st.fixed_dictionaries({"enum": st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3, unique=True)}),
    st.just(True),
    st.just({}),
)


def _extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    objects = st.builds(
        lambda props, required, extra, typed: {
            **({"type": "object"} if typed else {}),
            "properties": props,
            "required": required,
            **({"additionalProperties": extra} if extra is not None else {}),
        },
        st.dictionaries(st.sampled_from(["a", "b", "c"]), children, max_size=3),
        st.lists(st.sampled_from(["a", "b", "c"]), max_size=3, unique=True),
        st.one_of(st.none(), st.booleans()),
        st.booleans(),
    )
    arrays = st.builds(
        lambda each, typed: {"type": "array", "items": each} if typed else {"items": each}, children, st.booleans()
    )
    unions = st.builds(lambda options: {"anyOf": options}, st.lists(children, min_size=1, max_size=3))
    return st.one_of(objects, arrays, unions)


schemas = st.recursive(leaf_schemas, _extend, max_leaves=8)

json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-3, 3),
        st.sampled_from([0.0, 1.0, 1.5, -2.5]),
        st.sampled_from(["a", "b", "z", ""]),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), children, max_size=3),
    ),
    max_leaves=8,
)


class TestQuickCheck:
    @settings(max_examples=400, deadline=None)
    @given(schema=schemas, value=json_values)
    def test_never_accepts_what_jsonschema_refuses(self, schema: Any, value: Any) -> None:
        """Whatever the schema of the covered kinds and the instance, a quick yes is jsonschema's yes."""
        quick = _quick(schema)
        assert quick is not None
        if quick(value):
            assert jsonschema.Draft202012Validator(schema).is_valid(value)

    @pytest.mark.parametrize(
        "schema",
        [
            {"$ref": "#/$defs/x", "$defs": {"x": {"type": "string"}}},
            {"type": "string", "minLength": 3},
            {"type": "object", "additionalProperties": {"type": "string"}},
            {"enum": [1, True]},
            {"type": "object", "patternProperties": {"^a": {"type": "string"}}},
            False,
        ],
    )
    def test_leaves_other_keywords_to_jsonschema(self, schema: Any) -> None:
        """A schema with a keyword it does not know has no quick check."""
        assert _quick(schema) is None

    def test_covers_a_pydantic_ai_function_schema(self) -> None:
        """A plain function's parameters, as Pydantic AI describes them, have a quick check that
        accepts valid arguments."""

        def get_order(order_id: str, include_items: bool = False, tags: list[str] | None = None) -> str:
            """Loads an order."""
            return order_id

        (tool,) = FunctionToolset([get_order]).tools.values()
        schema = tool.function_schema.json_schema
        quick = _quick(schema)
        assert quick is not None
        assert quick({"order_id": "o-1", "tags": ["x"], "include_items": True})
        assert not quick({"include_items": True})

    async def test_the_messages_stay_jsonschemas(self) -> None:
        """A refused call gets jsonschema's message, whether or not the quick check ran."""

        async def body(args: dict[str, Any], ctx: Any) -> Any:
            return args

        for schema in (
            {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
            {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}, "required": ["n"]},
        ):
            tool = schema_tool("count", "", schema, body)
            with pytest.raises(ValueError, match="n: 'x' is not of type 'integer'"):
                tool.input_model.model_validate({"n": "x"})
            assert tool.input_model.model_validate({"n": 2}).model_dump() == {"n": 2}
