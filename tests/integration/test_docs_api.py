"""docs/controller.md's admin API table is what a real controller's /openapi.json says.

The table between `<!-- api:begin -->` and `<!-- api:end -->` is generated from the
document a running controller serves; the test fails when they differ (a route added,
removed or changed without the docs). Regenerate after changing the API:

    .venv/bin/python -m tests.integration.test_docs_api --write
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.integration.controller_harness import Db, controller

DOC = Path(__file__).resolve().parents[2] / "docs" / "controller.md"
BEGIN = "<!-- api:begin -->"
END = "<!-- api:end -->"
METHODS = ("get", "post", "put", "patch", "delete")


def _schema(schema: dict[str, Any]) -> str:
    """A schema in a few characters: `ModelView`, `[ModelView]`, `ModelSpec or [ModelSpec]`."""
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if schema.get("type") == "array" and "items" in schema:
        return f"[{_schema(schema['items'])}]"
    if "oneOf" in schema:
        return " or ".join(_schema(s) for s in schema["oneOf"])
    if len(schema.get("allOf", ())) == 1:  # a type with a bound added (minProperties)
        return _schema(schema["allOf"][0])
    if schema.get("type") == "object" and "properties" in schema:
        return "{" + ", ".join(schema["properties"]) + "}"
    return str(schema.get("type", "any"))


def _body(op: dict[str, Any]) -> str:
    body = op.get("requestBody")
    if body is None:
        return "–"
    shape = _schema(body["content"]["application/json"]["schema"])
    return f"`{shape}`" if body.get("required", False) else f"`{shape}` (optional)"


def _answer(op: dict[str, Any]) -> str:
    for code, resp in op["responses"].items():
        if code.startswith("2"):
            content = resp.get("content")
            if content is None:
                return code
            return f"{code} `{_schema(content['application/json']['schema'])}`"
    return "–"


def _params(op: dict[str, Any]) -> str:
    query = [p["name"] for p in op.get("parameters", ()) if p["in"] == "query"]
    return ", ".join(f"`{q}`" for q in query) or "–"


def render(doc: dict[str, Any]) -> str:
    """The markdown table for an OpenAPI document (one row per route and method)."""
    rows = [
        "| route | query | body | answer | errors | token | what |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for path, item in doc["paths"].items():
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            errors = ", ".join(c for c in op["responses"] if not c.startswith("2")) or "–"
            token = "no" if op.get("security") == [] else "yes"
            summary = str(op["summary"]).replace("|", "\\|")
            rows.append(
                f"| `{method.upper()} {path}` | {_params(op)} | {_body(op)} | {_answer(op)} "
                f"| {errors} | {token} | {summary} |"
            )
    return "\n".join(rows)


def documented_block(text: str) -> str:
    start, end = text.find(BEGIN), text.find(END)
    assert start >= 0, f"{DOC} lacks the {BEGIN} marker"
    assert end > start, f"{DOC} lacks the {END} marker after {BEGIN}"
    return text[start + len(BEGIN) : end].strip()


def served_document() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="llmgw-docs-api-") as tmp:
        db = Db(f"sqlite:///{Path(tmp) / 'controller.db'}")
        with controller(db, log_dir=Path(tmp)) as c:
            served: dict[str, Any] = c.get("/openapi.json")
            return served


class TestDocsApi:
    """docs/controller.md's API table matches a real controller's routes."""

    def test_controller_doc_lists_the_served_routes(self) -> None:
        """The admin API table in docs/controller.md equals the one rendered from /openapi.json."""
        expected = render(served_document())
        documented = documented_block(DOC.read_text())
        assert documented == expected, (
            "docs/controller.md disagrees with the controller's /openapi.json; run "
            "`.venv/bin/python -m tests.integration.test_docs_api --write` and review the diff"
        )

    def test_render_shows_each_route_and_method(self) -> None:
        """The renderer gives one row per method, with body, answer and errors."""
        doc = {
            "paths": {
                "/a/{id}": {
                    "get": {"summary": "one", "responses": {"200": {"description": "OK"}}},
                    "post": {
                        "summary": "x | y",
                        "requestBody": {
                            "required": False,
                            "content": {"application/json": {"schema": {"$ref": "#/c/s/Req"}}},
                        },
                        "responses": {
                            "204": {"description": "done"},
                            "404": {"description": "unknown"},
                        },
                        "security": [],
                    },
                }
            }
        }
        lines = render(doc).splitlines()
        assert lines[2] == "| `GET /a/{id}` | – | – | 200 | – | yes | one |"
        assert lines[3] == "| `POST /a/{id}` | – | `Req` (optional) | 204 | 404 | no | x \\| y |"


def _write() -> None:
    text = DOC.read_text()
    old = documented_block(text)
    new = render(served_document())
    start = text.find(BEGIN) + len(BEGIN)
    end = text.find(END)
    DOC.write_text(text[:start] + "\n" + new + "\n" + text[end:])
    print("docs/controller.md: unchanged" if old == new else "docs/controller.md: rewritten")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.integration.test_docs_api --write")
    _write()
