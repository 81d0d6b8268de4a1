"""sim-engine structured output: JSON values built from a schema, and vLLM's refusals."""

from __future__ import annotations

import json

import pytest

from llmgw.simengine import structured
from llmgw.simengine.errors import SimApiError


class TestValueFor:
    """A value that fits a schema in its types and required properties."""

    def test_required_properties_of_each_type(self) -> None:
        """Each required property gets a value of its type; enums their first value."""
        schema = {
            "type": "object",
            "properties": {
                "s": {"type": "string"},
                "i": {"type": "integer", "minimum": 5},
                "b": {"type": ["boolean", "null"]},
                "e": {"enum": ["x", "y"]},
                "a": {"type": "array", "items": {"type": "number"}, "minItems": 2},
                "o": {"properties": {"deep": {"type": "null"}}},
                "skip": {"type": "string"},
            },
            "required": ["s", "i", "b", "e", "a", "o"],
        }
        v = structured.value_for(schema)
        assert (v["i"], v["b"], v["e"], v["a"], v["o"]) == (5, True, "x", [1, 1], {"deep": None})
        assert isinstance(v["s"], str)
        assert "skip" not in v

    def test_depth_is_bounded(self) -> None:
        """A schema nested past the bound gets null there, not a RecursionError."""
        schema: dict[str, object] = {"type": "string"}
        for _ in range(100):
            schema = {"type": "object", "properties": {"x": schema}, "required": ["x"]}
        json.loads(structured.json_text(schema))


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


class TestToolCall:
    """`tool_choice` checked as vLLM's protocol checks it."""

    def test_auto_and_none_answer_words(self) -> None:
        """auto, none and an absent tool_choice call nothing."""
        for choice in ("auto", "none", None):
            assert structured.tool_call(TOOLS, choice) is None

    def test_required_with_no_tools_is_none(self) -> None:
        """Tool choice "required" with an empty tools list behaves as "none", as with OpenAI."""
        assert structured.tool_call([], "required") is None

    @pytest.mark.parametrize(
        "choice",
        ["bogus", {"function": "f"}, {"function": {}}, {"function": {"name": "g"}}],
    )
    def test_bad_choices_are_400(self, choice: object) -> None:
        """An unknown string, a malformed object or a name not in tools is a 400."""
        with pytest.raises(SimApiError) as exc:
            structured.tool_call(TOOLS, choice)
        assert exc.value.status == 400
