"""ManualClock."""

from __future__ import annotations

import pytest

from llmgw.testing import ManualClock


class TestManualClock:
    """ManualClock moves both readings forward and never backwards."""

    def test_advance_moves_both_readings(self) -> None:
        """advance() moves monotonic and wall time by the same amount."""
        c = ManualClock()
        m0, w0 = c.monotonic(), c.wall()
        c.advance(2.5)
        assert (c.monotonic() - m0, c.wall() - w0) == (2.5, 2.5)

    def test_backwards_is_refused(self) -> None:
        """Time never goes backwards."""
        with pytest.raises(ValueError, match="backwards"):
            ManualClock().advance(-1)
