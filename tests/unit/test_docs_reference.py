"""Reference tables in docs/ match the msgspec types they describe.

A table is announced by a comment naming the type, then a markdown table whose first
column is the field name in backticks and whose third column is the default:

    <!-- fields: llmgw.router.config.RouterConfig -->
    | field | type | default | meaning |
    | --- | --- | --- | --- |
    | `policy` | … | `ours` | … |

Each such table must list every field of the type (by its encoded name), and no other.
A default written in backticks is read as YAML and must equal the type's default;
`required` must mark exactly the fields without one. Free text (e.g. "not sent") is
not checked. Add a comment above any new reference table and it is checked too.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

DOCS = Path(__file__).resolve().parents[2] / "docs"
MARK = re.compile(r"<!-- fields: ([\w.]+) -->")
ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|")

# Types whose reference must exist somewhere in docs/ (a page may not drop one).
REQUIRED = {
    "llmgw.router.config.RouterConfig",
    "llmgw.router.config.ControllerConfig",
    "llmgw.router.config.BreakerSettings",
    "llmgw.router.config.ApiKey",
    "llmgw.wire.endpoints.EndpointInfo",
    "llmgw.wire.models.ModelSpec",
    "llmgw.wire.models.ScaleRequest",
    "llmgw.agent.config.AgentConfig",
}


def _cells(line: str) -> list[str]:
    # Split on pipes that are not escaped (`\|` inside a cell).
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def cases() -> list[Any]:
    return [pytest.param(p, d, r, id=f"{p}:{d.rsplit('.', 1)[-1]}") for p, d, r in tables()]


def tables() -> list[tuple[str, str, dict[str, str]]]:
    """(page, dotted type name, {field: default cell}) for every marked table."""
    out = []
    for page in sorted(DOCS.glob("*.md")):
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            m = MARK.search(line)
            if m is None:
                continue
            rows: dict[str, str] = {}
            for row in lines[i + 1 :]:
                if not row.startswith("|"):
                    if rows or row.strip():
                        break
                    continue
                name = ROW.match(row)
                if name is not None:
                    cells = _cells(row)
                    rows[name.group(1)] = cells[2] if len(cells) > 2 else ""
            out.append((page.name, m.group(1), rows))
    return out


def resolve(dotted: str) -> Any:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def defaults(kind: Any) -> dict[str, Any]:
    """{encoded field name: default, or NODEFAULT when the field is required}."""
    out: dict[str, Any] = {}
    for f in msgspec.structs.fields(kind):
        if f.default is not msgspec.NODEFAULT:
            out[f.encode_name] = f.default
        elif f.default_factory is not msgspec.NODEFAULT:
            out[f.encode_name] = f.default_factory()
        else:
            out[f.encode_name] = msgspec.NODEFAULT
    return out


class TestDocsReference:
    """Reference tables in docs/ match their msgspec types."""

    def test_every_required_reference_is_documented(self) -> None:
        """Each configuration and spec type has a reference table in docs/."""
        found = {name for _, name, _ in tables()}
        assert found >= REQUIRED, f"no reference table for {sorted(REQUIRED - found)}"

    @pytest.mark.parametrize(("page", "dotted", "rows"), cases())
    def test_table_lists_exactly_the_fields(
        self, page: str, dotted: str, rows: dict[str, str]
    ) -> None:
        """The table has one row per field of the type, and no row for a field it lacks."""
        fields = defaults(resolve(dotted))
        missing = sorted(fields.keys() - rows.keys())
        unknown = sorted(rows.keys() - fields.keys())
        assert not missing, f"docs/{page}: {dotted} fields not documented: {missing}"
        assert not unknown, f"docs/{page}: {dotted} has no fields {unknown}"

    @pytest.mark.parametrize(("page", "dotted", "rows"), cases())
    def test_table_defaults_are_the_types(
        self, page: str, dotted: str, rows: dict[str, str]
    ) -> None:
        """`required` marks the fields without a default; a backticked default is the real one."""
        fields = defaults(resolve(dotted))
        for name, cell in rows.items():
            if name not in fields:
                continue  # reported by the test above
            real = fields[name]
            if cell == "required" or real is msgspec.NODEFAULT:
                what = "requires it" if real is msgspec.NODEFAULT else "has a default"
                assert cell == "required", f"docs/{page}: {dotted}.{name}: the type {what}"
                assert real is msgspec.NODEFAULT, f"docs/{page}: {dotted}.{name}: the type {what}"
                continue
            m = re.fullmatch(r"`([^`]*)`", cell)
            if m is None:
                continue
            documented = yaml.safe_load(m.group(1))
            # Through JSON, so tuples compare equal to the YAML lists that document them.
            actual = msgspec.json.decode(msgspec.json.encode(real))
            assert documented == actual, (
                f"docs/{page}: {dotted}.{name} default documented as {m.group(1)}, "
                f"the type's is {actual!r}"
            )

    def test_a_stray_or_missing_field_fails(self) -> None:
        """The check itself: a table missing a field or naming a wrong one is caught."""
        fields = defaults(resolve("llmgw.router.config.BreakerSettings"))
        documented = {"failure_threshold": "`5`", "cooldown_s": "`10.0`", "bogus": "`1`"}
        assert fields.keys() - documented.keys() == {"max_cooldown_s"}
        assert documented.keys() - fields.keys() == {"bogus"}
