"""env_from on the agent: references resolved on the node, values given to the engine only."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest

from llmgw.agent.policy import policy_of
from llmgw.agent.ports import PortAllocator
from llmgw.agent.secretrefs import SecretUnavailable, resolve, resolve_quietly
from llmgw.agent.statefile import StateStore
from llmgw.agent.supervisor import Supervisor
from llmgw.wire.agent import SecretRef
from tests.unit.test_agent_supervisor import FakeProbe, FakeSpawner, spec

CANARY = "canary-7f3a9c1e-not-for-logs"
AGENT_TOKEN = "agent-token-5b2e-not-for-engines"


class TestResolve:
    """Resolving env_from references on the node, and the files it refuses to read."""

    def test_env_and_file(self, tmp_path: Path) -> None:
        """A file reference gives the file's first line, an env reference the variable's value."""
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
        """An unresolvable reference is named, never a value."""
        env = {"LLMGW_AGENT_TOKEN": CANARY, "LLMGW_ROUTER_TOKEN": CANARY, "EMPTY": ""}
        with pytest.raises(SecretUnavailable) as err:
            resolve({"X": ref}, environ=env)
        assert words in str(err.value)
        assert str(err.value).startswith("env_from X: ")
        assert CANARY not in str(err.value)

    def test_the_agent_s_own_files_are_never_read(self, tmp_path: Path) -> None:
        """The agent's own files are never read."""
        state = tmp_path / "state"
        state.mkdir()
        (state / "agent-state.json").write_text('{"api_key": "k"}')
        token = tmp_path / "token"
        token.write_text(CANARY)
        (tmp_path / "link").symlink_to(token)
        for path in (state / "agent-state.json", token, tmp_path / "link"):
            with pytest.raises(SecretUnavailable, match="the agent's own"):
                resolve({"X": SecretRef(file=str(path))}, private_paths=(state, token))

    def test_a_hard_link_to_the_token_is_refused(self, tmp_path: Path) -> None:
        """The file read is compared, not only its name: a second name is the same file."""
        token = tmp_path / "private" / "token"
        token.parent.mkdir()
        token.write_text(CANARY)
        os.link(token, tmp_path / "another-name")
        with pytest.raises(SecretUnavailable, match="the agent's own"):
            resolve({"X": SecretRef(file=str(tmp_path / "another-name"))}, private_paths=(token,))

    def test_a_file_holding_the_agent_s_token_is_refused(self, tmp_path: Path) -> None:
        """The agent's config file (or any copy) may hold its token: never given out."""
        config = tmp_path / "agent.yaml"
        config.write_text(f"node: n1\ntoken: {CANARY}\n")
        with pytest.raises(SecretUnavailable, match="the agent's own") as err:
            resolve({"X": SecretRef(file=str(config))}, private_values=(CANARY,))
        assert CANARY not in str(err.value)
        with pytest.raises(SecretUnavailable, match="the agent's own"):
            resolve(
                {"X": SecretRef(env="COPY")}, environ={"COPY": CANARY}, private_values=(CANARY,)
            )

    def test_a_fifo_is_refused_at_once(self, tmp_path: Path) -> None:
        """Opening a FIFO for reading waits for a writer: the agent's loop would hang."""
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)
        caught: list[BaseException] = []

        def run() -> None:
            try:
                resolve({"X": SecretRef(file=str(fifo))})
            except BaseException as exc:  # noqa: BLE001  # asserted below
                caught.append(exc)

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(timeout=30)
        if worker.is_alive():
            with fifo.open("w"):  # let the reader go before failing
                pass
            worker.join(timeout=30)
            pytest.fail("resolve blocked on a FIFO")
        assert len(caught) == 1
        assert isinstance(caught[0], SecretUnavailable)
        assert "not a regular file" in str(caught[0])

    def test_a_symlink_loop_or_a_device_is_refused_not_a_crash(self, tmp_path: Path) -> None:
        """A symlink loop or a device is refused, not a crash."""
        (tmp_path / "a").symlink_to(tmp_path / "b")
        (tmp_path / "b").symlink_to(tmp_path / "a")
        for path in (str(tmp_path / "a"), "/dev/null", str(tmp_path)):
            with pytest.raises(SecretUnavailable, match=f"env_from X: (cannot read )?{path}"):
                resolve({"X": SecretRef(file=path)}, private_paths=(tmp_path / "private",))

    def test_oversized_and_binary_files(self, tmp_path: Path) -> None:
        """Oversized files and files holding a NUL byte are refused."""
        big = tmp_path / "big"
        big.write_bytes(b"x" * (64 * 1024 + 1))
        with pytest.raises(SecretUnavailable, match="over 65536 bytes"):
            resolve({"X": SecretRef(file=str(big))})
        nul = tmp_path / "nul"
        nul.write_bytes(b"a\0b")
        with pytest.raises(SecretUnavailable, match="NUL"):
            resolve({"X": SecretRef(file=str(nul))})

    def test_quietly_skips_what_does_not_resolve(self, tmp_path: Path) -> None:
        """Quietly skips what does not resolve."""
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
        private_values=(AGENT_TOKEN,),
    )
    return {"sup": sup, "spawner": spawner, "tmp": tmp_path}


class TestSupervisor:
    """Resolved secret values reach only the engine's environment and never its log tails."""

    async def test_the_value_reaches_the_engine_env_only(self, parts: dict[str, Any]) -> None:
        """The value reaches the engine env only."""
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

    async def test_the_agent_s_token_and_another_engine_s_key_are_never_given(
        self, parts: dict[str, Any]
    ) -> None:
        """A file holding the agent's token (its config file) or a running engine's key."""
        sup, spawner, tmp = parts["sup"], parts["spawner"], parts["tmp"]
        config = tmp / "agent.yaml"
        config.write_text(f"token: {AGENT_TOKEN}\n")
        sup.apply([spec("r1")])
        ((_, first_env, _),) = spawner.spawned
        key = tmp / "key-copy"
        key.write_text(first_env["VLLM_API_KEY"] + "\n")
        refs = {"A": SecretRef(file=str(config))}
        copy = {"B": SecretRef(file=str(key))}
        sup.apply([spec("r1"), spec("r2", env_from=refs), spec("r3", env_from=copy)])
        by_id = {st.replica_id: st for st in sup.statuses()}
        assert by_id["r2"].state == "failed"
        assert "holds the agent's own credential" in by_id["r2"].log_tail[0]
        assert by_id["r3"].state == "failed"
        assert "holds the agent's own credential" in by_id["r3"].log_tail[0]
        assert len(spawner.spawned) == 1

    async def test_unresolvable_fails_the_shard_before_it_starts(
        self, parts: dict[str, Any]
    ) -> None:
        """Unresolvable fails the shard before it starts."""
        sup, spawner = parts["sup"], parts["spawner"]
        # Declared (secret_env) but not in the agent's environment.
        sup.policy = policy_of((), (), {"NO_SUCH_VARIABLE_HERE"})
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

    async def test_an_adopted_engine_s_tail_masks_the_value_it_was_given(
        self, parts: dict[str, Any]
    ) -> None:
        """After an agent restart the secret file may hold a new value (a rotated token) or
        be gone; the engine still has the old one, and that is what its log may show."""
        sup, spawner, tmp = parts["sup"], parts["spawner"], parts["tmp"]
        secret = tmp / "hf"
        secret.write_text(CANARY)
        refs = {"HF_TOKEN": SecretRef(file=str(secret))}
        sup.apply([spec(env_from=refs)])
        ((_, env, proc),) = spawner.spawned
        secret.write_text("rotated-value-not-the-engines")
        spawner2 = FakeSpawner()
        spawner2.alive[proc.pid] = proc
        sup2 = Supervisor(
            log_dir=tmp / "logs",
            store=StateStore(tmp / "state", node="n1"),
            ports=PortAllocator(21000, 21009, is_free=lambda p: True),
            spawner=spawner2,
            probe=FakeProbe(),
            private_paths=(tmp / "state",),
            engine_environ=lambda pid: dict(env) if pid == proc.pid else None,
        )
        sup2.adopt(StateStore(tmp / "state", node="n1").load())
        log = tmp / "logs" / "r1-rank0.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"HF_TOKEN={CANARY}\nTraceback: bad token {CANARY}\n")
        from llmgw.agent.engineprocs import Exit

        proc.exit = Exit(1)
        await sup2.tick()
        (st,) = sup2.statuses()
        assert st.state == "failed"
        assert st.log_tail
        assert not any(CANARY in line for line in st.log_tail)

    async def test_policy_applies_to_env_from_names(self, parts: dict[str, Any]) -> None:
        """Policy applies to env_from names."""
        sup, spawner = parts["sup"], parts["spawner"]
        sup.apply([spec(env_from={"LD_PRELOAD": SecretRef(env="HOME")})])
        (st,) = sup.statuses()
        assert st.state == "failed"
        assert "spec env_from LD_PRELOAD is not allowed on this node" in st.log_tail[0]
        assert spawner.spawned == []


class TestSecretEnv:
    """Only the agent's secret_env variables may be read by `{env: VAR}`, and only the
    engines whose spec reads one get it (docs/security.md, "Secrets in specs")."""

    async def test_an_undeclared_variable_is_refused_naming_it_never_its_value(
        self, parts: dict[str, Any], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """By default (no secret_env) a spec cannot read what the agent happens to hold."""
        sup, spawner = parts["sup"], parts["spawner"]
        monkeypatch.setenv("CLOUD_SECRET_KEY_FOR_TEST", CANARY)
        sup.apply([spec(env_from={"HF_TOKEN": SecretRef(env="CLOUD_SECRET_KEY_FOR_TEST")})])
        (st,) = sup.statuses()
        assert st.state == "failed"
        assert st.log_tail == (
            "llmgw agent: spec env_from HF_TOKEN reads the agent's variable "
            "CLOUD_SECRET_KEY_FOR_TEST, which is not allowed on this node (the agent's "
            "secret_env)",
        )
        assert CANARY not in msgspec.json.encode(sup.statuses()).decode()
        assert spawner.spawned == []

    async def test_a_declared_variable_reaches_only_the_engine_that_reads_it(
        self, parts: dict[str, Any], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A declared variable reaches only the engine that reads it."""
        sup, spawner = parts["sup"], parts["spawner"]
        monkeypatch.setenv("HF_SRC_FOR_TEST", CANARY)
        sup.policy = policy_of((), (), {"HF_SRC_FOR_TEST"})
        refs = {"HF_TOKEN": SecretRef(env="HF_SRC_FOR_TEST")}
        sup.apply([spec("r1", env_from=refs), spec("r2")])
        assert [st.state for st in sup.statuses()] == ["starting", "starting"]
        by_key = {env.get("HF_TOKEN"): env for _, env, _ in spawner.spawned}
        # Under the spec's name, to the engine that reads it; the other is given nothing.
        assert set(by_key) == {CANARY, None}
        assert CANARY not in by_key[None].values()

    async def test_the_policy_reported_lists_the_variables(self, parts: dict[str, Any]) -> None:
        """What the heartbeat carries: the controller judges references by it."""
        policy = policy_of((), (), ["B_SRC", "A_SRC", "B_SRC"])
        assert policy.secret_env == ("A_SRC", "B_SRC")
        assert parts["sup"].policy.secret_env == ()


class TestSpawnerWithholds:
    """The spawner never lets an engine inherit the agent's secret environment."""

    def test_secret_env_is_never_inherited(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The real spawner: a withheld variable reaches an engine only through `env`
        (tests/integration/test_secret_refs.py reads real engines' /proc/PID/environ)."""
        from llmgw.agent import engineprocs

        given: list[dict[str, str]] = []

        def popen(*_args: Any, env: dict[str, str], **_kw: Any) -> Any:
            given.append(env)
            raise OSError("not started in a unit test")

        monkeypatch.setattr(engineprocs.subprocess, "Popen", popen)
        monkeypatch.setenv("HF_SRC_FOR_TEST", CANARY)
        monkeypatch.setenv("HARMLESS_FOR_TEST", "1")
        spawner = engineprocs.PopenSpawner(withheld=("HF_SRC_FOR_TEST",))
        for env in ({}, {"HF_TOKEN": CANARY}):
            with pytest.raises(engineprocs.SpawnError):
                spawner.spawn(["engine"], env, tmp_path / "e.log")
        plain, reads = given
        assert "HF_SRC_FOR_TEST" not in plain
        assert plain["HARMLESS_FOR_TEST"] == "1"
        assert CANARY not in plain.values()
        assert "HF_SRC_FOR_TEST" not in reads
        assert reads["HF_TOKEN"] == CANARY
        # The log header names variables, never values.
        assert CANARY not in (tmp_path / "e.log").read_text()
