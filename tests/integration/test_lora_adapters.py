"""LoRA adapters as models, end to end: the real controller, agent, sim-engines and router,
and the real openai client (docs/sleep-and-adapters.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from llmgw.testing import Program
from tests.integration.controller_harness import wait_for
from tests.integration.router_fixtures import base_config, get_json, router
from tests.integration.test_agent_controller import TOKEN, ControllerRig
from tests.integration.test_agent_supervision import AgentRig
from tests.integration.test_ctl_controller import ctl
from tests.integration.test_hostile_controller import call

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]


def base_spec(**kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": "base",
        "engine": "sim",
        "gpu_classes": ["H100-80G"],
        "min_replicas": 2,
        "max_replicas": 2,
        "args": ["--speed", "20", "--lora-load-ms", "200"],
    }
    out.update(kw)
    return out


def adapter(name: str, base: str = "base") -> dict[str, Any]:
    return {"name": name, "adapter_of": base, "source": f"/adapters/{name}"}


class Fleet:
    """A controller, one agent with two fake H100s, and a router following the controller."""

    def __init__(self, ctrl: ControllerRig, agent: AgentRig, router: Program) -> None:
        self.ctrl = ctrl
        self.agent = agent
        self.router = router
        self.client = openai.OpenAI(base_url=f"{router.url}/v1", api_key="none", max_retries=0)

    def admin(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        raw = None if body is None else json.dumps(body).encode()
        status, _, data = call(self.ctrl.url, method, path, raw, token=TOKEN)
        return status, data

    def router_models(self) -> set[str]:
        return {m["id"] for m in get_json(f"{self.router.url}/v1/models")["data"]}

    def endpoints_serving(self, name: str) -> list[str]:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        eps = get_json(f"{self.ctrl.url}/v1/endpoints", headers=auth)
        return sorted(e["id"] for e in eps["endpoints"] if name in e["models"])


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    ctrl = ControllerRig(tmp_path)
    ctrl.start()
    agent = AgentRig(tmp_path, ctrl.url, token=TOKEN)
    try:
        agent.start()
        cfg = base_config(
            controller={"url": ctrl.url, "token": TOKEN, "poll_timeout_s": 2.0},
            hold_timeout_s=30.0,
            report_interval_s=0.2,
        )
        with router(tmp_path, cfg) as r:
            fleet = Fleet(ctrl, agent, r)
            try:
                yield fleet
            finally:
                fleet.client.close()
    finally:
        agent.cleanup()
        ctrl.stop()


class TestAdaptersServed:
    """Adapters are routed to their base and answered by name."""

    def test_adapter_routed_to_its_base_and_answered_by_name(self, fleet: Fleet) -> None:
        """An adapter applied with its base is served by both base replicas under its own
        name; one applied later is loaded at run time; unknown names stay 404."""
        status, views = fleet.admin("POST", "/admin/models", [base_spec(), adapter("ad-a")])
        assert status == 200, views
        assert [v["name"] for v in views] == ["base", "base"]
        assert [a["name"] for a in views[0]["adapters"]] == ["ad-a"]
        wait_for(
            lambda: len(fleet.endpoints_serving("ad-a")) == 2,
            timeout_s=60,
            what="both base replicas serve ad-a",
        )
        wait_for(lambda: "ad-a" in fleet.router_models(), what="the router knows ad-a")
        answer = fleet.client.chat.completions.create(
            model="ad-a", messages=[{"role": "user", "content": "hello"}], max_tokens=4
        )
        assert answer.model == "ad-a"
        status, views = fleet.admin("POST", "/admin/models", adapter("ad-b"))
        assert status == 200, views
        wait_for(
            lambda: len(fleet.endpoints_serving("ad-b")) == 2,
            what="ad-b loaded at run time on both replicas",
        )
        replicas = {r["id"] for r in fleet.admin("GET", "/admin/replicas?model=base")[1]}
        answer = fleet.client.completions.create(model="ad-b", prompt="hi", max_tokens=4)
        assert answer.model == "ad-b"
        # Loaded at run time: the same replicas, none restarted for it.
        assert replicas == {r["id"] for r in fleet.admin("GET", "/admin/replicas?model=base")[1]}
        with pytest.raises(openai.NotFoundError) as exc:
            fleet.client.chat.completions.create(
                model="ad-nope", messages=[{"role": "user", "content": "x"}], max_tokens=4
            )
        assert exc.value.code == "model_not_found"
        out = ctl(fleet.ctrl.url, "models", token=TOKEN)
        assert out.code == 0, out.err
        lines = out.out.splitlines()
        row = next(i for i, line in enumerate(lines) if line.split()[0] == "base")
        assert "ad-a" in lines[row + 1]
        assert "adapter of base" in lines[row + 1]
        assert "ad-b" in lines[row + 2]

    def test_deleted_adapter_is_unloaded_and_unknown(self, fleet: Fleet) -> None:
        """Deleting an adapter unloads it from the base's engines; routers answer 404 for it."""
        status, views = fleet.admin("POST", "/admin/models", [base_spec(), adapter("ad-a")])
        assert status == 200, views
        wait_for(lambda: len(fleet.endpoints_serving("ad-a")) == 2, timeout_s=60, what="served")
        status, body = fleet.admin("DELETE", "/admin/models/ad-a")
        assert (status, body) == (200, {"deleted": "ad-a", "adapter_of": "base"})
        wait_for(lambda: "ad-a" not in fleet.router_models(), what="the router forgets ad-a")
        with pytest.raises(openai.NotFoundError):
            fleet.client.chat.completions.create(
                model="ad-a", messages=[{"role": "user", "content": "x"}], max_tokens=4
            )


