"""The house style that can be read from the source: tests in documented classes, short modules.

Every test lives in a class whose docstring is one sentence (one class per
subject), and every test method has a one-sentence docstring saying what it checks, so a
reader learns what a file covers from its docstrings alone. Every module under
src/ stays under MAX_LINES lines (one job per module; split before it grows).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import TypeGuard

import pytest

TESTS = Path(__file__).resolve().parents[1]
SRC = TESTS.parent / "src"
MAX_LINES = 600
# A sentence ends at . ! or ? followed by a space and a capital: "e.g. x" does not end one.
SENTENCE_END = re.compile(r"[.!?]\s+[A-Z`]")
FOLDERS = ("unit", "integration", "e2e")


def _files(folder: str) -> list[Path]:
    return sorted((TESTS / folder).rglob("test_*.py"))


def _is_test(node: ast.stmt) -> TypeGuard[ast.FunctionDef | ast.AsyncFunctionDef]:
    return isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")


def offences(path: Path, source: str) -> list[str]:
    """Each way `source` leaves the house style, as `path:line: what`."""
    out: list[str] = []
    for node in ast.parse(source).body:
        if _is_test(node):
            out.append(f"{path}:{node.lineno}: test function {node.name} outside a class")
        if not (isinstance(node, ast.ClassDef) and node.name.startswith("Test")):
            continue
        doc = ast.get_docstring(node)
        if not doc:
            out.append(f"{path}:{node.lineno}: class {node.name} has no docstring")
        elif not _one_sentence(doc):
            out.append(f"{path}:{node.lineno}: class {node.name}'s docstring is not one sentence")
        for item in node.body:
            if not _is_test(item):
                continue
            said = ast.get_docstring(item)
            if not said:
                out.append(f"{path}:{item.lineno}: {node.name}.{item.name} has no docstring")
            elif not _one_sentence(said):
                out.append(
                    f"{path}:{item.lineno}: {node.name}.{item.name}'s docstring is not one sentence"
                )
    return out


def _one_sentence(doc: str) -> bool:
    return not ("\n\n" in doc or SENTENCE_END.search(doc) or not doc.rstrip().endswith("."))


class TestHouseStyle:
    """Every test file keeps its tests in documented classes."""

    @pytest.mark.parametrize("folder", FOLDERS)
    def test_every_test_is_a_documented_method_of_a_documented_class(self, folder: str) -> None:
        """No loose test functions, no class or test method without its one-sentence docstring."""
        found = [
            line
            for path in _files(folder)
            for line in offences(path.relative_to(TESTS.parent), path.read_text())
        ]
        assert found == []

    def test_the_check_finds_each_offence(self) -> None:
        """A loose test, an undocumented class and method, and two-sentence docstrings are named."""
        source = (
            "def test_loose():\n    pass\n"
            "class TestBare:\n    def test_x(self):\n        pass\n"
            'class TestTwo:\n    """One. Two."""\n    def test_y(self):\n        """Y."""\n'
            'class TestGood:\n    """See e.g. z."""\n    def test_z(self):\n        """Z."""\n'
            'class TestLong:\n    """L."""\n    def test_w(self):\n        """W.\n\n        X."""\n'
        )
        assert offences(Path("t.py"), source) == [
            "t.py:1: test function test_loose outside a class",
            "t.py:3: class TestBare has no docstring",
            "t.py:4: TestBare.test_x has no docstring",
            "t.py:6: class TestTwo's docstring is not one sentence",
            "t.py:16: TestLong.test_w's docstring is not one sentence",
        ]


def oversized(root: Path) -> dict[str, int]:
    """Each module under `root` over MAX_LINES lines: its path from `root` → its line count."""
    out: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        with path.open("rb") as f:
            lines = sum(1 for _ in f)
        if lines > MAX_LINES:
            out[path.relative_to(root).as_posix()] = lines
    return out


class TestModuleSize:
    """No module under src/ grows past MAX_LINES lines."""

    def test_no_module_over_the_limit(self) -> None:
        """No module under src/ is over MAX_LINES lines."""
        assert oversized(SRC) == {}

    def test_the_count_finds_a_long_module(self, tmp_path: Path) -> None:
        """A module one line over the limit is named with its count; one at the limit is not."""
        (tmp_path / "pkg").mkdir()
        (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
        (tmp_path / "pkg" / "fits.py").write_text("x = 1\n" * MAX_LINES)
        assert oversized(tmp_path) == {"pkg/long.py": MAX_LINES + 1}
