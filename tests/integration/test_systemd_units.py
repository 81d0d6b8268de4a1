"""The systemd units in deploy/systemd/ verify cleanly, and their exposure is what the docs say.

`systemd-analyze` reads the unit files without a running systemd. Each unit's
`ExecStart=` names /opt/llmgw/bin/llmgw; the test points it at this
interpreter's `llmgw` so `verify` can check that the command exists.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNITS = sorted((ROOT / "deploy" / "systemd").glob("*.service"))
DOC = ROOT / "docs" / "systemd.md"
INSTALLED = "/opt/llmgw/bin/llmgw"
ANALYZE = shutil.which("systemd-analyze")

pytestmark = pytest.mark.skipif(
    ANALYZE is None, reason="systemd-analyze is not installed (Debian package systemd)"
)


def _here(unit: Path, into: Path) -> Path:
    """A copy of `unit` that runs this checkout's llmgw."""
    llmgw = Path(sys.executable).parent / "llmgw"
    out = into / unit.name
    out.write_text(unit.read_text().replace(INSTALLED, str(llmgw)))
    return out


def _analyze(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert ANALYZE is not None
    return subprocess.run(
        [ANALYZE, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


def _documented() -> dict[str, str]:
    text = DOC.read_text()
    table = text.split("<!-- security:", 1)[1]
    return dict(re.findall(r"^\| (llmgw-\S+\.service) \| ([\d.]+) \|$", table, re.M))


def _versions() -> tuple[str, str]:
    """The systemd version the docs' scores are from, and this machine's."""
    found = re.search(r"<!-- security:.*?systemd (\d+)", DOC.read_text())
    assert found, "docs/systemd.md's security table names no systemd version"
    here = re.match(r"systemd (\d+)", _analyze("--version", cwd=ROOT).stdout)
    return found.group(1), here.group(1) if here else "?"


class TestUnits:
    """Every unit file is valid, and hardened as far as its program allows."""

    def test_there_are_three(self) -> None:
        """The controller, the router and the agent each have a unit."""
        assert [u.name for u in UNITS] == [
            "llmgw-agent.service",
            "llmgw-controller.service",
            "llmgw-router.service",
        ]

    @pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
    def test_verify_is_silent(self, unit: Path, tmp_path: Path) -> None:
        """`systemd-analyze verify` exits 0 and prints nothing (it only warns on bad keys)."""
        _here(unit, tmp_path)
        done = _analyze("verify", f"./{unit.name}", cwd=tmp_path)
        assert (done.returncode, done.stderr, done.stdout) == (0, "", "")

    def test_verify_catches_a_bad_key(self, tmp_path: Path) -> None:
        """The check above can fail: a misspelt setting is reported."""
        unit = _here(UNITS[0], tmp_path)
        unit.write_text(unit.read_text().replace("ProtectHome=yes", "ProtectHome=maybe"))
        assert ": maybe" in _analyze("verify", f"./{unit.name}", cwd=tmp_path).stderr

    @pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
    def test_exposure_is_documented(self, unit: Path, tmp_path: Path) -> None:
        """`systemd-analyze security` gives the exposure docs/systemd.md records."""
        documented, here = _versions()
        if documented != here:
            pytest.skip(f"the scores are systemd {documented}'s; this is systemd {here}")
        _here(unit, tmp_path)
        done = _analyze("security", "--offline=yes", f"./{unit.name}", cwd=tmp_path)
        found = re.search(r"Overall exposure level for \S+: ([\d.]+)", done.stdout)
        assert found, done.stdout[-2000:] + done.stderr
        assert _documented().get(unit.name) == found.group(1)

    @pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
    def test_notify_restart_state(self, unit: Path) -> None:
        """Each unit waits for READY=1, restarts, keeps a state folder and a watchdog."""
        text = unit.read_text()
        for line in ("Type=notify", "NoNewPrivileges=yes", "ProtectSystem=strict"):
            assert f"\n{line}\n" in text, line
        for key in ("Restart=", "StateDirectory=", "WatchdogSec=", "PrivateTmp=yes"):
            assert f"\n{key}" in text, key

    def test_agent_engines_outlive_it(self) -> None:
        """Only the agent process is stopped; its engines stay for the next agent."""
        text = (ROOT / "deploy" / "systemd" / "llmgw-agent.service").read_text()
        assert "\nKillMode=process\n" in text
        assert "\nDeviceAllow=char-nvidia* rw\n" in text


class TestSysusers:
    """`systemd-sysusers` with llmgw.sysusers gives every user and group the units name."""

    def test_unit_groups_exist_on_a_bare_system(self, tmp_path: Path) -> None:
        """On a root with only systemd's own basic groups, llmgw.sysusers creates the
        unit's user, and every supplementary group the units name exists after it (a
        missing one fails the unit at start: 216/GROUP)."""
        sysusers = shutil.which("systemd-sysusers")
        basic = Path("/usr/lib/sysusers.d/basic.conf")
        if sysusers is None or not basic.is_file():
            pytest.skip("no systemd-sysusers or its basic.conf here")
        (tmp_path / "etc").mkdir()
        conf = ROOT / "deploy" / "systemd" / "llmgw.sysusers"
        done = subprocess.run(
            [sysusers, f"--root={tmp_path}", str(basic), str(conf)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        groups = {line.split(":")[0] for line in (tmp_path / "etc/group").read_text().split()}
        users = {line.split(":")[0] for line in (tmp_path / "etc/passwd").read_text().splitlines()}
        for unit in UNITS:
            text = unit.read_text()
            for user in re.findall(r"^User=(\S+)$", text, re.M):
                assert user in users, (unit.name, user)
            named = re.findall(r"^(?:Group|SupplementaryGroups)=(.+)$", text, re.M)
            for group in " ".join(named).split():
                assert group in groups, (unit.name, group)
