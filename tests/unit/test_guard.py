"""The unit-test guard itself."""

from __future__ import annotations

import socket
import subprocess

import pytest

from tests.unit.conftest import RealIOInUnitTest


class TestNoRealIO:
    """Unit tests cannot open sockets or start processes."""

    def test_socket_connect_raises(self) -> None:
        """Connecting a socket in a unit test fails loudly."""
        with socket.socket() as s, pytest.raises(RealIOInUnitTest):
            s.connect(("127.0.0.1", 9))

    def test_subprocess_raises(self) -> None:
        """Starting a process in a unit test fails loudly."""
        with pytest.raises(RealIOInUnitTest):
            subprocess.run(["true"], check=False)
