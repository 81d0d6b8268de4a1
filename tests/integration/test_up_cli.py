"""`llmgw up` refusals and start-up interruption: one line, non-zero, nothing left running."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.testing.procs import free_port, llmgw_argv, up_engine_ports
from llmgw.testing.wait import wait_until
from tests.integration.test_ctl_controller import ctl

pytestmark = pytest.mark.timeout(120)

# One node, one small model: the least `up` can start.
FLEET = """\
nodes: [{prefix: n, count: 1, gpus: 1xH100-80G}]
sim_args: ["--speed", "20"]
models: [{name: m, engine: sim, gpu_classes: [H100-80G], min_replicas: 1, max_replicas: 1}]
"""


def procs_of(folder: Path) -> list[int]:
    """PIDs of live (non-zombie) processes that name `folder` or run in it.

    Engines name neither the folder nor the state dir, but inherit the cwd `up` ran in.
    """
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        mine = str(folder) in cmd or cwd.startswith(str(folder))
        if mine and stat.rsplit(")", 1)[-1].split()[0] != "Z":
            out.append(int(entry.name))
    return out


def ports() -> list[str]:
    """Both ports given: the controller's default (router port + 1) may be anyone's."""
    return ["--port", str(free_port()), "--controller-port", str(free_port()), *up_engine_ports()]


def up(folder: Path, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        llmgw_argv("up", "--quiet", "--fleet", str(folder / "fleet.yaml"), *args),
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
        check=False,
    )


class TestRefusals:
    """llmgw up's start-up refusals, each in one line."""

    def test_router_port_taken(self, up_folder: Path) -> None:
        """A taken router port: one line naming it and --port, exit 1, nothing started."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            port = s.getsockname()[1]
            out = up(up_folder, "--port", str(port), "--controller-port", str(free_port()))
        assert out.returncode == 1
        assert out.stderr.count("\n") == 1, out.stderr
        assert f"127.0.0.1:{port}" in out.stderr
        assert "--port" in out.stderr
        assert not (up_folder / ".llmgw" / "logs").exists()
        assert procs_of(up_folder) == []

    def test_port_held_after_an_unclean_stop_points_at_the_old_run(self, up_folder: Path) -> None:
        """A manifest up cannot read (so cannot stop what it lists) explains who may hold
        the port."""
        state = up_folder / ".llmgw"
        state.mkdir()
        (state / "up.json").write_text('{"pid": 4242, "children": [')
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            port = s.getsockname()[1]
            out = up(up_folder, "--port", str(port), "--controller-port", str(free_port()))
        assert out.returncode == 1
        assert out.stderr.count("\n") == 1, out.stderr
        assert "did not stop cleanly" in out.stderr
        assert str(state / "up.json") in out.stderr
        # Still there for the operator to read.
        assert (state / "up.json").exists()

    def test_controller_port_taken(self, up_folder: Path) -> None:
        """A taken controller port names --controller-port."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            port = s.getsockname()[1]
            out = up(up_folder, "--port", str(free_port()), "--controller-port", str(port))
        assert out.returncode == 1
        assert out.stderr.count("\n") == 1, out.stderr
        assert "--controller-port" in out.stderr

    def test_second_up_in_the_same_folder(self, up_folder: Path) -> None:
        """While an `up` holds the folder, another one there refuses and touches nothing."""
        state = up_folder / ".llmgw"
        state.mkdir()
        (state / "up.json").write_text("{}")
        with (state / "up.lock").open("a+") as held:
            fcntl.flock(held.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.write("4242\n")
            held.flush()
            out = up(up_folder, *ports())
        assert out.returncode == 1
        assert "already running" in out.stderr
        assert "pid 4242" in out.stderr
        assert out.stderr.count("\n") == 1, out.stderr
        # The running one's manifest is its own: the refused one must not remove it.
        assert (state / "up.json").read_text() == "{}"

    def test_controller_refusing_the_models_is_one_line(self, up_folder: Path) -> None:
        """The controller's own refusal (here: a token `up` does not have) is shown, then exit 1."""
        fleet = up_folder / "fleet.yaml"
        # The fleet's controller_args come last: this token file wins over up's.
        (up_folder / "other-token").write_text("not-given-to-up\n")
        fleet.write_text(FLEET + 'controller_args: ["--token-file", "other-token"]\n')
        out = up(up_folder, *ports())
        assert out.returncode == 1
        assert out.stderr.count("\n") == 1, out.stderr
        assert "the controller refused the fleet's models (401)" in out.stderr
        assert procs_of(up_folder) == []

    def test_bad_fleet_file(self, up_folder: Path) -> None:
        """An invalid fleet file: exit 2, one line naming the file, nothing started."""
        (up_folder / "fleet.yaml").write_text("nodes: [{prefix: n, gpus: eight}]\n")
        out = up(up_folder)
        assert out.returncode == 2
        assert out.stderr.count("\n") == 1, out.stderr
        assert "fleet.yaml" in out.stderr
        assert "gpus" in out.stderr
        assert not (up_folder / ".llmgw").exists()


@contextlib.contextmanager
def running_up(
    folder: Path, env: dict[str, str] | None = None, *, own_group: bool = False
) -> Iterator[subprocess.Popen[str]]:
    """`up` in `folder`, output piped; killed if still running, its pipe always closed.

    `own_group`: in a process group of its own, as a terminal's foreground job is, so a
    test can send a signal to the group as the terminal's Ctrl-C does."""
    with subprocess.Popen(
        llmgw_argv("up", "--quiet", "--fleet", "fleet.yaml", *ports()),
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=own_group,
    ) as proc:
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()


def ctl_json(folder: Path, command: str) -> Any:
    """`llmgw ctl COMMAND --json` against the `up` running in `folder`, with its admin token."""
    url = json.loads((folder / ".llmgw" / "up.json").read_text())["controller_url"]
    token = (folder / ".llmgw" / "tokens" / "admin").read_text().strip()
    done = ctl(url, command, "--json", token=token)
    assert done.code == 0, done.err
    return done.json()


class TestEnginePorts:
    """llmgw up's --engine-ports: where the engines listen, and the ranges it refuses."""

    def test_engines_listen_from_the_first_port_given(self, up_folder: Path) -> None:
        """The one node's engine listens inside FIRST..FIRST+49."""
        first = int(up_engine_ports()[1])
        with running_up(up_folder) as proc:
            until_ready(proc)

            def engine_ports() -> list[int]:
                listed = ctl_json(up_folder, "replicas")
                found = [s["port"] for r in listed for s in r["shards"]]
                return found if found and None not in found else []

            ports = wait_until(engine_ports, timeout_s=60, what="the engine's port", every_s=0.5)
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)
        assert all(first <= p < first + 50 for p in ports), (first, ports)

    def test_a_range_past_65535(self, up_folder: Path) -> None:
        """Engine ports that cannot all exist: exit 2, one line with the range, nothing started."""
        out = up(up_folder, *ports()[:4], "--engine-ports", "65500")
        assert out.returncode == 2
        assert out.stderr.count("\n") == 1, out.stderr
        assert "--engine-ports 65500" in out.stderr
        assert "65500-65549" in out.stderr
        assert not (up_folder / ".llmgw").exists()

    def test_the_routers_port_inside_the_range(self, up_folder: Path) -> None:
        """A router port among the engines' ports is refused, naming both."""
        port = free_port()
        out = up(up_folder, "--port", str(port), "--engine-ports", str(port - 10))
        assert out.returncode == 2
        assert out.stderr.count("\n") == 1, out.stderr
        assert f"the router's port {port} is inside the engines' ports" in out.stderr
        assert procs_of(up_folder) == []


