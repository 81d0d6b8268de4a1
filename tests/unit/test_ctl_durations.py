"""ctl's durations past the bound the controller keeps: refused in the flag's own words."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from llmgw.ctl import durations
from llmgw.wire.keys import MAX_EXPIRES_IN_S, KeyCreate
from llmgw.wire.usage import MAX_SINCE_S
from tests.unit.test_ctl_commands import FakeController, run_ctl


class TestSinceBound:
    """`usage --since` longer than the controller reaches back is a bad command line."""

    def test_the_bound_is_the_controllers(self) -> None:
        """ctl's copy of the bound (argparse imports no msgspec) is wire.usage's."""
        assert MAX_SINCE_S == durations.MAX_SINCE_S

    @pytest.mark.parametrize("since", ["3661d", "99999999999d", "9" * 400 + "w"])
    def test_past_the_bound_is_exit_2(
        self, since: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A --since past ten years exits 2 naming the flag and the bound, sending nothing."""
        fake = FakeController()
        with pytest.raises(SystemExit) as exit_:
            run_ctl(["usage", "--since", since], fake, tmp_path)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert f"argument --since: {since!r}: at most 3660d (ten years)" in err
        assert fake.calls == []

    def test_the_bound_itself_is_taken(self) -> None:
        """3660d is ten years to the second, and allowed."""
        assert durations.since_arg("3660d") == MAX_SINCE_S


class TestExpiresBound:
    """`keys create --expires-in` past a century says so in days."""

    def test_the_bound_is_the_wire_types(self) -> None:
        """KeyCreate takes MAX_EXPIRES_IN_S, 36600 days, and not a second more."""
        assert MAX_EXPIRES_IN_S == 36600 * 86400
        msgspec.convert({"name": "k", "team": "t", "expires_in_s": MAX_EXPIRES_IN_S}, KeyCreate)
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(
                {"name": "k", "team": "t", "expires_in_s": MAX_EXPIRES_IN_S + 1}, KeyCreate
            )

    @pytest.mark.parametrize("expires", ["36601d", "99999999999d", "9" * 400 + "w"])
    def test_past_the_bound_is_one_line(self, expires: str, tmp_path: Path) -> None:
        """--expires-in past 36600 days is one line in days, and nothing is sent."""
        fake = FakeController()
        run = run_ctl(
            ["keys", "create", "k", "--team", "t", "--expires-in", expires], fake, tmp_path
        )
        assert (run.code, run.err) == (
            1,
            "llmgw ctl: keys create k: --expires-in: at most 36600d (a hundred years)\n",
        )
        assert fake.calls == []
