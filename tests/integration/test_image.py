"""scripts/build-image: the container image builds, and the router in it answers.

Opt-in (`LLMGW_TEST_IMAGE=1`): the build takes minutes the first time (debootstrap
of a Debian root, cached after under ~/.cache/llmgw/image/) and a minute or two
after, too long for every CI run on two cores (docs/testing.md). It needs root,
buildah and debootstrap (scripts/build-image exits 2 and the test skips, with the
script's reason, without them); running the image needs podman, and skips, saying
why, where podman cannot start a container here ($LLMGW_TEST_PODMAN_ARGS adds options
to each `podman run`, for a host that needs some: docs/container.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.router.compiled import MODULES
from llmgw.testing import free_port

from .controller_harness import wait_for
from .router_fixtures import base_config, write_config

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build-image"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(
        os.environ.get("LLMGW_TEST_IMAGE") != "1",
        reason="opt-in: LLMGW_TEST_IMAGE=1 builds the container image (minutes)",
    ),
]


def _run(*argv: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)


def _podman_run(*args: str) -> subprocess.CompletedProcess[str]:
    """`podman run -d`, with $LLMGW_TEST_PODMAN_ARGS (a host whose default runtime or
    limits refuse every container: `--runtime runc --ulimit nofile=N:N`, docs/container.md)."""
    extra = shlex.split(os.environ.get("LLMGW_TEST_PODMAN_ARGS", ""))
    started = _run("podman", "run", "-d", *extra, *args)
    if started.returncode != 0:
        pytest.skip(f"podman cannot run a container here: {started.stderr.strip()[-300:]}")
    return started


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    name = f"localhost/llmgw-test:{os.getpid()}"
    done = _run(sys.executable, str(SCRIPT), "--name", name, timeout_s=1500)
    if done.returncode == 2:
        pytest.skip(done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip() == name
    try:
        yield name
    finally:
        _run("buildah", "rmi", "-f", name)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        text: str = resp.read().decode()
    return text


class TestImage:
    """The image is built from Debian's packages and llmgw's wheel, and serves."""

    def test_settings(self, image: str) -> None:
        """Entrypoint, user, ports and labels are what docs/container.md says."""
        done = _run("buildah", "inspect", "--type", "image", image)
        assert done.returncode == 0, done.stderr
        config = json.loads(done.stdout)["OCIv1"]["config"]
        assert config["Entrypoint"] == ["/opt/llmgw/bin/llmgw"]
        assert config["User"] == "llmgw"
        assert set(config["ExposedPorts"]) == {"8080/tcp", "8081/tcp"}
        assert config["Labels"]["org.opencontainers.image.licenses"] == "Apache-2.0"

    def test_user_and_folders(self, image: str) -> None:
        """The llmgw user and group are both 10001 (what a mounted file's owner must be),
        and it owns its state folder."""
        ctr = _run("buildah", "from", image).stdout.strip()
        assert ctr
        try:
            done = _run(
                "buildah", "run", "--isolation", "chroot", ctr, "--", "sh", "-c",
                "id -u llmgw; id -g llmgw; stat -c '%n %u:%g %a' /var/lib/llmgw /etc/llmgw",
            )  # fmt: skip
        finally:
            _run("buildah", "rm", ctr)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [
            "10001",
            "10001",
            "/var/lib/llmgw 10001:10001 700",
            "/etc/llmgw 0:10001 755",
        ]

    def test_router_runs_compiled_in_the_image(self, image: str, tmp_path: Path) -> None:
        """The image's router, run by buildah in the image's root as its user, answers
        and runs compiled (chroot isolation: no OCI runtime or cgroups needed)."""
        config = write_config(tmp_path / "router.yaml", base_config(endpoints=[]))
        config.chmod(0o644)
        ctr = _run("buildah", "from", image).stdout.strip()
        assert ctr
        port = free_port()
        router = subprocess.Popen(
            [
                "buildah", "run", "--isolation", "chroot", "--network", "host",
                "--user", "llmgw", "-v", f"{config}:/etc/llmgw/router.yaml:ro", ctr, "--",
                "/opt/llmgw/bin/llmgw", "router", "--config", "/etc/llmgw/router.yaml",
                "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        try:
            self._check_router(port)
        finally:
            # The router is buildah's child: its whole process group goes.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(router.pid, signal.SIGKILL)
            router.wait(timeout=30)
            _run("buildah", "rm", ctr)

    def test_router_answers_under_podman(self, image: str, tmp_path: Path) -> None:
        """`podman run` of the image's router answers, where podman can run containers."""
        config = write_config(tmp_path / "router.yaml", base_config(endpoints=[]))
        config.chmod(0o644)
        port = free_port()
        name = f"llmgw-test-{os.getpid()}"
        _podman_run(
            "--rm", "--name", name, "--network", "host",
            "-v", f"{config}:/etc/llmgw/router.yaml:ro", image,
            "router", "--config", "/etc/llmgw/router.yaml", "--host", "127.0.0.1",
            "--port", str(port), "--workers", "1",
        )  # fmt: skip
        try:
            self._check_router(port)
        finally:
            _run("podman", "rm", "-f", name)

    def test_controller_as_the_docs_run_it(self, image: str, tmp_path: Path) -> None:
        """docs/container.md's controller: its token a podman secret made from a root-only
        file (as docs/systemd.md writes it), its database on a named volume."""
        token = tmp_path / "controller-token"
        token.write_text(secrets.token_urlsafe(32) + "\n")
        token.chmod(0o600)
        name = f"llmgw-test-ctl-{os.getpid()}"
        assert _run("podman", "secret", "create", name, str(token)).returncode == 0
        port = free_port()
        try:
            _podman_run(
                "--name", name, "--network", "host", "-v", f"{name}:/var/lib/llmgw",
                "--secret", f"{name},uid=10001,mode=0400",
                "-e", f"LLMGW_CONTROLLER_TOKEN_FILE=/run/secrets/{name}", image,
                "controller", "--host", "127.0.0.1", "--port", str(port),
                "--database", "sqlite:////var/lib/llmgw/controller.db",
            )  # fmt: skip
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/admin/status",
                headers={"Authorization": f"Bearer {token.read_text().strip()}"},
            )

            def status() -> int:
                if _run("podman", "container", "exists", name).returncode != 0:
                    raise AssertionError("the controller's container is gone")
                with urllib.request.urlopen(req, timeout=5) as resp:
                    return int(resp.status)

            try:
                assert wait_for(status, timeout_s=60, what="the controller") == 200
            except AssertionError:
                raise AssertionError(_run("podman", "logs", name).stderr[-2000:]) from None
        finally:
            _run("podman", "rm", "-f", name)
            _run("podman", "secret", "rm", name)
            _run("podman", "volume", "rm", "-f", name)

    def _check_router(self, port: int) -> None:
        url = f"http://127.0.0.1:{port}"
        metrics = wait_for(lambda: _get(url + "/metrics"), timeout_s=60, what="the router")
        assert _get(url + "/healthz")
        for module in MODULES:
            assert f'llmgw_router_compiled{{module="{module}"}} 1.0' in metrics, module
