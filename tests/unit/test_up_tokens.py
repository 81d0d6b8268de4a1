"""`llmgw up`'s tokens (0600 files in its state folder) and how ctl finds the admin one."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from llmgw.ctl.config import resolve
from llmgw.ctl.errors import CtlError
from llmgw.up.tokens import KINDS, TokenFolderError, ensure_tokens


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


class TestEnsureTokens:
    """The token files llmgw up writes."""

    def test_drawn_once_0600_and_kept(self, tmp_path: Path) -> None:
        """Each token is drawn once, written 0600 in a 0700 folder, and kept across runs."""
        first = ensure_tokens(tmp_path)
        assert _mode(first.folder) == 0o700
        values = [getattr(first, k) for k in KINDS]
        assert len(set(values)) == len(KINDS)
        for kind in KINDS:
            assert _mode(first.path(kind)) == 0o600
            assert first.path(kind).read_text() == getattr(first, kind) + "\n"
        # Kept across runs: a ctl or a status page set up once keeps working.
        assert ensure_tokens(tmp_path) == first

    def test_an_edited_file_gives_its_first_line_as_every_reader_does(self, tmp_path: Path) -> None:
        """An edited file gives its first line as every reader does."""
        first = ensure_tokens(tmp_path)
        first.path("admin").write_text(first.admin + "\nnote: rotate monthly\n")
        assert ensure_tokens(tmp_path).admin == first.admin

    def test_given_admin_token_and_loose_modes(self, tmp_path: Path) -> None:
        """A given admin token is used and loosened file modes are tightened again."""
        first = ensure_tokens(tmp_path)
        first.path("agent").chmod(0o644)
        second = ensure_tokens(tmp_path, admin="mine-0123456789")
        assert second.admin == "mine-0123456789"
        assert second.agent == first.agent
        assert _mode(second.path("agent")) == 0o600

    def test_symlink_is_replaced_never_followed(self, tmp_path: Path) -> None:
        """A symlink in the token folder is replaced, never followed."""
        target = tmp_path / "elsewhere"
        target.write_text("")
        (tmp_path / "tokens").mkdir(mode=0o700)
        (tmp_path / "tokens" / "router").symlink_to(target)
        tokens = ensure_tokens(tmp_path)
        assert not tokens.path("router").is_symlink()
        assert target.read_text() == ""

    def test_a_file_where_the_folder_goes(self, tmp_path: Path) -> None:
        """A file where the token folder goes is a TokenFolderError."""
        (tmp_path / "tokens").write_text("x")
        with pytest.raises(TokenFolderError):
            ensure_tokens(tmp_path)


class TestCtlFindsTheToken:
    """How ctl finds the admin token."""

    def test_token_file_flag_and_env(self, tmp_path: Path) -> None:
        """ctl takes the token from the flag, LLMGW_TOKEN, or a token file, in that order."""
        f = tmp_path / "t"
        f.write_text("from-file\n")
        home = tmp_path / "home"
        got = resolve(flag_url=None, flag_token=None, flag_token_file=str(f), env={}, home=home)
        assert got.token == "from-file"
        env = {"LLMGW_TOKEN_FILE": str(f)}
        assert resolve(flag_url=None, flag_token=None, env=env, home=home).token == "from-file"
        # LLMGW_TOKEN comes before LLMGW_TOKEN_FILE; a flag before either.
        env["LLMGW_TOKEN"] = "env"
        assert resolve(flag_url=None, flag_token=None, env=env, home=home).token == "env"
        assert resolve(flag_url=None, flag_token="flag", env=env, home=home).token == "flag"
        f.write_text("")
        with pytest.raises(CtlError, match="is empty"):
            resolve(flag_url=None, flag_token=None, flag_token_file=str(f), env={}, home=home)

    def test_up_s_admin_token_for_a_loopback_controller_only(self, tmp_path: Path) -> None:
        """ctl takes llmgw up's admin token only for a loopback controller."""
        (tmp_path / ".llmgw").mkdir()
        tokens = ensure_tokens(tmp_path / ".llmgw")
        home = tmp_path / "home"
        for url in (None, "http://127.0.0.1:9001", "localhost:8081", "http://[::1]:8081"):
            got = resolve(flag_url=url, flag_token=None, env={}, home=home, cwd=tmp_path)
            assert got.token == tokens.admin, url
        # A local file's token is never sent to another host.
        remote = resolve(
            flag_url="http://10.0.0.5:8081", flag_token=None, env={}, home=home, cwd=tmp_path
        )
        assert remote.token is None
        # Anything given explicitly wins.
        given = resolve(flag_url=None, flag_token="t", env={}, home=home, cwd=tmp_path)
        assert given.token == "t"
        assert resolve(flag_url=None, flag_token=None, env={}, home=home).token is None

    def test_only_a_file_up_made_is_taken(self, tmp_path: Path) -> None:
        """Only a regular 0600 file in a 0700 folder, as up makes them, is read as a token."""
        # The current folder may be anyone's (/tmp/project): a planted
        # `.llmgw/tokens/admin` symlink would have ctl read one of this user's files (say
        # ~/.git-credentials, whose first line is a credential) and send it as the token
        # to whatever listens on 127.0.0.1:8081.
        home = tmp_path / "home"
        mine = tmp_path / "git-credentials"
        mine.write_text("https://me:ghp_secret@github.com\n")
        folder = tmp_path / ".llmgw" / "tokens"
        folder.mkdir(parents=True, mode=0o700)
        (folder / "admin").symlink_to(mine)
        with pytest.raises(CtlError, match="not the one llmgw up makes") as err:
            resolve(flag_url=None, flag_token=None, env={}, home=home, cwd=tmp_path)
        assert "ghp_secret" not in str(err.value)
        (folder / "admin").unlink()
        (folder / "admin").write_text("tok\n")
        for file_mode, folder_mode in ((0o644, 0o700), (0o600, 0o777)):
            (folder / "admin").chmod(file_mode)
            folder.chmod(folder_mode)
            with pytest.raises(CtlError, match="not the one llmgw up makes"):
                resolve(flag_url=None, flag_token=None, env={}, home=home, cwd=tmp_path)
        folder.chmod(0o700)
        (folder / "admin").chmod(0o600)
        assert resolve(flag_url=None, flag_token=None, env={}, home=home, cwd=tmp_path).token == (
            "tok"
        )


class TestUpTokenFlag:
    """llmgw up warns that a token given as a flag is public."""

    def test_up_warns_that_its_token_flag_is_public(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Like every other program's --token: visible in ps, so said, with the way out."""
        from llmgw.up.main import main

        assert main(["--token", "t-0123456789", "--fleet", str(tmp_path / "no-such-fleet")]) == 2
        err = capsys.readouterr().err
        assert "llmgw up: warning: --token on the command line is visible" in err
        assert "tokens/admin" in err
        assert "t-0123456789" not in err
