"""The controller's --client-share: one client address's part of its connections."""

from __future__ import annotations

import pytest

from llmgw.controller.config import parse_args


class TestClientShareFlag:
    """--client-share is a part of the whole, in (0, 1]."""

    def test_default_half_and_whole(self) -> None:
        """Half by default; 1.0 (behind a proxy) is taken."""
        assert parse_args([]).client_share == 0.5
        assert parse_args(["--client-share", "1"]).client_share == 1.0

    @pytest.mark.parametrize("given", ["0", "-0.5", "1.5"])
    def test_outside_zero_to_one_is_refused(
        self, given: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Zero (no connection at all), negative and above one exit 2 naming the flag."""
        with pytest.raises(SystemExit) as caught:
            parse_args([f"--client-share={given}"])
        assert caught.value.code == 2
        assert "--client-share" in capsys.readouterr().err
