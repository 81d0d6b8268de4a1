"""Heartbeat retry policy and the agent's configuration parsing."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.agent.config import AgentConfigError, parse_config
from llmgw.agent.heartbeat import (
    Heartbeater,
    HeartbeatFailed,
    HeartbeatRejected,
    backoff_delay_s,
)
from llmgw.runtime.clock import ManualClock
from llmgw.runtime.netaddr import is_loopback
from llmgw.wire.agent import Heartbeat, HeartbeatReply, ShardSpec

REQUIRED = ["--controller", "http://c:1", "--node", "n1", "--state-dir", "/tmp/s"]


class TestBackoff:
    """The heartbeat backoff grows, caps and jitters within bounds."""

    def test_grows_and_caps(self) -> None:
        """Delays double per failure up to the cap (jitter factor fixed at its top)."""
        delays = [backoff_delay_s(n, base_s=1.0, cap_s=8.0, rng=lambda: 1.0) for n in range(1, 7)]
        assert delays == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]

    def test_jitter_spreads_within_half(self) -> None:
        """Jitter keeps each delay between half and all of the raw delay."""
        assert backoff_delay_s(3, base_s=1.0, cap_s=30.0, rng=lambda: 0.0) == 2.0
        assert backoff_delay_s(3, base_s=1.0, cap_s=30.0, rng=lambda: 0.5) == 3.0


class ScriptedClient:
    def __init__(self, answers: list[HeartbeatReply | Exception]) -> None:
        self.answers = answers
        self.sent: list[Heartbeat] = []
        self.url = "http://c:1"

    async def heartbeat(self, hb: Heartbeat) -> HeartbeatReply:
        self.sent.append(hb)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def close(self) -> None:
        pass


def beat_of() -> Heartbeat:
    return Heartbeat(node="n1", address="a", gpus=())


class TestHeartbeater:
    """The heartbeater applies replies and retries failures without acting on them."""

    async def test_failures_apply_nothing(self) -> None:
        """Unreachable or standby controllers never change the desired set; delays grow."""
        applied: list[tuple[ShardSpec, ...]] = []
        client = ScriptedClient(
            [HeartbeatFailed("refused"), HeartbeatFailed("HTTP 503: not_leader")]
        )
        hb = Heartbeater(
            client=client,
            build=beat_of,
            on_reply=lambda r: applied.append(r.shards),
            interval_s=2.0,
            rng=lambda: 1.0,
            clock=ManualClock(),
        )
        assert await hb.beat() == 1.0
        assert await hb.beat() == 2.0
        assert applied == []
        assert hb.failures == 2
        assert hb.last_error == "HTTP 503: not_leader"

    async def test_retries_stay_within_a_few_intervals(self) -> None:
        """However long the outage, a retry waits at most four intervals (8 s at 2 s)."""
        # A controller that comes back must hear from every agent before its
        # heartbeat timeout (10 s by default), or it shows healthy nodes unreachable.
        client = ScriptedClient([HeartbeatFailed("refused")] * 20)
        hb = Heartbeater(
            client=client,
            build=beat_of,
            on_reply=lambda _r: None,
            interval_s=2.0,
            rng=lambda: 1.0,
            clock=ManualClock(),
        )
        delays = [await hb.beat() for _ in range(20)]
        assert max(delays) == 8.0

    async def test_reply_is_applied_and_resets(self) -> None:
        """An answer is applied, clears the failure count, and sets the next beat."""
        applied: list[tuple[ShardSpec, ...]] = []
        client = ScriptedClient([HeartbeatRejected("401"), HeartbeatReply(shards=(), interval_s=5)])
        clock = ManualClock()
        hb = Heartbeater(
            client=client,
            build=beat_of,
            on_reply=lambda r: applied.append(r.shards),
            interval_s=2.0,
            clock=clock,
        )
        await hb.beat()
        assert await hb.beat() == 2.0
        assert applied == [()]
        assert (hb.failures, hb.last_ok_at) == (0, clock.wall())

    async def test_a_failed_preparation_still_beats(self) -> None:
        """A beat's preparation (the log asks) that raises is logged and the beat goes."""

        async def broken() -> None:
            raise ValueError("a bug")

        applied: list[tuple[ShardSpec, ...]] = []
        hb = Heartbeater(
            client=ScriptedClient([HeartbeatReply(shards=(), interval_s=5)]),
            build=beat_of,
            on_reply=lambda r: applied.append(r.shards),
            interval_s=2.0,
            prepare=broken,
            clock=ManualClock(),
        )
        assert await hb.beat() == 2.0
        assert applied == [()]


class _NoProbe:
    async def check(self, host: str, port: int, path: str) -> bool:
        return False

    async def close(self) -> None:
        pass


class TestHeartbeatSeq:
    """Heartbeat sequence numbers of one agent process."""

    async def test_seq_increases_per_heartbeat_of_one_agent(self, tmp_path: Path) -> None:
        """Each heartbeat built takes the next seq from 1, failed sends included."""
        from llmgw.agent.engineprocs import PopenSpawner
        from llmgw.agent.gpus.fake import FakeInventory
        from llmgw.agent.ports import PortAllocator
        from llmgw.agent.service import Agent
        from llmgw.agent.statefile import StateStore
        from llmgw.agent.supervisor import Supervisor

        state_dir = str(tmp_path / "state")
        cfg = parse_config(["--controller", "http://c:1", "--node", "n1", "--state-dir", state_dir])
        clock = ManualClock()
        probe = _NoProbe()
        supervisor = Supervisor(
            log_dir=tmp_path / "logs",
            store=StateStore(tmp_path / "state", node="n1"),
            ports=PortAllocator(21000, 21009, is_free=lambda p: True),
            spawner=PopenSpawner(),
            probe=probe,
            clock=clock,
        )
        reply = HeartbeatReply(shards=())
        client = ScriptedClient([reply, HeartbeatFailed("refused"), reply])
        agent = Agent(
            config=cfg,
            inventory=FakeInventory(()),
            supervisor=supervisor,
            client=client,
            probe=probe,
            clock=clock,
        )
        for _ in range(3):
            await agent.heartbeater.beat()
        assert [hb.seq for hb in client.sent] == [1, 2, 3]
        assert {hb.agent_started_at for hb in client.sent} == {agent.started_at}


class TestConfig:
    """The agent's configuration from flags and file, and its errors."""

    def test_flags(self) -> None:
        """Flags map onto the config, repeatable ones into lists and mappings."""
        cfg = parse_config(
            [
                *REQUIRED,
                "--controller",
                "http://c:2",
                "--gpus",
                "8xH100-80G",
                "--fabric",
                "ib0",
                "--fabric",
                "ib1",
                "--label",
                "zone=a",
                "--port-range",
                "21000-21099",
                "--engine-bin",
                "vllm=/opt/vllm serve",
                "--address",
                "10.0.0.5",
            ]
        )
        assert cfg.controller == ("http://c:1", "http://c:2")
        assert cfg.fabric == ("ib0", "ib1")
        assert cfg.label == {"zone": "a"}
        assert cfg.ports == (21000, 21099)
        assert cfg.engine_bin == {"vllm": "/opt/vllm serve"}
        assert cfg.engine_log_dir == Path("/tmp/s/logs")

    def test_file_under_flags(self, tmp_path: Path) -> None:
        """A YAML file gives defaults; flags on the command line win."""
        f = tmp_path / "agent.yaml"
        f.write_text(
            "controller: http://file:1\nnode: from-file\nstate-dir: /tmp/x\n"
            "fabric: ib0\nlabel: {rack: r1}\ninterval_s: 0.5\n"
        )
        cfg = parse_config(["--config", str(f), "--node", "from-flag"])
        assert (cfg.node, cfg.controller, cfg.fabric) == ("from-flag", ("http://file:1",), ("ib0",))
        assert (cfg.label, cfg.interval_s) == ({"rack": "r1"}, 0.5)

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            ([], "missing --controller, --node, --state-dir"),
            ([*REQUIRED, "--port-range", "9-1"], "port range"),
            ([*REQUIRED, "--label", "novalue"], "KEY=VALUE"),
            ([*REQUIRED, "--engine-bin", "tgi=x"], "unknown engine"),
            ([*REQUIRED, "--gpus", "nvml", "--gpus-file", "f"], "not both"),
            # Without a scheme every heartbeat would fail, forever, with a warning.
            (["--node", "n", "--state-dir", "/tmp/x", "--controller", "127.0.0.1:8081"], "http"),
            (["--node", "n", "--state-dir", "/tmp/x", "--controller", "http://h:x"], "http"),
        ],
    )
    def test_errors(self, args: list[str], message: str) -> None:
        """Bad configurations are refused with a message that names the problem."""
        with pytest.raises(AgentConfigError, match=message):
            parse_config(args)

    def test_credentials_in_the_controller_url_are_refused_unechoed(self) -> None:
        """A user or password in --controller is refused without repeating it: with a
        token, aiohttp refused every heartbeat (ValueError) and the agent died."""
        url = "http://u:pw-canary@127.0.0.1:8081"
        with pytest.raises(AgentConfigError, match="user name or password") as caught:
            parse_config(["--node", "n", "--state-dir", "/tmp/x", "--controller", url])
        assert "pw-canary" not in str(caught.value)

    def test_unknown_file_key(self, tmp_path: Path) -> None:
        """A misspelt key in the file is an error, not silently ignored."""
        f = tmp_path / "agent.yaml"
        f.write_text("nodee: x\n")
        with pytest.raises(AgentConfigError, match="nodee"):
            parse_config(["--config", str(f), *REQUIRED])

    def test_ended_logs_keep(self) -> None:
        """How many dropped shards keep their logs is a flag, 20 unless given; a negative
        count is refused."""
        assert parse_config(REQUIRED).ended_logs_keep == 20
        assert parse_config([*REQUIRED, "--ended-logs-keep", "5"]).ended_logs_keep == 5
        with pytest.raises(AgentConfigError, match="ended_logs_keep"):
            parse_config([*REQUIRED, "--ended-logs-keep", "-1"])

    def test_print_inventory_needs_no_controller(self) -> None:
        """--print-inventory runs without controller, node or state dir."""
        assert parse_config(["--gpus", "1xH100-80G", "--print-inventory"]).print_inventory


class TestLoopbackGuard:
    """Which controller peers count as loopback for the agent."""

    @pytest.mark.parametrize(
        ("expected", "remote"),
        [(True, "127.0.0.1"), (True, "::1"), (True, "127.1.2.3"), (False, "10.0.0.2"),
         (False, None), (False, "not-an-ip")],
    )  # fmt: skip
    def test_peers(self, expected: bool, remote: str | None) -> None:
        """Only loopback peers may use the agent's HTTP surface."""
        assert expected == is_loopback(remote)


class TestAddressCheck:
    """The agent's check of the address it advertises."""

    @pytest.mark.parametrize("address", ["0.0.0.0", "::", "0:0::0"])
    def test_an_unspecified_address_is_refused(self, address: str) -> None:
        """0.0.0.0 binds (every interface), but it is nobody's address: engines would
        listen everywhere and routers would be sent to their own host."""
        from llmgw.agent.config import check_address

        with pytest.raises(AgentConfigError, match="not an address anyone can reach"):
            check_address(address)
