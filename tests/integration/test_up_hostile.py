"""`llmgw up` given hostile input or lifecycle events: refused in one line before anything
starts, or stopped with nothing left running (real processes)."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from llmgw.testing.procs import free_port, llmgw_argv, up_engine_ports
from tests.integration.test_up_cli import ports, procs_of, running_up, up

pytestmark = pytest.mark.timeout(180)

NODE = "nodes: [{prefix: n, gpus: 1xH100-80G}]\n"


def read_to_ready(proc: subprocess.Popen[str]) -> str:
    """`up`'s output up to its ready line (asserted)."""
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("llmgw-ready"):
            return "".join(seen)
    raise AssertionError("".join(seen))


class TestRefusedBeforeStart:
    """Input a program would refuse (or choke on) later is refused before anything starts."""

    @pytest.mark.parametrize(
        ("fleet", "args", "code", "said"),
        [
            (NODE.replace("1xH100", "0xH100"), (), 2, "at least 1"),
            (NODE.replace("1xH100", "99999999999999999999xH100"), (), 2, "at most 1024"),
            (NODE.replace("}]", ", fabric: '--help'}]"), (), 2, "fabric"),
            (NODE.replace("}]", ", labels: {'a=b': c}}]"), (), 2, "'a=b'"),
            (NODE.replace("1xH100-80G", "1xFOO"), (), 2, "write it like FOO-80G"),
            (NODE, ("--token", "a\nb"), 2, "--token must be printable ASCII"),
            (NODE, ("--token", " abc"), 2, "--token must be printable ASCII"),
            (NODE, ("--controller-port", "0"), 1, "--controller-port 0"),
        ],
    )
    def test_one_line_and_nothing_started(
        self, up_folder: Path, fleet: str, args: tuple[str, ...], code: int, said: str
    ) -> None:
        """Each: its exit code, one line saying what, no logs folder, no process."""
        (up_folder / "fleet.yaml").write_text(fleet)
        given = ["--port", str(free_port()), *up_engine_ports()]
        if "--controller-port" not in args:
            given += ["--controller-port", str(free_port())]
        out = up(up_folder, *given, *args)
        assert out.returncode == code, out.stderr
        assert out.stderr.count("\n") == 1, out.stderr
        assert said in out.stderr
        assert not (up_folder / ".llmgw" / "logs").exists()
        assert procs_of(up_folder) == []

    def test_state_entries_of_the_wrong_kind(self, up_folder: Path) -> None:
        """A folder where up.json goes, a file where logs go, a token no header can carry."""
        state = up_folder / ".llmgw"
        # (entry, its text; None: a folder, what the refusal says)
        for entry, text, said in [
            ("up.json", None, "up.json is a folder"),
            ("logs", "x", "logs is not a folder"),
            ("tokens/admin", "€uro\n", "printable ASCII"),
        ]:
            subprocess.run(["rm", "-rf", str(state)], check=True)
            (state / "tokens").mkdir(parents=True)
            if text is None:
                (state / entry).mkdir()
            else:
                (state / entry).write_text(text)
            out = up(up_folder, *ports())
            assert out.returncode == 1, out.stderr
            assert out.stderr.count("\n") == 1, out.stderr
            assert said in out.stderr
            assert "Traceback" not in out.stderr
            assert procs_of(up_folder) == []


class TestGoneReader:
    """A reader of up's output gone before the Ctrl-C does not keep up from stopping."""

    def test_closed_stdout_then_ctrl_c_stops_everything(self, up_folder: Path) -> None:
        """`up | tee`, Ctrl-C: tee is gone when up says "stopping…"; every program stops."""
        with running_up(up_folder) as proc:
            read_to_ready(proc)
            assert len(procs_of(up_folder)) >= 4  # up, controller, router, agent
            assert proc.stdout is not None
            proc.stdout.close()
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=90) == 0
        assert procs_of(up_folder) == []
        assert not (up_folder / ".llmgw" / "up.json").exists()


class TestRestartAfterKill:
    """The next `up` in a folder stops what a killed `up` left running, then starts."""

    def test_kill_9_then_up_again(self, up_folder: Path) -> None:
        """kill -9 leaves every program running; the next up stops them, runs, stops clean."""
        with running_up(up_folder) as first:
            read_to_ready(first)
            manifest = json.loads((up_folder / ".llmgw" / "up.json").read_text())
            old = {c["pid"] for c in manifest["children"].values()}
            first.kill()
            first.wait(timeout=30)
        # Each in a session of its own: none saw up die.
        assert old <= set(procs_of(up_folder))
        with running_up(up_folder) as second:
            said = read_to_ready(second)
            assert "the last llmgw up here was killed; stopped the 3 program(s)" in said
            assert not old & set(procs_of(up_folder))
            second.send_signal(signal.SIGINT)
            assert second.wait(timeout=90) == 0
        assert procs_of(up_folder) == []


class TestEarlyCtrlC:
    """A Ctrl-C before up set its handlers ends it quietly with 130."""

    def test_ctrl_c_while_importing(self, up_folder: Path) -> None:
        """SIGINT as the interpreter starts: 130, a clean stop or the signal, never a traceback."""
        with subprocess.Popen(
            llmgw_argv("up", "--quiet", "--fleet", "fleet.yaml", *ports()),
            cwd=up_folder,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        ) as proc:
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=60)
        # Timing decides which path the signal meets; neither may print a traceback.
        assert proc.returncode in (0, 130, -signal.SIGINT), err
        assert "Traceback" not in err
        assert procs_of(up_folder) == []
