"""Tokens from a file, the environment, or (with a warning) the command line."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from llmgw.runtime.secretfile import SecretError, resolve


def _resolve(**kw: object) -> tuple[str | None, str]:
    err = io.StringIO()
    args: dict[str, object] = {
        "program": "agent",
        "flag": "--token",
        "value": None,
        "file": None,
        "env_var": "LLMGW_TOKEN",
        "env": {},
    }
    args.update(kw)
    got = resolve(stderr=err, **args)  # type: ignore[arg-type]
    return got, err.getvalue()


class TestSecretSources:
    """Where a token is read from: file, environment or flag."""

    def test_file_first_line_trimmed(self, tmp_path: Path) -> None:
        """A token file wins, and its first line is taken trimmed."""
        f = tmp_path / "t"
        f.write_text("  s3cret \nignored\n")
        assert _resolve(file=str(f), value="flag", env={"LLMGW_TOKEN": "env"}) == ("s3cret", "")

    def test_flag_warns_and_wins_over_env(self) -> None:
        """Flag warns and wins over env."""
        got, err = _resolve(value="flag", env={"LLMGW_TOKEN": "env"})
        assert got == "flag"
        assert "visible to every local user" in err
        assert "--token-file or LLMGW_TOKEN" in err

    def test_env_quietly(self) -> None:
        """A token from the environment is taken without a warning."""
        assert _resolve(env={"LLMGW_TOKEN": "env"}) == ("env", "")

    def test_none(self) -> None:
        """No file, flag or variable gives no token and no warning."""
        assert _resolve() == (None, "")

    @pytest.mark.parametrize("content", ["", "\n  \n"])
    def test_empty_file_is_an_error(self, tmp_path: Path, content: str) -> None:
        """Empty file is an error."""
        f = tmp_path / "t"
        f.write_text(content)
        with pytest.raises(SecretError, match="is empty"):
            _resolve(file=str(f))

    def test_missing_file_is_an_error(self, tmp_path: Path) -> None:
        """Missing file is an error."""
        with pytest.raises(SecretError, match="cannot read"):
            _resolve(file=str(tmp_path / "nope"))
