"""The wheel: built from this checkout, installed into a fresh venv, it runs compiled.

The wheel is built once per source tree and cached (llmgw.testing.wheel: a minute
or more the first time); each run installs it into a new virtual environment with
its dependencies from the package index, then starts that venv's router and
`llmgw up`. Where this machine cannot compile (no C compiler or Python headers) the
wheel is pure Python, and the test checks that it says so instead.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import urllib.request
import zipfile
from pathlib import Path

import pytest

from llmgw.router.compiled import MODULES
from llmgw.testing import free_port, start_program, up_engine_ports
from llmgw.testing.wheel import WheelBuildFailed, build

from .router_fixtures import base_config, write_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def can_compile() -> bool:
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    return shutil.which(cc) is not None and headers.is_file()


@pytest.fixture(scope="module")
def wheel() -> Path:
    try:
        return build()
    except WheelBuildFailed as exc:
        if "No matching distribution" in str(exc) or "Could not find a version" in str(exc):
            pytest.skip(f"the build's requirements are not installable here: {exc}")
        raise


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with only the wheel and its dependencies."""
    folder = tmp_path_factory.mktemp("wheel-venv")
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True, timeout=120)
    python = folder / "bin" / "python"
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return python


def _metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text: str = resp.read().decode()
    return text


class TestWheel:
    """`pip wheel .` gives a wheel whose router runs compiled, with no step of its own."""

    def test_wheel_carries_the_compiled_modules(self, wheel: Path) -> None:
        """Each compiled module and its library are in the wheel beside its source."""
        names = zipfile.ZipFile(wheel).namelist()
        if not can_compile():
            assert wheel.name.endswith("-py3-none-any.whl")
            return
        for module in MODULES:
            stem = "/".join(module.split("."))
            assert any(n.startswith(stem + ".cpython") for n in names), module
            assert any(n.startswith(stem + "__mypyc.cpython") for n in names), module
            assert stem + ".py" in names, module

    def test_router_reports_compiled(self, venv: Path, tmp_path: Path) -> None:
        """The installed router's `llmgw_router_compiled` is 1 for every module."""
        config = write_config(tmp_path / "router.yaml", base_config(endpoints=[]))
        args = ["router", "--config", str(config), "--port", "0", "--workers", "1"]
        with start_program(args, python=str(venv), log_dir=tmp_path, cwd=tmp_path) as router:
            text = _metrics(router.url)
        want = "1.0" if can_compile() else "0.0"
        for module in MODULES:
            assert f'llmgw_router_compiled{{module="{module}"}} {want}' in text, module

    def test_python_modules_on_request(self, venv: Path, tmp_path: Path) -> None:
        """LLMGW_ROUTER_COMPILED=0 runs the wheel's Python sources although the
        extension modules lie beside them."""
        code = (
            "import llmgw.router.compiled as c; c.load(); import llmgw.router.routing.prefix as p;"
            "print(c.STATUS.modules == (), p.__file__.endswith('.py'))"
        )
        done = subprocess.run(
            [str(venv), "-c", code],
            env={"LLMGW_ROUTER_COMPILED": "0", "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            check=False,
        )
        assert (done.returncode, done.stdout) == (0, "True True\n"), done.stderr

    def test_up_starts(self, venv: Path, tmp_path: Path) -> None:
        """`llmgw up` from the installed wheel starts the whole system and answers."""
        ports = ["--port", str(free_port()), "--controller-port", str(free_port())]
        args = ["up", *ports, "--state-dir", str(tmp_path / "state"), "--quiet"]
        args += up_engine_ports()
        up = start_program(
            args, python=str(venv), log_dir=tmp_path, cwd=tmp_path, ready_timeout_s=240
        )
        with up, urllib.request.urlopen(up.url + "/v1/models", timeout=10) as resp:
            assert resp.status == 200
