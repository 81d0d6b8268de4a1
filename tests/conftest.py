"""Shared fixtures for every test tier."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Children started by tests run this interpreter's llmgw; keep their logs quiet.
os.environ.setdefault("LLMGW_LOG_LEVEL", "WARNING")

SHARED = Path(__file__).resolve().parents[1] / "shared"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES
