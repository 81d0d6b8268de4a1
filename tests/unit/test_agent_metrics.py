"""The agent's /metrics: engines by state, start/exit counters, start-up time, card readings."""

from __future__ import annotations

from pathlib import Path

from llmgw.agent.config import parse_config
from llmgw.agent.gpus.fake import FakeInventory
from llmgw.agent.metrics import AgentMetrics
from llmgw.agent.ports import PortAllocator
from llmgw.agent.service import Agent
from llmgw.agent.statefile import StateStore
from llmgw.agent.supervisor import Supervisor
from llmgw.runtime.clock import ManualClock
from llmgw.wire.agent import HeartbeatReply
from tests.unit.test_agent_heartbeat_config import ScriptedClient
from tests.unit.test_agent_supervisor import FakeProbe, FakeSpawner, spec


def sample_lines(m: AgentMetrics, prefix: str) -> list[str]:
    return [x for x in m.render().decode().splitlines() if x.startswith(prefix)]


class TestAgentMetrics:
    """The agent's /metrics page as engines start, exit and report card readings."""

    async def test_engine_lifecycle_and_cards(self, tmp_path: Path) -> None:
        """Engines by state, start and exit counts, start-up time and card readings on /metrics."""
        clock = ManualClock()
        probe = FakeProbe()
        spawner = FakeSpawner()
        sup = Supervisor(
            log_dir=tmp_path / "logs",
            store=StateStore(tmp_path / "state", node="n1"),
            ports=PortAllocator(21000, 21009, is_free=lambda p: True),
            spawner=spawner,
            probe=probe,
            clock=clock,
        )
        cfg = parse_config(
            ["--controller", "http://c:1", "--node", "n1", "--state-dir", str(tmp_path / "s")]
        )
        client = ScriptedClient([HeartbeatReply(shards=())])
        agent = Agent(
            config=cfg,
            inventory=FakeInventory.from_spec("2xH100-80G", uuid_prefix="n1"),
            supervisor=sup,
            client=client,
            probe=probe,
            clock=clock,
        )
        m = AgentMetrics(agent)
        # Before any heartbeat was accepted the age is absent, not zero.
        assert sample_lines(m, "llmgw_agent_heartbeat_age_seconds ") == []

        sup.apply([spec("r1", gpu_indices=(1,))])
        assert 'llmgw_agent_engines{engine="sim",state="starting"} 1.0' in sample_lines(
            m, "llmgw_agent_engines{"
        )
        clock.advance(7.0)
        probe.ready_ports.add(21000)
        await sup.tick()
        assert sample_lines(m, "llmgw_agent_engine_startup_seconds_sum") == [
            'llmgw_agent_engine_startup_seconds_sum{engine="sim"} 7.0'
        ]
        assert sample_lines(m, "llmgw_agent_engine_starts_total") == [
            'llmgw_agent_engine_starts_total{engine="sim"} 1.0'
        ]
        # The busy card is warm and nearly full; the idle one cool and empty.
        assert sample_lines(m, "llmgw_agent_gpu_assigned{") == [
            'llmgw_agent_gpu_assigned{gpu="0",gpu_class="H100-80G"} 0.0',
            'llmgw_agent_gpu_assigned{gpu="1",gpu_class="H100-80G"} 1.0',
        ]
        temps = sample_lines(m, "llmgw_agent_gpu_temperature_celsius{")
        assert temps == [
            'llmgw_agent_gpu_temperature_celsius{gpu="0",gpu_class="H100-80G"} 34.0',
            'llmgw_agent_gpu_temperature_celsius{gpu="1",gpu_class="H100-80G"} 66.0',
        ]

        # The engine dies on its own: a failed exit, and no card is busy any more.
        spawner.spawned[0][2].exit = spawner.spawned[0][2].exit or _exit(3)
        await sup.tick()
        assert sample_lines(m, "llmgw_agent_engine_exits_total") == [
            'llmgw_agent_engine_exits_total{engine="sim",how="failed"} 1.0'
        ]
        assert 'llmgw_agent_engines{engine="sim",state="failed"} 1.0' in sample_lines(
            m, "llmgw_agent_engines{"
        )
        agent.inventory.set_fault(0, "xid 79")
        assert sample_lines(m, "llmgw_agent_gpu_healthy{") == [
            'llmgw_agent_gpu_healthy{gpu="0",gpu_class="H100-80G"} 0.0',
            'llmgw_agent_gpu_healthy{gpu="1",gpu_class="H100-80G"} 1.0',
        ]

        await agent.heartbeater.beat()
        clock.advance(2.5)
        assert sample_lines(m, "llmgw_agent_heartbeat_age_seconds ") == [
            "llmgw_agent_heartbeat_age_seconds 2.5"
        ]


def _exit(code: int):  # type: ignore[no-untyped-def]
    from llmgw.agent.engineprocs import Exit

    return Exit(code)
