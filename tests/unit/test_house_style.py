"""The tests' own house style, read from their source with `ast`.

Every test lives in a class whose docstring is one sentence (one class per
subject), and every test method has a docstring saying what it checks, so a
reader learns what a file covers from its docstrings alone.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import TypeGuard

import pytest

TESTS = Path(__file__).resolve().parents[1]
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
        elif "\n\n" in doc or SENTENCE_END.search(doc) or not doc.rstrip().endswith("."):
            out.append(f"{path}:{node.lineno}: class {node.name}'s docstring is not one sentence")
        for item in node.body:
            if _is_test(item) and not ast.get_docstring(item):
                out.append(f"{path}:{item.lineno}: {node.name}.{item.name} has no docstring")
    return out


class TestHouseStyle:
    """Every test file keeps its tests in documented classes."""

    @pytest.mark.parametrize("folder", FOLDERS)
    def test_every_test_is_a_documented_method_of_a_documented_class(self, folder: str) -> None:
        """No loose test functions, no class or test method without its docstring."""
        found = [
            line
            for path in _files(folder)
            for line in offences(path.relative_to(TESTS.parent), path.read_text())
        ]
        assert found == []

    def test_the_check_finds_each_offence(self) -> None:
        """A loose test, an undocumented class and method, and a two-sentence class are named."""
        source = (
            "def test_loose():\n    pass\n"
            "class TestBare:\n    def test_x(self):\n        pass\n"
            'class TestTwo:\n    """One. Two."""\n    def test_y(self):\n        """Y."""\n'
            'class TestGood:\n    """See e.g. z."""\n    def test_z(self):\n        """Z."""\n'
        )
        assert offences(Path("t.py"), source) == [
            "t.py:1: test function test_loose outside a class",
            "t.py:3: class TestBare has no docstring",
            "t.py:4: TestBare.test_x has no docstring",
            "t.py:6: class TestTwo's docstring is not one sentence",
        ]
