"""The error tables list every refusal the router makes: docs/tenants.md those of a key's
limits and of flow control, docs/router.md every other.

The refusals are read from the modules that make them (`SOURCES` for tenants.md, every
other router module for router.md): each call with a literal `code="…"` keyword, its
status (the first argument or `status=`, a literal; `IMPLIED` where the callee fixes it;
none for an error body, whose status is given where it is answered) and, where it is a
literal, its `type=`. Each must have a row of the page's table under "## Errors" with
that status and code (and that type, where the source names one), so a refusal added
without a row fails here. The table may say more (the 401 of a missing key comes from
the request's way in, not from these modules).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "tenants.md"
SOURCES = (
    ROOT / "src/llmgw/router/request/tenants.py",
    ROOT / "src/llmgw/router/request/flowgate.py",
)
ROUTER_PAGE = ROOT / "docs" / "router.md"
ROUTER = ROOT / "src" / "llmgw" / "router"
# Callees whose status is theirs, not an argument's: NoReplica is always answered 503.
IMPLIED = {"NoReplica": 503}
# Callees that make an error's body only: its status is given where it is answered.
BODIES = frozenset({"error_body"})

# (status or None when the source gives none, code, type or None when it computes it)
Refusal = tuple[int | None, str, str | None]


def refusals(source: str) -> set[Refusal]:
    """Each call in `source` with literal `code=` and status keywords or arguments."""
    out: set[Refusal] = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg is not None}
        code, kind = kw.get("code"), kw.get("type")
        status = kw.get("status") or (node.args[0] if node.args else None)
        if not (isinstance(code, ast.Constant) and isinstance(code.value, str)):
            continue
        named = kind.value if isinstance(kind, ast.Constant) else None
        kind_named = named if isinstance(named, str) else None
        callee = _name(node.func)
        if callee in BODIES:
            out.add((None, code.value, kind_named))
            continue
        if callee in IMPLIED:
            out.add((IMPLIED[callee], code.value, kind_named))
            continue
        given = _statuses(status)
        assert given, f"refusal {code.value!r} without a literal status: extend the test"
        out |= {(each, code.value, kind_named) for each in given}
    return out


def _statuses(node: ast.expr | None) -> set[int]:
    """The literal statuses `node` may be: a number, or each branch of `a if c else b`."""
    if isinstance(node, ast.IfExp):
        body, orelse = _statuses(node.body), _statuses(node.orelse)
        return body | orelse if body and orelse else set()
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return {node.value}
    return set()


def _name(func: ast.expr) -> str | None:
    """The called name: `f` of `f(...)` and of `mod.f(...)`."""
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else None


def router_refusals() -> set[Refusal]:
    """Each refusal of the router's modules but those tenants.md's table covers."""
    found: set[Refusal] = set()
    for path in sorted(ROUTER.rglob("*.py")):
        if path not in SOURCES:
            found |= refusals(path.read_text())
    return found


def table(text: str) -> list[tuple[int, set[str], set[str]]]:
    """(status, types, codes) of each row of the table under "## Errors"."""
    section = text.split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if len(cells) < 4 or not cells[1].isdigit():
            continue
        ticks = re.compile(r"`([^`]+)`")
        rows.append((int(cells[1]), set(ticks.findall(cells[2])), set(ticks.findall(cells[3]))))
    return rows


def undocumented(found: set[Refusal], rows: list[tuple[int, set[str], set[str]]]) -> list[Refusal]:
    def listed(r: Refusal) -> bool:
        status, code, kind = r
        return any(
            (status is None or s == status) and code in codes and (kind is None or kind in kinds)
            for s, kinds, codes in rows
        )

    return sorted((r for r in found if not listed(r)), key=lambda r: (r[0] or 0, r[1], r[2] or ""))


class TestDocsErrors:
    """The tenants page's error table covers what limits and flow control answer."""

    def test_every_refusal_has_a_row(self) -> None:
        """Each status, code and literal type refused in SOURCES is a row of the table."""
        found: set[Refusal] = set()
        for path in SOURCES:
            found |= refusals(path.read_text())
        assert len(found) >= 4, "the refusals moved: point SOURCES at them"
        assert undocumented(found, table(PAGE.read_text())) == []

    def test_the_check_catches_a_missing_row(self) -> None:
        """A refusal whose code, status or type has no row is reported; a listed one is not."""
        source = (
            'error_response(429, "m", type="tokens", code="rate_limit_exceeded")\n'
            'FlowRefused(m, why, status=503, code="flow_wait_exceeded", retry_after_s=1)\n'
            'error_response(403, "m", type="invalid_request_error", code="model_not_allowed")\n'
        )
        page = (
            "# Page\n\n## Errors\n\n| when | status | type | code | headers |\n"
            "| --- | --- | --- | --- | --- |\n"
            "| x | 429 | `requests` or `tokens` | `rate_limit_exceeded` | |\n"
            "| y | 429 | `rate_limit_exceeded` | `flow_wait_exceeded` | |\n"
        )
        assert undocumented(refusals(source), table(page)) == [
            (403, "model_not_allowed", "invalid_request_error"),
            (503, "flow_wait_exceeded", None),
        ]


class TestRouterDocsErrors:
    """The router page's error table covers every other refusal of the router's modules."""

    def test_every_refusal_has_a_row(self) -> None:
        """Each status, code and literal type refused outside SOURCES is a row of its table."""
        found = router_refusals()
        codes = {code for _, code, _ in found}
        assert {"unknown_url", "admin_only", "model_unplaceable"} <= codes, "point ROUTER at them"
        assert undocumented(found, table(ROUTER_PAGE.read_text())) == []

    def test_a_callee_that_fixes_the_status_is_read(self) -> None:
        """NoReplica is read as 503, an error body as any status, a choice of two as both."""
        source = (
            'NoReplica(model, "why", code="model_unplaceable")\n'
            'error_body("m", type="upstream_error", code="engine_refused_key")\n'
            'errors.NoReplica(model, "why", code="no_replica")\n'
            'error_response(403 if open else 401, "m", type="t", code="admin_only")\n'
        )
        page = (
            "# Page\n\n## Errors\n\n| when | status | type | code | headers |\n"
            "| --- | --- | --- | --- | --- |\n"
            "| x | 503 | `service_unavailable` | `model_unplaceable` | |\n"
            "| y | 502 | `upstream_error` | `engine_refused_key` | |\n"
            "| z | 403 | `t` | `admin_only` | |\n"
        )
        assert undocumented(refusals(source), table(page)) == [
            (401, "admin_only", "t"),
            (503, "no_replica", None),
        ]