class TestStartOrder:
    """llmgw up places the models on the whole fleet, not on the nodes that came first."""

    def test_every_node_registers_before_a_model_is_applied(self, up_folder: Path) -> None:
        """In the controller's events every node.registered comes before model.applied."""
        (up_folder / "fleet.yaml").write_text(
            FLEET.replace("count: 1, gpus: 1xH100-80G", "count: 6, gpus: 1xH100-80G")
        )
        with running_up(up_folder) as proc:
            until_ready(proc)
            events = ctl_json(up_folder, "events")
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)
        kinds = [e["kind"] for e in events]
        registered = [i for i, k in enumerate(kinds) if k == "node.registered"]
        assert len(registered) == 6, kinds
        assert "model.applied" in kinds, kinds
        assert max(registered) < kinds.index("model.applied"), kinds


class TestInterrupt:
    """Ctrl-C during start-up leaves nothing running."""

    def test_ctrl_c_during_start_up_leaves_nothing(self, up_folder: Path) -> None:
        """SIGINT while programs are still starting: `up` stops at once, exits 0, no orphans."""
        with running_up(up_folder) as proc:
            # The controller is the first program: once its log exists, start-up is under way.
            log = up_folder / ".llmgw" / "logs" / "controller.log"
            wait_until(log.exists, timeout_s=60, what="the controller's log")
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        assert "llmgw is up" not in out
        assert "llmgw-ready" not in out
        assert "stopped" in out
        assert procs_of(up_folder) == []

    def test_ctrl_c_while_an_agent_is_down_stops_its_engines(self, up_folder: Path) -> None:
        """An engine whose agent died (and is not back yet) is still stopped by Ctrl-C."""
        with running_up(up_folder) as proc:
            assert proc.stdout is not None
            seen = []
            for line in proc.stdout:
                seen.append(line)
                if line.startswith("llmgw-ready"):
                    break
            last = seen[-1] if seen else ""
            assert last.startswith("llmgw-ready"), "".join(seen)
            state = until_engine_recorded(up_folder)
            engine = json.loads(state.read_text())["shards"][0]["pid"]
            manifest = json.loads((up_folder / ".llmgw" / "up.json").read_text())
            os.kill(manifest["children"]["agent n-1"]["pid"], signal.SIGKILL)
            # `up` says it saw the agent die; its restart waits a second: Ctrl-C now.
            for line in proc.stdout:
                seen.append(line)
                if line.startswith("llmgw up: agent n-1 exited"):
                    break
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        assert engine not in procs_of(up_folder)
        assert procs_of(up_folder) == []

    def test_second_ctrl_c_while_stopping_a_dead_agents_engines(self, up_folder: Path) -> None:
        """A second Ctrl-C at the terminal while `up` stops the engines of an agent that died
        leaves that stop to finish: no traceback, nothing left running."""
        with running_up(up_folder, own_group=True) as proc:
            assert proc.stdout is not None
            until_ready(proc)
            until_engine_recorded(up_folder)
            manifest = json.loads((up_folder / ".llmgw" / "up.json").read_text())
            os.kill(manifest["children"]["agent n-1"]["pid"], signal.SIGKILL)
            for line in proc.stdout:
                if line.startswith("llmgw up: agent n-1 exited"):
                    break
            # The terminal's Ctrl-C goes to its whole foreground process group.
            os.killpg(proc.pid, signal.SIGINT)

            def stopper() -> bool:
                for pid in procs_of(up_folder):
                    with contextlib.suppress(OSError):
                        if b"stop-engines" in Path(f"/proc/{pid}/cmdline").read_bytes():
                            return True
                return False

            wait_until(stopper, timeout_s=60, every_s=0.01, what="up stopping leftover engines")
            os.killpg(proc.pid, signal.SIGINT)
            out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        assert "Traceback" not in out
        assert "stop-engines exited" not in out
        assert procs_of(up_folder) == []

    def test_hangup_stops_everything(self, up_folder: Path) -> None:
        """SIGHUP (its terminal closed) stops `up` as Ctrl-C does: exit 0, engines included."""
        with running_up(up_folder) as proc:
            until_ready(proc)
            until_engine_recorded(up_folder)
            proc.send_signal(signal.SIGHUP)
            out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        assert "llmgw up: stopped" in out
        assert procs_of(up_folder) == []


