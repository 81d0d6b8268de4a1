"""Unit tests cover pure logic: sockets and subprocesses raise here.

The guard patches the few entry points that every network or process call
goes through, so an accidental real I/O call fails loudly instead of passing
on a developer's machine and hanging in CI.
"""

from __future__ import annotations

import socket
import subprocess
from typing import Any

import pytest


class RealIOInUnitTest(RuntimeError):
    """A unit test tried to open a socket or start a process."""


def _forbid(what: str) -> Any:
    def raiser(*_args: Any, **_kwargs: Any) -> Any:
        raise RealIOInUnitTest(f"unit tests must not use {what}; move this to tests/integration")

    return raiser


@pytest.fixture(autouse=True)
def _no_real_io(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket.socket, "connect", _forbid("socket.connect"))
    monkeypatch.setattr(socket.socket, "connect_ex", _forbid("socket.connect_ex"))
    monkeypatch.setattr(socket.socket, "bind", _forbid("socket.bind"))
    monkeypatch.setattr(socket, "create_connection", _forbid("socket.create_connection"))
    monkeypatch.setattr(subprocess.Popen, "__init__", _forbid("subprocess"))