class TestAdapterScalesItsBase:
    """A request for an adapter starts its base from zero."""

    def test_request_for_an_adapter_starts_its_base_from_zero(self, fleet: Fleet) -> None:
        """With no base replica, an adapter's request is held, its base is placed for it,
        and the answer comes from the new replica under the adapter's name."""
        entries = [base_spec(min_replicas=0, max_replicas=1), adapter("ad-z")]
        status, views = fleet.admin("POST", "/admin/models", entries)
        assert status == 200, views
        assert views[0]["desired"] == 0
        wait_for(lambda: "ad-z" in fleet.router_models(), what="the router knows ad-z")
        answer = fleet.client.chat.completions.create(
            model="ad-z", messages=[{"role": "user", "content": "wake"}], max_tokens=4
        )
        assert answer.model == "ad-z"
        assert len(fleet.admin("GET", "/admin/replicas?model=base")[1]) == 1


class TestAdapterRefusals:
    """Adapter refusals name the reason."""

    def test_refusals_name_the_reason(self, fleet: Fleet) -> None:
        """An unknown base, an adapter of an adapter, an unknown field and deleting a base
        that serves adapters are refused with the reason; nothing is applied."""
        status, body = fleet.admin("POST", "/admin/models", adapter("ad-x", base="missing"))
        assert status == 422
        assert body["error"]["param"] == "[0].adapter_of"
        assert "no model named 'missing'" in body["error"]["message"]
        status, _ = fleet.admin("POST", "/admin/models", [base_spec(), adapter("ad-a")])
        assert status == 200
        status, body = fleet.admin("POST", "/admin/models", adapter("ad-b", base="ad-a"))
        assert status == 422
        assert "adapters of adapters" in body["error"]["message"]
        wrong = {**adapter("ad-c"), "engine": "sim"}
        status, body = fleet.admin("POST", "/admin/models", wrong)
        assert status == 422
        assert "only name, adapter_of and source" in body["error"]["message"]
        status, body = fleet.admin("DELETE", "/admin/models/base")
        assert status == 409
        assert "ad-a" in body["error"]["message"]
        status, body = fleet.admin("POST", "/admin/models", {**base_spec(), "name": "ad-a"})
        assert status == 409
        names = {m["name"] for m in fleet.admin("GET", "/admin/models")[1]}
        assert names == {"base"}
