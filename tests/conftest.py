"""Shared fixtures for every test tier."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Children started by tests run this interpreter's llmgw; keep their logs quiet.
os.environ.setdefault("LLMGW_LOG_LEVEL", "WARNING")


def _python_router_here() -> None:
    """This process imports the router's Python modules, never their mypyc build: tests
    subclass and patch them, which compiled classes and modules refuse. Routers the tests
    start as processes still load the build when there is one (their `main` does)."""
    from llmgw.router import compiled

    compiled.load({compiled.ENV: "0"})


_python_router_here()

SHARED = Path(__file__).resolve().parents[1] / "shared"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES
