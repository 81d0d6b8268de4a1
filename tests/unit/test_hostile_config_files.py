"""Hostile config files: every program's YAML file, named as it is at start or reload.

Each refusal is one line naming the file and what is wrong with it, quickly: never a
traceback, a hang (a FIFO with no writer) or a read without end (/dev/zero).
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from llmgw.agent.config import AgentConfigError, parse_config
from llmgw.agent.gpus.base import GpuDiscoveryError
from llmgw.agent.gpus.fake import load_file
from llmgw.controller.config import parse_args, read_node_tokens
from llmgw.ctl.config import read_config, read_token_file
from llmgw.ctl.errors import CtlError
from llmgw.router.config import RouterConfig, load, parse
from llmgw.router.control.sources import ConfigWatcher
from llmgw.router.errors import RouterConfigError
from llmgw.runtime.secretfile import SecretError, read_secret_file
from llmgw.up.fleet import FleetError, load_fleet

GOOD_ROUTER = "endpoints: [{id: a, url: 'http://a', models: [m]}]\n"


def controller(path: str) -> str:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exited:
        parse_args(["--config", path], {})
    assert exited.value.code == 2
    return err.getvalue().strip().splitlines()[-1]


def router(path: str) -> str:
    with pytest.raises(RouterConfigError) as info:
        load(path)
    return str(info.value)


def agent(path: str) -> str:
    with pytest.raises(AgentConfigError) as info:
        parse_config(["--config", path])
    return str(info.value)


def fleet(path: str) -> str:
    with pytest.raises(FleetError) as info:
        load_fleet(Path(path))
    return str(info.value)


def gpus_file(path: str) -> str:
    with pytest.raises(GpuDiscoveryError) as info:
        load_file(Path(path))
    return str(info.value)


def ctl_config(path: str) -> str:
    with pytest.raises(CtlError) as info:
        read_config(Path(path))
    return str(info.value)


LOADERS: dict[str, Callable[[str], str]] = {
    "controller --config": controller,
    "router --config": router,
    "agent --config": agent,
    "up --fleet": fleet,
    "agent --gpus-file": gpus_file,
    "ctl.yaml": ctl_config,
}


@pytest.fixture(params=sorted(LOADERS))
def refusal(request: pytest.FixtureRequest) -> Callable[[str], str]:
    return LOADERS[request.param]


class TestWhatIsNotAFile:
    """A config path that names no regular file is refused at once, naming the path."""

    def test_fifo_without_writer_is_refused_not_waited_on(
        self, tmp_path: Path, refusal: Callable[[str], str]
    ) -> None:
        """A FIFO no one writes is refused as not a regular file, never read (it would block)."""
        path = tmp_path / "c.yaml"
        os.mkfifo(path)
        said = refusal(str(path))
        assert str(path) in said
        assert "not a regular file (a FIFO)" in said
        assert "\n" not in said

    @pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
    def test_endless_device_is_refused_not_read(
        self, device: str, refusal: Callable[[str], str]
    ) -> None:
        """/dev/zero and /dev/urandom are refused, not read until memory runs out."""
        said = refusal(device)
        assert device in said
        assert "not a regular file (a character device)" in said

    def test_folder_is_refused(self, tmp_path: Path, refusal: Callable[[str], str]) -> None:
        """A folder is said to be one."""
        said = refusal(str(tmp_path))
        assert str(tmp_path) in said
        assert "is a folder" in said

    def test_symlink_loop_is_refused(self, tmp_path: Path, refusal: Callable[[str], str]) -> None:
        """A symlink loop is a one-line read error naming the path."""
        (tmp_path / "a.yaml").symlink_to(tmp_path / "b.yaml")
        (tmp_path / "b.yaml").symlink_to(tmp_path / "a.yaml")
        said = refusal(str(tmp_path / "a.yaml"))
        assert str(tmp_path / "a.yaml") in said
        assert "symbolic links" in said


class TestWhatIsNotText:
    """A regular file that is not a config's text is refused, naming the path."""

    def test_not_utf8(self, tmp_path: Path, refusal: Callable[[str], str]) -> None:
        """Bytes that are not UTF-8 are refused with the offset, never a traceback."""
        path = tmp_path / "c.yaml"
        path.write_bytes(b"port: \xff\xfe\n")
        said = refusal(str(path))
        assert str(path) in said
        assert "not UTF-8 text (byte 6)" in said

    def test_larger_than_any_config(self, tmp_path: Path, refusal: Callable[[str], str]) -> None:
        """A file past the bound is refused before it is parsed (PyYAML takes seconds per MiB)."""
        path = tmp_path / "c.yaml"
        with path.open("wb") as f:
            f.truncate(5 * 1024 * 1024)
        said = refusal(str(path))
        assert str(path) in said
        assert "larger than 4 MiB" in said


class TestRouterReloadOfAHostileFile:
    """A reload that meets a hostile file keeps the running config and says why."""

    def watcher(self, path: Path) -> tuple[ConfigWatcher, list[RouterConfig]]:
        path.write_text(GOOD_ROUTER)
        got: list[RouterConfig] = []
        return ConfigWatcher(path, on_config=got.append), got

    def test_fifo_swapped_in_is_refused_without_blocking(self, tmp_path: Path) -> None:
        """A FIFO put at the config's path is refused on the event loop, not read (a hang)."""
        path = tmp_path / "r.yaml"
        w, got = self.watcher(path)
        path.unlink()
        os.mkfifo(path)
        # The first look sees the change, the next reads the file.
        assert [w.tick(), w.tick()] == [False, False]
        assert got == []
        assert w.last_error is not None
        assert "not a regular file (a FIFO)" in w.last_error

    def test_bytes_not_utf8_are_refused(self, tmp_path: Path) -> None:
        """A file rewritten with bytes that are not UTF-8 is refused, not raised from tick()."""
        path = tmp_path / "r.yaml"
        w, got = self.watcher(path)
        path.write_bytes(b"models: [\xff]\n" + GOOD_ROUTER.encode())
        # The first look sees the change, the next reads the file.
        assert [w.tick(), w.tick()] == [False, False]
        assert got == []
        assert w.last_error is not None
        assert "not UTF-8 text" in w.last_error

    def test_symlink_to_dev_zero_is_refused(self, tmp_path: Path) -> None:
        """A symlink to /dev/zero put at the path is refused, not read without end."""
        path = tmp_path / "r.yaml"
        w, got = self.watcher(path)
        path.unlink()
        path.symlink_to("/dev/zero")
        w.request_reload()
        # The first look sees the change, the next reads the file.
        assert [w.tick(), w.tick()] == [False, False]
        assert got == []
        assert w.last_error is not None
        assert "not a regular file (a character device)" in w.last_error


def secret_file(path: str) -> str:
    with pytest.raises(SecretError) as info:
        read_secret_file(path)
    return str(info.value)


def node_tokens(path: str) -> str:
    with pytest.raises(SecretError) as info:
        read_node_tokens(path)
    return str(info.value)


def ctl_token_file(path: str) -> str:
    with pytest.raises(CtlError) as info:
        read_token_file(Path(path))
    return str(info.value)


def router_token_file(path: str) -> str:
    with pytest.raises(RouterConfigError) as info:
        parse(GOOD_ROUTER + f"admin_token_file: {path}\n", env={})
    return str(info.value)


SECRET_READERS: dict[str, Callable[[str], str]] = {
    "--token-file": secret_file,
    "--node-tokens-file": node_tokens,
    "ctl --token-file": ctl_token_file,
    "router admin_token_file": router_token_file,
}


@pytest.fixture(params=sorted(SECRET_READERS))
def secret_refusal(request: pytest.FixtureRequest) -> Callable[[str], str]:
    return SECRET_READERS[request.param]


class TestSecretFiles:
    """A secret's file that is no regular file, or too large, is refused at once, naming it."""

    def test_fifo_without_writer_is_refused_not_waited_on(
        self, tmp_path: Path, secret_refusal: Callable[[str], str]
    ) -> None:
        """A FIFO no one writes is refused as not a regular file, never read (it would block)."""
        path = tmp_path / "token"
        os.mkfifo(path)
        said = secret_refusal(str(path))
        assert str(path) in said
        assert "not a regular file (a FIFO)" in said

    def test_dev_zero_is_refused_not_read(self, secret_refusal: Callable[[str], str]) -> None:
        """/dev/zero is refused, not read until memory runs out."""
        said = secret_refusal("/dev/zero")
        assert "/dev/zero" in said
        assert "not a regular file (a character device)" in said

    def test_large_file_is_no_secret(
        self, tmp_path: Path, secret_refusal: Callable[[str], str]
    ) -> None:
        """A file past the secret bound (a model, a log) is refused before it is held."""
        path = tmp_path / "token"
        path.write_bytes(b"t" * (5 * 1024 * 1024))
        said = secret_refusal(str(path))
        assert str(path) in said
        assert "larger than" in said


def bomb(levels: int = 10) -> str:
    """A flow list whose last item stands for 9**levels strings: 'billion laughs'."""
    parts = ["&a0 [" + ", ".join(["lol"] * 9) + "]"]
    parts += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "[" + ", ".join(parts) + "]"


class TestYamlThatExpands:
    """YAML whose aliases stand for more than a config holds is refused before it is walked."""

    @pytest.mark.parametrize("key", ["host", "insecure", "allowed_host"])
    def test_controller_alias_bomb(self, tmp_path: Path, key: str) -> None:
        """A 'billion laughs' value is refused; str() of it grew memory without end."""
        path = tmp_path / "c.yaml"
        path.write_text(f"{key}: {bomb()}\n")
        said = controller(str(path))
        assert str(path) in said
        assert "aliases repeat more than 1000000 nodes" in said

    @pytest.mark.parametrize("key", ["http_server", "upstream_client", "admin_token_file"])
    def test_router_alias_bomb(self, tmp_path: Path, key: str) -> None:
        """A 'billion laughs' value is refused; repr() of it grew memory without end."""
        path = tmp_path / "r.yaml"
        path.write_text(GOOD_ROUTER + f"{key}: {bomb()}\n")
        said = router(str(path))
        assert str(path) in said
        assert "aliases repeat more than 1000000 nodes" in said

    @pytest.mark.parametrize("key", ["sim_args", "router"])
    @pytest.mark.timeout(10)
    def test_fleet_alias_bomb(self, tmp_path: Path, key: str) -> None:
        """`llmgw up --fleet` refuses one as the other files do; it walked every copy."""
        path = tmp_path / "f.yaml"
        path.write_text(f"nodes: [{{prefix: a, gpus: 1xH100-80G}}]\n{key}: {bomb()}\n")
        said = fleet(str(path))
        assert str(path) in said
        assert "aliases repeat more than 1000000 nodes" in said

    @pytest.mark.timeout(10)
    def test_aliases_of_a_long_string_are_refused(self, tmp_path: Path) -> None:
        """Few nodes, many characters: a 1 MB string repeated by 100,000 aliases in a
        model's args, which `llmgw up` sent the controller as 100 GB of JSON."""
        path = tmp_path / "f.yaml"
        aliases = ", ".join(["*s"] * 100_000)
        path.write_text(
            "nodes: [{prefix: a, gpus: 1xH100-80G}]\nmodels:\n"
            "  - {name: m, engine: sim, gpu_classes: [H100-80G],\n"
            f'     env: {{A: &s "{"x" * 1_000_000}"}}, args: [{aliases}]}}\n'
        )
        said = fleet(str(path))
        assert str(path) in said
        assert "aliases repeat more than 16777216 characters" in said

    def test_cycle_is_refused(self, tmp_path: Path) -> None:
        """An alias inside its own anchor stands for an endless value, and is refused too."""
        path = tmp_path / "r.yaml"
        path.write_text(GOOD_ROUTER + "models: &a [x, *a]\n")
        said = router(str(path))
        assert str(path) in said
        assert "an alias inside its own anchor" in said

    @pytest.mark.parametrize("loader", [controller, router])
    def test_deep_nesting(self, tmp_path: Path, loader: Callable[[str], str]) -> None:
        """A document nested past the parser's stack is one line, not a RecursionError."""
        path = tmp_path / "c.yaml"
        path.write_text("host: " + "[" * 5000 + "]" * 5000 + "\n")
        said = loader(str(path))
        assert str(path) in said
        assert "nested too deeply" in said

    def test_merge_keys_and_shared_values_still_load(self, tmp_path: Path) -> None:
        """Anchors, aliases and `<<` merges a config uses are loaded as before."""
        path = tmp_path / "r.yaml"
        path.write_text(
            "x-defaults: &d {models: [m]}\n"
            "endpoints:\n"
            "  - {<<: *d, id: a, url: 'http://a'}\n"
            "  - {<<: *d, id: b, url: 'http://b'}\n"
        )
        with pytest.raises(RouterConfigError, match="x-defaults"):
            load(path)  # the router has no such key: merged, then refused by name
        path.write_text(
            "endpoints:\n"
            "  - &a {id: a, url: 'http://a', models: &m [m]}\n"
            "  - {id: b, url: 'http://b', models: *m}\n"
        )
        assert [e.models for e in load(path).endpoints] == [("m",), ("m",)]
