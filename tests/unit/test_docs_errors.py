"""docs/tenants.md's error table lists every refusal of a key's limits and of flow control.

The refusals are read from the modules that make them (`SOURCES`): each call with a
literal `code="…"` keyword, its status (the first argument or `status=`, a literal) and,
where it is a literal, its `type=`. Each must have a row of the table under "## Errors"
with that status and code (and that type, where the source names one), so a refusal
added to those modules without a row fails here. The table may say more (the 401 of a
missing key comes from the request's way in, not from these modules).
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

# (status, code, type or None when the source computes it)
Refusal = tuple[int, str, str | None]


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
        why = f"refusal {code.value!r} without a literal status: extend the test"
        assert isinstance(status, ast.Constant), why
        assert isinstance(status.value, int), why
        named = kind.value if isinstance(kind, ast.Constant) else None
        out.add((status.value, code.value, named if isinstance(named, str) else None))
    return out


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
            s == status and code in codes and (kind is None or kind in kinds)
            for s, kinds, codes in rows
        )

    return sorted((r for r in found if not listed(r)), key=lambda r: (r[0], r[1], r[2] or ""))


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