def until_engine_recorded(folder: Path) -> Path:
    """The agent n-1's state file, once it records an engine's pid."""
    state = folder / ".llmgw" / "agents" / "n-1" / "agent-state.json"
    wait_until(
        lambda: state.exists() and '"pid"' in state.read_text(),
        timeout_s=60,
        every_s=0.1,
        what="the agent's state file with an engine pid",
    )
    return state


def until_ready(proc: subprocess.Popen[str]) -> str:
    """What `up` printed up to its ready line (asserted)."""
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("llmgw-ready"):
            break
    out = "".join(seen)
    assert seen, out
    assert seen[-1].startswith("llmgw-ready"), out
    return out


def models_line(out: str) -> list[str]:
    line = next(x for x in out.splitlines() if x.strip().startswith("models "))
    return [m.strip() for m in line.split(None, 1)[1].split(",")]


class TestHints:
    """llmgw up's hints after a restart."""

    def test_curl_example_and_models_from_the_controller_after_a_restart(
        self, up_folder: Path
    ) -> None:
        """The hints give curl always, openai only when importable, and the controller's
        models, with one added by `ctl apply` still there after `up` restarts."""
        # The controller keeps that model in its store; the fleet file does not name it.
        with running_up(up_folder) as proc:
            out = until_ready(proc)
            assert "curl -s http://127.0.0.1:" in out
            assert '"model": "m"' in out  # m has a ready replica
            assert "import openai" in out  # importable in the test's interpreter
            assert models_line(out) == ["m"]
            url = json.loads((up_folder / ".llmgw" / "up.json").read_text())["controller_url"]
            (up_folder / "extra.yaml").write_text(
                "name: m-extra\nengine: sim\ngpu_classes: [H100-80G]\nmin_replicas: 0\n"
            )
            applied = subprocess.run(
                llmgw_argv("ctl", "--controller", url, "apply", "-f", "extra.yaml"),
                cwd=up_folder,
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            assert applied.returncode == 0, applied.stderr
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)
        assert proc.returncode == 0
        # An `openai` that cannot be imported: the snippet is left out, curl stays.
        blocker = up_folder / "no-openai" / "openai"
        blocker.mkdir(parents=True)
        (blocker / "__init__.py").write_text('raise ImportError("not installed here")\n')
        env = {**os.environ, "PYTHONPATH": str(up_folder / "no-openai")}
        with running_up(up_folder, env=env) as proc:
            out = until_ready(proc)
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)
        assert sorted(models_line(out)) == ["m", "m-extra"]
        assert "curl -s http://127.0.0.1:" in out
        assert "openai" not in out


