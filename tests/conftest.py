"""Shared fixtures for every test tier."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# Children started by tests run this interpreter's llmgw; keep their logs quiet.
os.environ.setdefault("LLMGW_LOG_LEVEL", "WARNING")


def _python_router_here() -> None:
    """This process imports the router's Python modules, never their mypyc build: tests
    subclass and patch them, which compiled classes and modules refuse. Routers the tests
    start as processes still load the build when there is one (their `main` does)."""
    from llmgw.router import compiled

    compiled.load({compiled.ENV: "0"})


_python_router_here()

# No per-example deadline: the tests share a two-core machine with other processes, and
# hypothesis' 200 ms default failed sound property tests as flaky whenever one example
# was descheduled. Speed is the benchmarks' to measure (bench/), not the tests'.
settings.register_profile("llmgw", deadline=None)
settings.load_profile("llmgw")

SHARED = Path(__file__).resolve().parents[1] / "shared"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Test files with a `slow` test run first, each file's tests in their own order.

    scripts/test spreads the files over several processes (`--dist loadfile`, in this
    order): a slow file started last would leave the others idle while it runs."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES
