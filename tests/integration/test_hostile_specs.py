"""Hostile and mistaken model specs against a real controller, `ctl apply -f` and a real agent.

Each is refused with the controller's error shape naming the field (422, or 409 for a
name another model serves), nothing is stored, the controller lives on without a
traceback; `ctl apply` says so and exits non-zero; a real agent's reported policy
refuses at apply the flags it renders itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration.controller_harness import Db, controller, run_ctl, spec
from tests.integration.hostile import no_traceback
from tests.integration.test_agent_controller import AUTH, ControllerRig, agent_rig, ctrl, sim_model
from tests.integration.test_agent_supervision import AgentRig

pytestmark = pytest.mark.timeout(120)

# The fixtures, used by name below.
__all__ = ["agent_rig", "ctrl"]

BIG = "x" * (128 * 1024)

# (body, status, param, words in the message)
REFUSED: list[tuple[Any, int, str, str]] = [
    (spec("m", priority=10**30), 422, "priority", "a number of 31 digits"),
    (spec("m", idle_timeout_s=1e308), 422, "idle_timeout_s", "at most 1e+09 s"),
    (spec("m", sleep_mode=True, weights_gb=1e300), 422, "weights_gb", "at most 1e+06"),
    (spec("m", env={"A\nB": "1"}), 422, "env", "not a variable name"),
    (spec("m", args=[BIG]), 422, "args[0]", "the OS takes at most 131071"),
    (spec("m", env={"A": BIG}), 422, "env.A", "the OS takes at most 131071"),
    (spec("m", args=["y" * 100_000] * 11), 422, "args", "together"),
    (spec("m", source="../models/m"), 422, "source", "'..' part"),
    (spec("m", source="/models/../m"), 422, "source", "'..' part"),
    (spec("m\u043e"), 422, "name", "not a valid name: 1 to 128 characters"),
    (
        [spec("ok"), {"name": "a", "adapter_of": "ok", "source": "/l/../x"}],
        422,
        "[1].source",
        "'..' part",
    ),
    ([spec("ok"), spec("OK")], 422, "[1].name", "differs only in case from 'ok'"),
    ([spec("Base")], 409, "[0].name", "differs only in case from 'base', served by 'base'"),
    ([spec("x", aliases=["LORA"])], 409, "[0].aliases[0]", "served by 'lora'"),
    ({"name": "BASE2", "adapter_of": "base", "source": "/l"}, 409, "[0].name", "'base2'"),
]


class TestRefusedAtTheApi:
    """Each hostile spec is refused in shape, naming its field, with nothing stored."""

    def test_each_refused_naming_the_field_nothing_stored(self, tmp_path: Path) -> None:
        """422 or 409 with the field in `param` and the reason in words; the stored models
        are as they were; one log line each, no traceback."""
        with controller(Db(f"sqlite:///{tmp_path / 'c.db'}")) as c:
            c.post("/admin/models", [spec("base"), spec("base2")])
            c.post("/admin/models", {"name": "lora", "adapter_of": "base", "source": "/l"})

            def stored() -> list[Any]:
                # Specs and adapters only: a tick may fill in why a model is unplaceable.
                return [(m["spec"], m["adapters"]) for m in c.get("/admin/models")]

            before = stored()
            for body, status, param, words in REFUSED:
                err = c.error("POST", "/admin/models", body)
                assert (status, param) == (err.status, err.body["error"]["param"]), err.body
                assert words in err.body["error"]["message"], err.body
                assert len(err.body["error"]["message"]) < 600, err.body
            assert before == stored()
            no_traceback(c.program.log_text())

    def test_a_name_in_other_case_kept_from_before_can_be_applied_again(
        self, tmp_path: Path
    ) -> None:
        """A model's own names may differ in case, and a re-applied unchanged spec passes."""
        with controller(Db(f"sqlite:///{tmp_path / 'c.db'}")) as c:
            c.post("/admin/models", spec("m", aliases=["M"]))
            c.post("/admin/models", spec("m", aliases=["M"], max_replicas=2))
            assert [m["max"] for m in c.get("/admin/models")] == [2]
            err = c.error("POST", "/admin/models", spec("n", aliases=["m2", "M"]))
            assert err.status == 409


