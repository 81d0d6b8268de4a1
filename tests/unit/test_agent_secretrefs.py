"""env_from on the agent: references resolved on the node, values given to the engine only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from llmgw.agent.ports import PortAllocator
from llmgw.agent.secretrefs import SecretUnavailable, resolve, resolve_quietly
from llmgw.agent.statefile import StateStore
from llmgw.agent.supervisor import Supervisor
from llmgw.wire.agent import SecretRef
from tests.unit.test_agent_supervisor import FakeProbe, FakeSpawner, spec

CANARY = "canary-7f3a9c1e-not-for-logs"


class TestResolve:
    def test_env_and_file(self, tmp_path: Path) -> None:
        f = tmp_path / "hf"
        f.write_text(CANARY + "\n")
        refs = {"HF_TOKEN": SecretRef(file=str(f)), "W": SecretRef(env="W_SRC")}
        assert resolve(refs, environ={"W_SRC": "w-value"}) == {"HF_TOKEN": CANARY, "W": "w-value"}

    @pytest.mark.parametrize(
        ("ref", "words"),
        [
            (SecretRef(env="MISSING"), "the agent's environment has no MISSING"),
            (SecretRef(env="LLMGW_AGENT_TOKEN"), "agent's own credential"),
            (SecretRef(env="LLMGW_ROUTER_TOKEN"), "agent's own credential"),
            (SecretRef(env="EMPTY"), "variable EMPTY is empty"),
            (SecretRef(file="/nonexistent/secret"), "cannot read /nonexistent/secret"),
        ],
    )
    def test_unresolvable_names_the_reference_not_a_value(self, ref: SecretRef, words: str) -> None:
        env = {"LLMGW_AGENT_TOKEN": CANARY, "LLMGW_ROUTER_TOKEN": CANARY, "EMPTY": ""}
        with pytest.raises(SecretUnavailable) as err:
            resolve({"X": ref}, environ=env)
        assert words in str(err.value)
        assert str(err.value).startswith("env_from X: ")
        assert CANARY not in str(err.value)

    def test_the_agent_s_own_files_are_never_read(self, tmp_path: Path) -> None:
        state = tmp_path / "state"
        state.mkdir()
        (state / "agent-state.json").write_text('{"api_key": "k"}')
        token = tmp_path / "token"
        token.write_text(CANARY)
        (tmp_path / "link").symlink_to(token)
        for path in (state / "agent-state.json", token, tmp_path / "link"):
            with pytest.raises(SecretUnavailable, match="the agent's own"):
                resolve({"X": SecretRef(file=str(path))}, private_paths=(state, token))

    def test_oversized_and_binary_files(self, tmp_path: Path) -> None:
        big = tmp_path / "big"
        big.write_bytes(b"x" * (64 * 1024 + 1))
        with pytest.raises(SecretUnavailable, match="over 65536 bytes"):
            resolve({"X": SecretRef(file=str(big))})
        nul = tmp_path / "nul"
        nul.write_bytes(b"a\0b")
        with pytest.raises(SecretUnavailable, match="NUL"):
            resolve({"X": SecretRef(file=str(nul))})

    def test_quietly_skips_what_does_not_resolve(self, tmp_path: Path) -> None:
        f = tmp_path / "s"
        f.write_text(CANARY)
        refs = {"A": SecretRef(file=str(f)), "B": SecretRef(file=str(tmp_path / "gone"))}
        assert resolve_quietly(refs) == (CANARY,)


@pytest.fixture
def parts(tmp_path: Path) -> dict[str, Any]:
    spawner = FakeSpawner()
    store = StateStore(tmp_path / "state", node="n1")
    sup = Supervisor(
        log_dir=tmp_path / "logs",
        store=store,
        ports=PortAllocator(21000, 21009, is_free=lambda p: True),
        spawner=spawner,
        probe=FakeProbe(),
        private_paths=(tmp_path / "state",),
    )
    return {"sup": sup, "spawner": spawner, "tmp": tmp_path}


class TestSupervisor:
    async def test_the_value_reaches_the_engine_env_only(self, parts: dict[str, Any]) -> None:
        sup, spawner, tmp = parts["sup"], parts["spawner"], parts["tmp"]
        secret = tmp / "hf"
        secret.write_text(CANARY)
        sup.apply([spec(env={"HF_HOME": "/d"}, env_from={"HF_TOKEN": SecretRef(file=str(secret))})])
        ((argv, env, _),) = spawner.spawned
        assert env["HF_TOKEN"] == CANARY
        assert env["HF_HOME"] == "/d"
        assert CANARY not in " ".join(argv)
        # The state file keeps the reference, never the value.
        state = (tmp / "state" / "agent-state.json").read_text()
        assert CANARY not in state
        assert str(secret) in state
        assert CANARY not in msgspec.json.encode(sup.statuses()).decode()

    async def test_unresolvable_fails_the_shard_before_it_starts(
        self, parts: dict[str, Any]
    ) -> None:
        sup, spawner = parts["sup"], parts["spawner"]
        sup.apply([spec(env_from={"HF_TOKEN": SecretRef(env="NO_SUCH_VARIABLE_HERE")})])
        (st,) = sup.statuses()
        assert st.state == "failed"
        assert st.log_tail == (
            "llmgw agent: env_from HF_TOKEN: the agent's environment has no NO_SUCH_VARIABLE_HERE",
        )
        assert spawner.spawned == []

    async def test_a_failed_engine_s_log_tail_masks_the_value(self, parts: dict[str, Any]) -> None:
        """An engine that prints its environment and dies: the tail leaving the node is masked."""
        sup, spawner, tmp = parts["sup"], parts["spawner"], parts["tmp"]
        secret = tmp / "hf"
        secret.write_text(CANARY)
        sup.apply([spec(env_from={"HF_TOKEN": SecretRef(file=str(secret))})])
        ((_, _, proc),) = spawner.spawned
        log = tmp / "logs" / "r1-rank0.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"HF_TOKEN={CANARY}\nTraceback: bad token {CANARY}\n")
        from llmgw.agent.engineprocs import Exit

        proc.exit = Exit(1)
        await sup.tick()
        (st,) = sup.statuses()
        assert st.state == "failed"
        assert st.log_tail
        assert not any(CANARY in line for line in st.log_tail)

    async def test_policy_applies_to_env_from_names(self, parts: dict[str, Any]) -> None:
        sup, spawner = parts["sup"], parts["spawner"]
        sup.apply([spec(env_from={"LD_PRELOAD": SecretRef(env="HOME")})])
        (st,) = sup.statuses()
        assert st.state == "failed"
        assert "spec env_from LD_PRELOAD is not allowed on this node" in st.log_tail[0]
        assert spawner.spawned == []
