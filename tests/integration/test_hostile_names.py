"""Names are data: a real controller refuses hostile names where they enter, and the real
`llmgw ctl` shows hostile free text without obeying it (issue 34, items 2, 3 and 10).

One controller process (SQLite in the test's folder); heartbeats posted as an agent
would; ctl run as its own process, piped and with `-o table`, exactly as a shell runs it.
"""

from __future__ import annotations

import subprocess
import sys
import unicodedata
from pathlib import Path
from typing import Any

import pytest

from tests.integration.controller_harness import Controller, Db, controller, gpus, spec
from tests.integration.hostile import no_traceback

pytestmark = pytest.mark.timeout(120)

TOKEN = "names-token"
# Clear screen, an OSC-8 link, a colour, a right-to-left override, markup rich cannot parse.
HOSTILE = "\x1b[2J\x1b]8;;https:e.vil\x07x\x1b]8;;\x07\x1b[31m\u202eevil [/]"


def heartbeat(node: str, **kw: Any) -> dict[str, Any]:
    hb: dict[str, Any] = {
        "node": node,
        "address": "127.0.0.1",
        "gpus": gpus(2),
        "fabrics": ["ib0"],
        "agent_started_at": 1.0,
    }
    hb.update(kw)
    return hb


def ctl(c: Controller, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "LLMGW_CONTROLLER": c.url, "LLMGW_TOKEN": TOKEN}
    env["XDG_CONFIG_HOME"] = "/nonexistent"
    return subprocess.run(
        [sys.executable, "-m", "llmgw", "ctl", *argv],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )


def hidden(text: str) -> list[str]:
    """Characters a terminal acts on or a reader cannot see (tabs and line ends aside)."""
    return [ch for ch in text if ch not in "\t\n" and unicodedata.category(ch) in ("Cc", "Cf")]


@pytest.fixture
def ctrl(tmp_path: Path) -> Any:
    with controller(Db(f"sqlite:///{tmp_path}/c.db"), token=TOKEN, log_dir=tmp_path) as c:
        yield c


class TestRefusedWhereTheyEnter:
    """Hostile names are refused where they enter the controller."""

    @pytest.mark.parametrize(
        ("url_node", "body", "param"),
        [
            ("..", heartbeat(".."), "node"),
            ("n%00", heartbeat("n\x00"), "node"),
            ("n%1b", heartbeat("n\x1b"), "node"),
            ("n%E2%80%AE", heartbeat("n\u202e"), "node"),
            ("n1", heartbeat("n1", fabrics=["[/]"]), "fabrics[0]"),
            ("n1", heartbeat("n1", address="evil.example@127.0.0.1"), "address"),
            ("n1", heartbeat("n1", address="h\x1b[2J"), "address"),
            (
                "n1",
                heartbeat("n1", gpus=[{**gpus(1)[0], "gpu_class": "H100\x1b[31m"}]),
                "gpus[0].gpu_class",
            ),
        ],
    )
    def test_heartbeat_refused_in_shape(
        self, ctrl: Controller, url_node: str, body: dict[str, Any], param: str
    ) -> None:
        """A heartbeat naming a node, fabric or GPU class outside the set is a 422 naming the
        field, and no node is registered."""
        err = ctrl.error("POST", f"/v1/agents/{url_node}/heartbeat", body)
        assert err.status == 422
        assert param == err.body["error"]["param"]
        assert "is not a valid" in err.body["error"]["message"]
        assert ctrl.get("/admin/nodes") == []

    def test_spec_gpu_class_refused(self, ctrl: Controller) -> None:
        """A model spec asking for a GPU class outside the set is a 422; nothing is applied."""
        err = ctrl.error("POST", "/admin/models", spec("m", gpu_classes=["H100-80G", "[/]"]))
        assert (err.status, err.body["error"]["param"]) == (422, "gpu_classes[1]")
        assert ctrl.get("/admin/models") == []

    @pytest.mark.parametrize(
        ("path", "body", "param"),
        [
            ("/admin/models", spec("a/../b"), "name"),
            ("/admin/models", [spec("ok"), spec("m", aliases=["x/./y"])], "[1].aliases[0]"),
            ("/admin/models", {"name": "a//b", "adapter_of": "ok", "source": "/a"}, "name"),
            ("/admin/models", {"name": "ad", "adapter_of": "ok/..", "source": "/a"}, "adapter_of"),
            ("/admin/keys", {"name": "k", "team": "t", "models": ["ok", "a/"]}, "models[1]"),
        ],
    )
    def test_names_a_url_would_resolve_refused(
        self, ctrl: Controller, path: str, body: Any, param: str
    ) -> None:
        """A model, alias, adapter or key's model whose `/` segment is `.`, `..` or empty
        (which curl and proxies resolve or collapse in /admin/models/<name>) is a 422
        naming the field, and nothing is applied."""
        ctrl.post("/admin/models", spec("ok"))
        err = ctrl.error("POST", path, body)
        assert (err.status, err.body["error"]["param"]) == (422, param)
        assert [m["name"] for m in ctrl.get("/admin/models")] == ["ok"]
        assert ctrl.get("/admin/keys") == []

    @pytest.mark.parametrize(
        ("entry", "param"),
        [
            ({"args": ["--x", "1", "a\x00b"]}, "[1].args[2]"),
            ({"source": "/models/m\x1b[2J"}, "[1].source"),
            ({"env": {"A": "1\x00"}}, "[1].env.A"),
            ({"env": {"A=B": "1"}}, "[1].env"),
            ({"env_from": {"T": {"file": "/run/t\x00"}}}, "[1].env_from.T.file"),
        ],
    )
    def test_spec_string_no_engine_can_be_given_refused(
        self, ctrl: Controller, entry: dict[str, Any], param: str
    ) -> None:
        """A spec with a NUL in what the agent puts in an engine's command line or
        environment (or a control character in a path) is a 422 naming the field, and
        neither spec of the request is applied."""
        body = [spec("ok"), spec("m", **entry)]
        err = ctrl.error("POST", "/admin/models", body)
        assert (err.status, err.body["error"]["param"]) == (422, param)
        assert "nothing was applied" in err.body["error"]["message"]
        assert ctrl.get("/admin/models") == []

    def test_line_ends_in_args_and_env_values_pass(self, ctrl: Controller) -> None:
        """A newline in an argument or an environment value is applied as given."""
        entry = {"args": ["--chat-template", "{{ a }}\n{{ b }}"], "env": {"PEM": "x\ny\n"}}
        ctrl.post("/admin/models", spec("m", **entry))
        (model,) = ctrl.get("/admin/models")
        assert (model["spec"]["args"], model["spec"]["env"]) == (entry["args"], entry["env"])

    def test_a_good_heartbeat_still_registers(self, ctrl: Controller) -> None:
        """Host names, fabrics and classes as agents report them pass."""
        ctrl.post("/v1/agents/gpu-01.example.com/heartbeat", heartbeat("gpu-01.example.com"))
        assert [n["name"] for n in ctrl.get("/admin/nodes")] == ["gpu-01.example.com"]


