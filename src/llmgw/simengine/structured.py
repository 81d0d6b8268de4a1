"""Structured output: `tool_choice` and `response_format`, checked as vLLM checks them and
answered with JSON.

vLLM constrains a reply that must call a tool (`tool_choice` "required" or a named
function) or follow a `response_format` (json_object, json_schema) to JSON; the sim
writes a fixed JSON text instead of its words: an object that fits the schema (the
function's `parameters`, the json_schema's `schema`) in its types and required
properties, built from the schema alone, so it costs no more than the schema's size.
Formats, patterns and numeric bounds other than `minimum` are not honoured; `$ref` is not
followed (its value is a string). The engine generates the text's tokens, then ends
(batcher.py: a request's `script`), so its timing is a reply of that length.

`tool_choice` "auto" with tools is answered with words (the model chose not to call).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

from llmgw.simengine import tokenizer
from llmgw.simengine.errors import SimApiError

# A schema nested deeper than this gets `null` there: recursion stays bounded whatever
# the decoder let through.
_MAX_DEPTH = 16
_WORDS = tuple(p.strip() for p in tokenizer.OUTPUT_PIECES)
_USAGE = 'Correct usage: `{"type": "function", "function": {"name": "my_function"}}`'


def _word(path: str) -> str:
    return _WORDS[zlib.crc32(path.encode()) % len(_WORDS)]


def value_for(schema: object, path: str = "", depth: int = 0) -> Any:
    """A value that fits `schema` in its type, enum and required properties."""
    if not isinstance(schema, Mapping) or depth > _MAX_DEPTH:
        return _word(path) if depth <= _MAX_DEPTH else None
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[0]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            return value_for(options[0], path, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None and "properties" in schema:
        kind = "object"
    if kind == "object":
        return _object_for(schema, path, depth)
    if kind == "array":
        n = schema.get("minItems")
        n = n if isinstance(n, int) and 0 < n <= 8 else 0
        return [value_for(schema.get("items"), f"{path}[{i}]", depth + 1) for i in range(n)]
    if kind in ("integer", "number"):
        low = schema.get("minimum")
        return low if isinstance(low, int | float) and not isinstance(low, bool) else 1
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return _word(path)


def _object_for(schema: Mapping[str, Any], path: str, depth: int) -> dict[str, Any]:
    props = schema.get("properties")
    props = props if isinstance(props, Mapping) else {}
    required = schema.get("required")
    names = [n for n in required if isinstance(n, str)] if isinstance(required, list) else []
    names += [n for n in props if n not in names] if not names else []
    return {n: value_for(props.get(n), f"{path}.{n}", depth + 1) for n in names}


def json_text(schema: object) -> str:
    """The JSON text a reply constrained to `schema` writes."""
    return tokenizer.canon(value_for(schema if schema is not None else {"type": "object"}))


def tool_call(tools: list[Any] | None, choice: object) -> tuple[str, str, bool] | None:
    """(function name, arguments JSON, required) when the reply must call a tool; None when
    it answers with words. vLLM's 400s for a `tool_choice` it cannot honour."""
    if choice is None or choice == "none":
        return None
    if tools is None:
        raise SimApiError(
            400, "When using `tool_choice`, `tools` must be set.", param="tool_choice"
        )
    if choice not in ("auto", "required") and not isinstance(choice, Mapping):
        raise SimApiError(
            400,
            f"Invalid value for `tool_choice`: {choice}! Only named tools, "
            '"none", "auto" or "required" are supported.',
            param="tool_choice",
        )
    functions = {
        t["function"].get("name"): t["function"]
        for t in tools
        if isinstance(t, Mapping) and isinstance(t.get("function"), Mapping)
    }
    if choice == "auto" or not functions:
        return None  # "required" with no tools is "none", as with OpenAI
    if choice == "required":
        name, fn = next(iter(functions.items()))
        return str(name), json_text(fn.get("parameters")), True
    assert isinstance(choice, Mapping)
    name = _named(choice)
    if name not in functions:
        raise SimApiError(
            400,
            "The tool specified in `tool_choice` does not match any of the specified `tools`",
            param="tool_choice",
        )
    return name, json_text(functions[name].get("parameters")), False


def _named(choice: Mapping[str, Any]) -> str:
    function = choice.get("function")
    if not isinstance(function, Mapping):
        raise SimApiError(
            400, f"Invalid value for `function`: `{function}` in `tool_choice`! {_USAGE}"
        )
    if "name" not in function:
        raise SimApiError(400, f"Expected field `name` in `function` in `tool_choice`! {_USAGE}")
    name = function["name"]
    if not isinstance(name, str) or not name:
        raise SimApiError(400, f"Invalid `name` in `function`: `{name}` in `tool_choice`! {_USAGE}")
    return name


def format_text(response_format: object) -> str | None:
    """The JSON text a `response_format` asks for; None: words (text, structural_tag)."""
    if response_format is None:
        return None
    fmt: Mapping[str, Any] = response_format if isinstance(response_format, Mapping) else {}
    kind = fmt.get("type")
    if kind in ("text", "structural_tag"):
        return None
    if kind == "json_object":
        return json_text({"type": "object", "required": ["answer"]})
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if isinstance(spec, Mapping) and isinstance(spec.get("name"), str):
            return json_text(spec.get("schema"))
        raise SimApiError(
            400,
            "response_format json_schema needs a `json_schema` with a `name`",
            param="response_format",
        )
    raise SimApiError(
        400,
        "response_format type must be 'text', 'json_object', 'json_schema' or 'structural_tag'",
        param="response_format",
    )
