"""Hostile sequences on the sleep surface, with real processes: an agent and its sim-engines.

An engine that stops answering (SIGSTOP: its socket still accepts, nothing answers)
while the controller tells it to sleep must hold up nothing else on its node.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import msgspec
import pytest

from llmgw.agent.sleeping import HttpSleepClient
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


class TestWedgedEngine:
    """A wedged engine's unanswered sleep leaves the node's other engines supervised."""

    async def test_others_start_and_exits_are_seen(
        self, agent: AgentRig, scripted: ScriptedController
    ) -> None:
        """With a's sleep unanswered, b starts and is reported ready, and a's exit is seen."""
        a = msgspec.structs.replace(sim_spec("a"), sleep_mode=True)
        scripted.desired = (a,)
        agent.start()
        first = await until(
            lambda: (s := scripted.shard("a")) and s.state == "ready" and s, what="a ready"
        )
        assert first.pid is not None
        os.kill(first.pid, signal.SIGSTOP)
        try:
            asleep = msgspec.structs.replace(a, sleep_level=1)
            scripted.desired = (asleep,)
            # A few heartbeats on, the agent has long sent the sleep (one tick).
            seen = len(scripted.beats)
            await until(lambda: len(scripted.beats) >= seen + 5, what="five heartbeats")
            scripted.desired = (asleep, sim_spec("b", gpus=(1,)))
            await until(
                lambda: (s := scripted.shard("b")) and s.state == "ready",
                timeout_s=20,
                what="b ready while a's sleep goes unanswered",
            )
            st = scripted.shard("a")
            assert st is not None
            assert st.state == "ready"  # falling asleep, as far as anyone knows
        finally:
            os.kill(first.pid, signal.SIGKILL)
        await until(
            lambda: (s := scripted.shard("a")) and s.state == "failed",
            timeout_s=20,
            what="a's exit reported",
        )
        assert not alive(first.pid)


class TestSilentIsSleeping:
    """The question whether an engine is asleep has a short timeout of its own."""

    async def test_an_unanswered_question_ends_without_an_answer(self) -> None:
        """A socket that accepts and never answers /is_sleeping is "does not say" once the
        question's own timeout passes, not after the sleep calls' minutes."""
        held: list[asyncio.StreamWriter] = []

        async def accept(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            held.append(writer)  # read nothing, answer nothing

        server = await asyncio.start_server(accept, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = HttpSleepClient(ask_timeout_s=0.3)
        try:
            got = await asyncio.wait_for(client.is_sleeping("127.0.0.1", port, "k"), timeout=10)
            assert got is None
        finally:
            await client.close()
            for w in held:
                w.close()
            server.close()
            await server.wait_closed()
