"""`tool(...)`: input and output models, definitions, the plain function."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field

from interceptor_core import ConfigurationError, Gate, RunContext, Tool, ToolContext, tool

from .conftest import OrderQuery, OrderRecord


class TestInputModel:
    def test_first_parameter_model_is_the_input_model(self, get_order: Tool[Any, Any]) -> None:
        """A function taking one pydantic model uses that model as its input model."""
        assert get_order.input_model is OrderQuery
        assert get_order.output_type is OrderRecord

    def test_model_built_from_plain_parameters(self) -> None:
        """Plain typed parameters become a model with their types and defaults, extra keys refused."""

        @tool
        def search(query: str, limit: int = 10) -> list[str]:
            return []

        schema = search.input_model.model_json_schema()
        assert schema["properties"]["query"]["type"] == "string"
        assert schema["properties"]["limit"]["default"] == 10
        assert schema["required"] == ["query"]
        assert schema["additionalProperties"] is False

    def test_tool_context_parameter_is_not_an_input(self) -> None:
        """A parameter annotated ToolContext is left out of the input model."""

        @tool
        async def whoami(ctx: ToolContext, loud: bool = False) -> str:
            return ctx.run.principal or ""

        assert set(whoami.input_model.model_fields) == {"loud"}

    def test_unannotated_parameter_is_a_configuration_error(self) -> None:
        """A parameter without a type cannot be shown to a model: refused when the tool is built."""
        with pytest.raises(ConfigurationError, match=r"'x' .* no type annotation"):

            @tool
            def bad(x) -> None:  # type: ignore[no-untyped-def]
                return None

    def test_model_plus_more_parameters_is_a_configuration_error(self) -> None:
        """A model parameter followed by plain ones is ambiguous and refused."""
        with pytest.raises(ConfigurationError, match="move 'extra' into that model"):

            @tool
            def bad(args: OrderQuery, extra: int) -> None:
                return None

    def test_var_args_are_a_configuration_error(self) -> None:
        """*args cannot be described to a model."""
        with pytest.raises(ConfigurationError, match="must be named"):

            @tool
            def bad(*values: int) -> None:
                return None


class TestDefinition:
    def test_definition_has_name_description_and_schema_with_descriptions(self, get_order: Tool[Any, Any]) -> None:
        """definition() carries what a model is shown, field descriptions included."""
        definition = get_order.definition()
        assert definition["name"] == "get_order"
        assert definition["description"] == "Loads an order record by ID"
        props = definition["parameters"]["properties"]
        assert props["order_id"]["description"] == "Order ID to inspect or refund"
        assert definition["input_schema"] == definition["parameters"]

    def test_annotated_field_description_and_docstring_default(self) -> None:
        """Annotated Field descriptions reach the schema; the docstring is the default description."""

        @tool(name="lookup-user")
        def lookup(user_id: Annotated[str, Field(description="The user's ID")]) -> dict[str, Any]:
            """Finds a user."""
            return {}

        definition = lookup.definition()
        assert definition["name"] == "lookup-user"
        assert definition["description"] == "Finds a user."
        assert definition["parameters"]["properties"]["user_id"]["description"] == "The user's ID"


class TestPlainFunction:
    async def test_fn_is_the_undecorated_function(self, get_order: Tool[Any, Any]) -> None:
        """Tool.fn calls the body directly, for unit tests of the tool itself."""
        ctx = ToolContext(RunContext(), "c-1", None)  # type: ignore[arg-type]
        record = await get_order.fn(OrderQuery(order_id="X-1"), ctx)
        assert record.order_id == "X-1"

    def test_options_are_checked(self) -> None:
        """A non-positive timeout or result limit is refused at build time."""
        with pytest.raises(ConfigurationError, match="timeout_s"):
            tool(lambda: None, name="t", timeout_s=0)
        with pytest.raises(ConfigurationError, match="max_result_chars"):
            tool(lambda: None, name="t", max_result_chars=0)


class TestOutput:
    async def test_output_is_validated_against_the_return_annotation(self) -> None:
        """A body that returns something its annotation refuses yields an error result."""

        @tool
        def count() -> int:
            return "many"  # type: ignore[return-value]

        result = await Gate("g").invoke(count, {})
        assert result.kind == "error"
        assert "does not match its declared type" in (result.message or "")

    async def test_output_is_coerced_to_the_declared_model(self) -> None:
        """A dict returned for a model annotation comes back as the model."""

        class Point(BaseModel):
            x: int
            y: int

        @tool
        def origin() -> Point:
            return {"x": 0, "y": 0}  # type: ignore[return-value]

        result = await Gate("g").invoke(origin, {})
        assert result.value == Point(x=0, y=0)

    async def test_string_output_is_cut_to_max_result_chars(self) -> None:
        """A long text result is cut to max_result_chars and flagged."""

        @tool(max_result_chars=10)
        def shout() -> str:
            return "A" * 100

        result = await Gate("g").invoke(shout, {})
        assert result.truncated
        assert result.value.startswith("A" * 10)
        assert not result.value.startswith("A" * 11)

    async def test_model_text_of_structured_output_is_cut(self) -> None:
        """to_model_text() cuts the JSON of a structured result to the limit too."""

        @tool(max_result_chars=20)
        def listing() -> list[int]:
            return list(range(100))

        result = await Gate("g").invoke(listing, {})
        text = result.to_model_text()
        assert text.startswith("[0,1,2,3")
        assert len(text) < 40
        assert text.endswith("[truncated]")
