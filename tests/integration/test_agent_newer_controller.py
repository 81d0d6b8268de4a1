"""A real agent of this version told what to run by a newer controller (the supported
mix of a rolling upgrade, docs/operations.md#which-versions-run-together): a shard the
agent cannot read fails alone, and the rest of the reply is acted on.

The controller is the scripted one of test_agent_supervision.py, its replies edited
to carry what a later version may send; the agent and its engines are real processes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.testing.wait import until
from tests.integration.test_agent_supervision import (
    AgentRig,
    ScriptedController,
    alive,
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


def newer_second_shard(**over: Any) -> Any:
    """An edit that gives the reply's second shard `over` (a newer controller's values)."""

    def edit(doc: dict[str, Any]) -> None:
        if len(doc["shards"]) > 1:
            doc["shards"][1].update(over)

    return edit


class TestShardsOfANewerController:
    """A reply holding a shard this agent cannot read."""

    @pytest.mark.parametrize(
        "over",
        [{"engine": "trtllm"}, {"env_from": {"HF_TOKEN": {"vault": "kv/hf"}}}],
        ids=["unknown-engine", "unknown-secret-kind"],
    )
    async def test_that_shard_fails_and_the_others_start(
        self, agent: AgentRig, scripted: ScriptedController, over: dict[str, Any]
    ) -> None:
        """The shard it cannot read is reported failed with the reason; the other starts."""
        scripted.desired = (sim_spec("r-known"), sim_spec("r-newer", gpus=(1,)))
        scripted.edit = newer_second_shard(**over)
        agent.start()
        await until(
            lambda: (s := scripted.shard("r-known")) and s.state == "ready", what="r-known ready"
        )
        st = await until(lambda: scripted.shard("r-newer"), what="r-newer reported")
        assert (st.state, st.pid) == ("failed", None)
        assert "cannot read" in st.log_tail[-1]
        assert next(iter(over)) in st.log_tail[-1]

    async def test_a_running_shard_it_cannot_read_any_more_keeps_running(
        self, agent: AgentRig, scripted: ScriptedController
    ) -> None:
        """A shard that runs is neither stopped nor changed when its entry becomes unreadable."""
        scripted.desired = (sim_spec("r-known"), sim_spec("r-newer", gpus=(1,)))
        agent.start()
        st = await until(
            lambda: (s := scripted.shard("r-newer")) and s.state == "ready" and s,
            what="r-newer ready",
        )
        scripted.edit = newer_second_shard(engine="trtllm")
        seen = len(scripted.beats)
        await until(lambda: len(scripted.beats) > seen + 3, what="three more beats")
        now = scripted.shard("r-newer")
        assert now is not None
        assert (now.state, now.pid) == ("ready", st.pid)
        assert st.pid is not None
        assert alive(st.pid)
