"""Hostile sequences on LoRA adapters, with real processes: an agent and its sim-engines."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import msgspec
import pytest

from llmgw.testing.wait import until
from llmgw.wire.agent import ShardStatus
from tests.integration.test_agent_supervision import (
    AgentRig,
    ScriptedController,
    rig_for,
    scripted_controller,
    sim_spec,
)

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def scripted() -> AsyncIterator[ScriptedController]:
    async with scripted_controller() as c:
        yield c


@pytest.fixture
def agent(tmp_path: Path, scripted: ScriptedController) -> Iterator[AgentRig]:
    with rig_for(tmp_path, scripted) as r:
        yield r


def roots(st: ShardStatus) -> dict[str, str]:
    """Adapter → the path the engine serves it from (its /v1/models `root`)."""
    req = urllib.request.Request(f"http://127.0.0.1:{st.port}/v1/models")
    req.add_header("Authorization", f"Bearer {st.api_key}")
    with urllib.request.urlopen(req, timeout=5) as resp:
        listed = json.loads(resp.read())["data"]
    return {m["id"]: m["root"] for m in listed if m.get("parent")}


class TestSourceChanged:
    """An adapter applied again with another source is served from the new one."""

    async def test_the_engine_serves_the_new_path(
        self, agent: AgentRig, scripted: ScriptedController
    ) -> None:
        """A running sim base given `a` at a new path serves it from there, not the old."""
        first = msgspec.structs.replace(sim_spec("r"), adapters={"a": "/l/old"})
        scripted.desired = (first,)
        agent.start()
        st = await until(
            lambda: (s := scripted.shard("r")) and s.state == "ready" and s, what="r ready"
        )
        assert roots(st) == {"a": "/l/old"}
        scripted.desired = (msgspec.structs.replace(first, adapters={"a": "/l/new"}),)
        await until(lambda: roots(st) == {"a": "/l/new"}, timeout_s=10, what="a from /l/new")
        assert scripted.shard("r").adapters == ("a",)  # type: ignore[union-attr]