class TestTokens:
    """Scoped tokens are in 0600 files, never on a command line."""

    def test_scoped_tokens_in_0600_files_never_on_a_command_line(self, up_folder: Path) -> None:
        """`up` draws admin, agent, router and read tokens into .llmgw/tokens (0600), gives
        them to its programs by file, and none is in any process's command line; ctl in the
        same folder finds the admin token by itself, and the controller wants one."""
        import stat
        import urllib.error
        import urllib.request

        with running_up(up_folder) as proc:
            out = until_ready(proc)
            state = up_folder / ".llmgw"
            tokens_dir = state / "tokens"
            assert stat.S_IMODE(tokens_dir.stat().st_mode) == 0o700
            tokens = {}
            for kind in ("admin", "agent", "router", "read"):
                path = tokens_dir / kind
                assert stat.S_IMODE(path.stat().st_mode) == 0o600, kind
                tokens[kind] = path.read_text().strip()
                assert len(tokens[kind]) >= 32
            assert len(set(tokens.values())) == 4
            for name in ("router.yaml", "up.json"):
                assert stat.S_IMODE((state / name).stat().st_mode) == 0o600, name
            # The hints never print the admin token (the status link has the read one).
            assert tokens["admin"] not in out
            manifest = json.loads((state / "up.json").read_text())
            assert manifest["status_url"].endswith(f"/status#token={tokens['read']}")
            url = manifest["controller_url"]
            # The tokens are in force: no token is refused, a scoped one may not apply.
            for token in (None, tokens["agent"], tokens["router"], tokens["read"]):
                req = urllib.request.Request(url + "/admin/models", data=b"[]", method="POST")
                if token:
                    req.add_header("Authorization", f"Bearer {token}")
                with pytest.raises(urllib.error.HTTPError) as err:
                    urllib.request.urlopen(req, timeout=10)
                err.value.close()
                assert err.value.code in (401, 403)

            def engine_pids() -> list[int]:
                listed = subprocess.run(
                    llmgw_argv("ctl", "--controller", url, "replicas", "--json"),
                    cwd=up_folder,
                    capture_output=True,
                    text=True,
                    timeout=30,
                    check=False,
                    env={k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")},
                )
                assert listed.returncode == 0, listed.stderr
                replicas = json.loads(listed.stdout)
                return [s["pid"] for r in replicas for s in r["shards"] if s.get("pid")]

            # ctl in up's folder needs no setting; wait for the model's engine.
            engines = wait_until(engine_pids, timeout_s=90, every_s=0.3, what="an engine started")
            pids = [manifest["pid"], *(c["pid"] for c in manifest["children"].values())]
            assert len(manifest["children"]) >= 3  # controller, router, an agent
            checked = 0
            for pid in [*pids, *engines]:
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
                except OSError:
                    continue
                checked += 1
                for kind, token in tokens.items():
                    assert token not in cmdline, f"the {kind} token is in pid {pid}'s cmdline"
            assert checked == len(pids) + len(engines)
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)
        assert proc.returncode == 0