class TestCtlShowsFreeText:
    """ctl shows free text, never obeys it."""

    def test_gpu_reason_shown_not_obeyed(self, ctrl: Controller) -> None:
        """An agent's free text (a GPU's unhealthy reason) reaches `ctl events` and `ctl
        nodes` as visible escapes, piped and as a table, exit 0."""
        ctrl.post("/v1/agents/n1/heartbeat", heartbeat("n1"))
        sick = [{**g, "healthy": g["index"] != 1, "reason": HOSTILE} for g in gpus(2)]
        sick[0]["reason"] = None
        ctrl.post("/v1/agents/n1/heartbeat", heartbeat("n1", gpus=sick))
        events = ctrl.get("/admin/events")
        assert any(HOSTILE in e["message"] for e in events), events
        last = str(events[-1]["id"])
        for argv in (
            ["events"],
            ["events", "-o", "table"],
            ["events", "-o", "tsv"],
            ["events", "--detail", last],
            ["nodes"],
            ["nodes", "-o", "table"],
            ["status", "-o", "table"],
        ):
            proc = ctl(ctrl, *argv)
            assert proc.returncode == 0, (argv, proc.stderr)
            assert hidden(proc.stdout) == [], argv
            no_traceback(proc.stderr)
        detail = ctl(ctrl, "events", "--detail", last).stdout
        assert "\\x1b[2J\\x1b]8;;https:e.vil\\x07x\\x1b]8;;\\x07\\x1b[31m\\u202eevil [/]" in detail


class TestCtlApplyFile:
    """ctl apply refuses bad files in one line."""

    def test_lone_surrogate_one_line_exit_1(self, ctrl: Controller, tmp_path: Path) -> None:
        """`ctl apply -f` with a `\\ud83d` escape exits 1 with one line, nothing applied."""
        f = tmp_path / "m.yaml"
        f.write_text('name: m\nengine: sim\ngpu_classes: [H100-80G]\nargs: ["\\ud83d"]\n')
        proc = ctl(ctrl, "apply", "-f", str(f))
        assert proc.returncode == 1
        assert proc.stderr.count("\n") == 1, proc.stderr
        assert "not valid YAML at line 4: found invalid Unicode" in proc.stderr
        no_traceback(proc.stderr)
        assert ctrl.get("/admin/models") == []

    def test_bad_gpu_class_refused_locally(self, ctrl: Controller) -> None:
        """`ctl apply` refuses a GPU class outside the set before sending, naming the field."""
        proc = ctl(ctrl, "apply", "-f", "-", stdin="name: m\nengine: sim\ngpu_classes: ['[/]']\n")
        assert proc.returncode == 1
        assert "field gpu_classes[0]" in proc.stderr, proc.stderr
        no_traceback(proc.stderr)
