"""Where the controller and the agent take their token from, and the open-controller guard."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.agent.config import AgentConfigError, parse_config
from llmgw.agent.engineprocs import _inherited
from llmgw.controller.config import is_loopback, parse_args

AGENT = ["--controller", "http://c:1", "--node", "n1", "--state-dir", "/tmp/x"]


class TestController:
    """Where the controller takes its tokens from, and the open-controller guard."""

    def test_beyond_loopback_without_token_refused(
        self, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Beyond loopback without token refused."""
        monkeypatch.delenv("LLMGW_CONTROLLER_TOKEN", raising=False)
        with pytest.raises(SystemExit) as ex:
            parse_args(["--host", "0.0.0.0"])
        assert ex.value.code == 2
        err = capsys.readouterr().err
        assert "listens beyond loopback and no token is set" in err
        assert "--insecure" in err

    def test_insecure_lets_it_serve_open(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Insecure lets it serve open."""
        monkeypatch.delenv("LLMGW_CONTROLLER_TOKEN", raising=False)
        assert parse_args(["--host", "10.0.0.5", "--insecure"]).token is None

    def test_loopback_without_token_is_fine(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Loopback without token is fine."""
        monkeypatch.delenv("LLMGW_CONTROLLER_TOKEN", raising=False)
        assert parse_args(["--host", "127.0.0.1"]).token is None

    def test_token_file_and_env(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """The controller's token comes from the file first, then the environment."""
        f = tmp_path / "tok"
        f.write_text("from-file\n")
        monkeypatch.setenv("LLMGW_CONTROLLER_TOKEN", "from-env")
        assert parse_args(["--host", "0.0.0.0", "--token-file", str(f)]).token == "from-file"
        assert parse_args(["--host", "0.0.0.0"]).token == "from-env"

    def test_flag_warns(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A token given as a flag works but warns that it is visible."""
        assert parse_args(["--token", "t"]).token == "t"
        assert "visible to every local user" in capsys.readouterr().err

    @pytest.mark.parametrize("kind", ["read", "metrics"])
    def test_read_and_metrics_tokens_from_file_env_or_flag(
        self,
        kind: str,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """Like --token: the file wins, then the flag (warned about), then the variable."""
        var = f"LLMGW_CONTROLLER_{kind.upper()}_TOKEN"
        f = tmp_path / "tok"
        f.write_text(f"{kind}-from-file\n")
        monkeypatch.setenv(var, f"{kind}-from-env")
        field = f"{kind}_token"
        got = parse_args([f"--{kind}-token-file", str(f), f"--{kind}-token", "x"])
        assert getattr(got, field) == f"{kind}-from-file"
        assert getattr(parse_args([]), field) == f"{kind}-from-env"
        capsys.readouterr()
        assert getattr(parse_args([f"--{kind}-token", "flag"]), field) == "flag"
        assert "visible to every local user" in capsys.readouterr().err
        f.write_text("")
        with pytest.raises(SystemExit):
            parse_args([f"--{kind}-token-file", str(f)])
        assert "is empty" in capsys.readouterr().err

    def test_empty_token_file_refused(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """An empty token file stops the controller."""
        f = tmp_path / "tok"
        f.write_text("")
        with pytest.raises(SystemExit):
            parse_args(["--token-file", str(f)])
        assert "is empty" in capsys.readouterr().err

    @pytest.mark.parametrize(
        ("host", "loop"),
        [
            ("127.0.0.1", True),
            ("127.1.2.3", True),
            ("::1", True),
            ("localhost", True),
            ("0.0.0.0", False),
            ("", False),
            ("10.0.0.1", False),
            ("::", False),
        ],
    )
    def test_is_loopback(self, host: str, loop: bool) -> None:
        """Which hosts count as loopback."""
        assert is_loopback(host) is loop


class TestAgent:
    """Where the agent takes its token from, and what engines never inherit."""

    def test_token_file(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """The agent's token comes from the file first, then the environment."""
        monkeypatch.setenv("LLMGW_AGENT_TOKEN", "from-env")
        f = tmp_path / "tok"
        f.write_text("from-file")
        assert parse_config([*AGENT, "--token-file", str(f)]).token == "from-file"
        assert parse_config(AGENT).token == "from-env"

    def test_missing_token_file(self, tmp_path: Path) -> None:
        """An unreadable token file is an agent config error."""
        with pytest.raises(AgentConfigError, match="cannot read"):
            parse_config([*AGENT, "--token-file", str(tmp_path / "nope")])

    def test_flag_warns(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A token given as a flag works but warns that it is visible."""
        assert parse_config([*AGENT, "--token", "t"]).token == "t"
        assert "visible to every local user" in capsys.readouterr().err

    def test_secret_env_flags_and_file(self, tmp_path: Path) -> None:
        """--secret-env names come from flags or the config file."""
        cfg = parse_config([*AGENT, "--secret-env", "HF_SRC", "--secret-env", "W_SRC"])
        assert cfg.secret_env == ("HF_SRC", "W_SRC")
        conf = tmp_path / "agent.yaml"
        conf.write_text("secret_env: HF_SRC\n")
        assert parse_config([*AGENT, "--config", str(conf)]).secret_env == ("HF_SRC",)
        assert parse_config(AGENT).secret_env == ()

    @pytest.mark.parametrize(
        ("name", "words"),
        [
            ("LLMGW_AGENT_TOKEN", "the agent's own credential"),
            ("LLMGW_ROUTER_TOKEN", "the agent's own credential"),
            ("LLMGW_TOKEN", "the agent's own credential"),
            ("A-B", "not a variable name"),
            ("PATH", "not a secret but a variable that loads code"),
            ("LD_LIBRARY_PATH", "not a secret"),
            ("CUDA_VISIBLE_DEVICES", "not a secret"),
        ],
    )
    def test_secret_env_refuses_credentials_and_bad_names(self, name: str, words: str) -> None:
        """Secret env refuses credentials and bad names."""
        with pytest.raises(AgentConfigError, match=f"secret_env .*{words}"):
            parse_config([*AGENT, "--secret-env", name])

    def test_engines_never_inherit_tokens(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Engines never inherit the agent's tokens or its secret sources."""
        monkeypatch.setenv("LLMGW_AGENT_TOKEN", "secret")
        monkeypatch.setenv("LLMGW_CONTROLLER_TOKEN", "secret")
        monkeypatch.setenv("HARMLESS", "1")
        env = _inherited()
        assert "LLMGW_AGENT_TOKEN" not in env
        assert "LLMGW_CONTROLLER_TOKEN" not in env
        assert env["HARMLESS"] == "1"
        monkeypatch.setenv("HF_SRC", "secret")
        assert "HF_SRC" in _inherited()
        assert "HF_SRC" not in _inherited(frozenset({"HF_SRC"}))