class TestCtlApplyFile:
    """`ctl apply -f` refuses the same specs in a YAML or JSON file, exiting non-zero."""

    def test_every_problem_of_a_file_named_and_nothing_sent(self, tmp_path: Path) -> None:
        """One line per problem, each naming the model and the field; exit 1."""
        f = tmp_path / "specs.yaml"
        f.write_text(
            "- {name: m1, engine: sim, gpu_classes: [H100-80G], priority: 100000000000000000000}\n"
            "- {name: m2, engine: sim, gpu_classes: [H100-80G], source: ../x}\n"
            "- {name: m3, engine: sim, gpu_classes: [H100-80G], env: {'A B': x}}\n"
            "- {name: a1, adapter_of: m3, source: /a/../b}\n"
            f"- {{name: m4, engine: sim, gpu_classes: [H100-80G], args: [{BIG}]}}\n"
        )
        j = tmp_path / "specs.json"
        j.write_text(json.dumps([spec("j", idle_timeout_s=1e308)]))
        with controller(Db(f"sqlite:///{tmp_path / 'c.db'}")) as c:
            code, out, err = run_ctl(c, "apply", "-f", str(f))
            assert (code, out) == (1, "")
            lines = err.splitlines()
            assert "5 problem(s) in 5 model spec(s); nothing applied" in lines[0]
            for line, field in zip(
                lines[1:], ["priority", "source", "env", "source", "args[0]"], strict=True
            ):
                assert f": field {field}: " in line, line
            code, out, err = run_ctl(c, "apply", "-f", str(j))
            assert code == 1
            assert "field idle_timeout_s: must be at most 1e+09 s" in err
            assert c.get("/admin/models") == []

    def test_a_name_another_model_serves_in_other_case_is_one_line(self, tmp_path: Path) -> None:
        """The controller's 409 is printed as one line, and ctl exits non-zero."""
        f = tmp_path / "m.yaml"
        f.write_text("name: Base\nengine: sim\ngpu_classes: [H100-80G]\n")
        with controller(Db(f"sqlite:///{tmp_path / 'c.db'}")) as c:
            c.post("/admin/models", spec("base"))
            code, _out, err = run_ctl(c, "apply", "-f", str(f))
            assert code != 0
            assert len(err.strip().splitlines()) == 1, err
            assert "differs only in case from 'base'" in err
            assert [m["name"] for m in c.get("/admin/models")] == ["base"]


class TestAgentPolicyRefusesRenderedFlags:
    """A real agent's policy refuses, at apply, the flags the agent renders itself."""

    async def test_served_names_and_adapter_flags_are_refused(
        self, ctrl: ControllerRig, agent_rig: AgentRig
    ) -> None:
        """--served-model-name, --lora-modules, llama-server's -a: 422 naming the argument."""
        agent_rig.start()
        async with aiohttp.ClientSession(headers=AUTH) as s:
            await ctrl.node_registered(s)
            for args, shown in (
                (["--served-model-name", "other"], "--served-model-name is not allowed"),
                (["--served_model_name=other"], "(read as --served-model-name)"),
                (["--lora-modules", "x=/l"], "--lora-modules is not allowed"),
                (["-a", "other"], "-a is not allowed"),
            ):
                bad = {**sim_model("m"), "args": ["--speed", "10", *args]}
                async with s.post(f"{ctrl.url}/admin/models", json=bad) as resp:
                    body = await resp.json()
                assert resp.status == 422, body
                assert body["error"]["param"] == "[0].args[2]"
                assert shown in body["error"]["message"]
            async with s.get(f"{ctrl.url}/admin/models") as resp:
                assert await resp.json() == []
        assert ctrl.proc is not None
        no_traceback(ctrl.proc.log_text())
