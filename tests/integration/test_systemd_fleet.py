"""The units' command lines, as docs/systemd.md installs them, make a fleet that works.

No systemd runs here (it is not PID 1), so the test does what systemd would with each
unit in deploy/systemd/: it fills in the specifiers (`%S` state, `%C` cache, `%d` the
unit's credentials folder), copies each `LoadCredential=` file into that folder,
sets `Environment=`, creates the state and cache folders, and runs `ExecStart=`'s
command with this checkout's llmgw. The files under /etc/llmgw are the ones the
docs' install steps write (tokens drawn fresh), kept in a temporary folder. The one
change to the units' command lines: each program listens on 127.0.0.1 and a free
port (`--host 127.0.0.1 --port 0` appended; the last flag wins).
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import shlex
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmgw.testing import Program, start_program

from .controller_harness import wait_for

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
DOC = ROOT / "docs" / "systemd.md"
ETC = "/etc/llmgw/"

pytestmark = pytest.mark.slow


def settings(unit: str) -> dict[str, list[str]]:
    """The unit's `[Service]` settings: each key's values, in order."""
    text = (UNITS / unit).read_text().replace("\\\n", " ")
    section, out = "", dict[str, list[str]]()
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line
        elif section == "[Service]":
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def documented_files() -> set[str]:
    """The /etc/llmgw files docs/systemd.md's install steps write."""
    block = DOC.read_text().split("```sh", 1)[1].split("```", 1)[0]
    return set(re.findall(r"tee (/etc/llmgw/[\w.-]+)", block))


class Host:
    """What systemd would give a unit: its folders, credentials and environment."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.etc = root / "etc-llmgw"
        self.etc.mkdir()
        for name in documented_files():
            (self.etc / name.removeprefix(ETC)).write_text(secrets.token_urlsafe(32) + "\n")

    def token(self, name: str) -> str:
        return (self.etc / name).read_text().strip()

    def start(self, unit: str, *extra: str) -> Program:
        s = settings(unit)
        creds = self.root / "credentials" / unit
        creds.mkdir(parents=True)
        for item in s.get("LoadCredential", []):
            name, _, source = item.partition(":")
            shutil.copy(self._etc(source), creds / name)
        for key, base in (("StateDirectory", "state"), ("CacheDirectory", "cache")):
            for name in s.get(key, []):
                (self.root / base / name).mkdir(parents=True, exist_ok=True)
        env = {}
        for item in s.get("Environment", []):
            for pair in shlex.split(self._fill(item, creds)):
                key, _, value = pair.partition("=")
                env[key] = value
        argv = shlex.split(self._fill(s["ExecStart"][0], creds))
        assert argv[0] == "/opt/llmgw/bin/llmgw", argv
        args = [self._etc(a) if a.startswith(ETC) else a for a in argv[1:]]
        cwd = Path(self._fill(s["WorkingDirectory"][0], creds))
        log_dir = self.root / "logs"
        return start_program([*args, *extra], env=env, cwd=cwd, log_dir=log_dir)

    def _fill(self, value: str, creds: Path) -> str:
        for spec, path in (("%S", "state"), ("%C", "cache")):
            value = value.replace(spec, str(self.root / path))
        return value.replace("%d", str(creds))

    def _etc(self, path: str) -> str:
        assert path.startswith(ETC), path
        return str(self.etc / path.removeprefix(ETC))


def _call(url: str, token: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    req = urllib.request.Request(url, data=data, headers=headers)
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def _status(url: str, token: str) -> int:
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"}), timeout=10
        ) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@contextlib.contextmanager
def _running(*programs: Program) -> Iterator[None]:
    try:
        yield
    finally:
        for p in reversed(programs):
            p.stop()


class TestDocumentedInstall:
    """The units and the docs' install steps agree, and the programs they start work."""

    def test_every_credential_is_written_by_the_docs(self) -> None:
        """Each file a unit loads as a credential is one the install steps write."""
        loaded = {
            item.partition(":")[2]
            for unit in sorted(UNITS.glob("*.service"))
            for item in settings(unit.name).get("LoadCredential", [])
        }
        assert loaded, "no unit loads a credential"
        assert loaded <= documented_files(), sorted(loaded - documented_files())

    def test_agents_and_routers_get_scoped_tokens(self, tmp_path: Path) -> None:
        """The controller unit takes the agent token the agent unit sends and a router
        token; an agent registers with it, a router reads its keys, neither is admin."""
        host = Host(tmp_path)
        ctl = host.start("llmgw-controller.service", "--host", "127.0.0.1", "--port", "0")
        with _running(ctl):
            admin = host.token("controller-token")
            agent_file = {"controller": ctl.url, "node": "n1", "gpus": "1xH100-80G"}
            (host.etc / "agent.yaml").write_text(
                yaml.safe_dump({**agent_file, "address": "127.0.0.1"})
            )
            router_token = host.token("router-token")
            (host.etc / "router.yaml").write_text(
                yaml.safe_dump({"controller": {"url": ctl.url, "token": router_token}})
            )
            agent = host.start("llmgw-agent.service")
            router = host.start(
                "llmgw-router.service", "--host", "127.0.0.1", "--port", "0", "--workers", "1"
            )
            with _running(agent, router):

                def nodes() -> list[str]:
                    return [n["name"] for n in _call(ctl.url + "/admin/nodes", admin)]

                wait_for(lambda: nodes() == ["n1"], timeout_s=30, what="the agent's node")
                key = _call(ctl.url + "/admin/keys", admin, {"name": "k1", "team": "t"})["key"]
                models = router.url + "/v1/models"
                wait_for(lambda: _status(models, key) == 200, timeout_s=30, what="the key")
                for scoped in (host.token("agent-token"), router_token):
                    assert _status(ctl.url + "/admin/nodes", scoped) == 403
