"""LoRA adapters as models: the controller's rules, the agent's flags, the sim-engine's
registry and the store's round trip (docs/sleep-and-adapters.md)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import msgspec
import pytest

from llmgw.agent.adapters import AdapterState, start_args
from llmgw.agent.ports import PortAllocator
from llmgw.agent.statefile import StateStore
from llmgw.agent.supervisor import Supervisor
from llmgw.controller.api.decode import decode_specs
from llmgw.controller.errors import Conflict, DoesNotExist, InvalidSpec
from llmgw.controller.fleet import commands
from llmgw.controller.fleet.endpoints import endpoint_list, outlook
from llmgw.controller.fleet.records import Adapter, Changes
from llmgw.controller.store import open_store
from llmgw.router.request.lora import Rename, select
from llmgw.runtime.clock import ManualClock
from llmgw.simengine.lora import LoraRegistry, LoraSettings, parse_modules
from llmgw.simengine.main import config_from_args
from llmgw.simengine.main import parser as sim_parser
from llmgw.wire.adapters import AdapterSpec, loads_at_run_time
from llmgw.wire.agent import ShardSpec
from llmgw.wire.models import ScaleRequest
from tests.unit.controller_reconcile_world import World, spec
from tests.unit.test_agent_supervisor import FakeProbe, FakeSpawner
from tests.unit.test_agent_supervisor import spec as sup_spec


def lora(name: str, base: str = "m", source: str = "/a") -> AdapterSpec:
    return AdapterSpec(name=name, adapter_of=base, source=source)


def world_with_base(engine: str = "sim") -> World:
    w = World()
    w.node("n1", 2)
    w.model(msgspec.structs.replace(spec("m", min_replicas=1), engine=engine))  # type: ignore[arg-type]
    return w


class TestApplyAdapters:
    """Applying LoRA adapters beside their base model, and the refusals."""

    def test_adapter_with_its_base_in_one_request(self) -> None:
        """A base and its adapter in one request are both applied, the adapter evented."""
        w = World()
        batch = commands.apply_models(w.state, [spec("m"), lora("a")], now=w.now)
        assert [a.name for a in batch.changes.adapters] == ["a"]
        assert [e.kind for e in batch.changes.events] == ["model.applied", "adapter.applied"]

    def test_unknown_base_is_refused_with_the_reason(self) -> None:
        """An adapter whose base no model is: 422 on adapter_of, saying how to fix it."""
        w = World()
        with pytest.raises(InvalidSpec) as exc:
            commands.apply_models(w.state, [lora("a", base="nope")], now=w.now)
        assert exc.value.param == "[0].adapter_of"
        assert "no model named 'nope'" in str(exc.value)

    def test_adapter_of_an_adapter_is_refused(self) -> None:
        """An adapter's base must be a model, not another adapter (stored or in the request)."""
        w = world_with_base()
        w.apply(commands.apply_models(w.state, [lora("a")], now=w.now).changes)
        for entries in ([lora("b", base="a")], [lora("c"), lora("d", base="c")]):
            with pytest.raises(InvalidSpec, match="adapters of adapters"):
                commands.apply_models(w.state, entries, now=w.now)

    def test_alias_as_base_names_the_model(self) -> None:
        """A base given by an alias is refused, naming the model to use instead."""
        w = World()
        w.model(msgspec.structs.replace(spec("m"), aliases=("mm",)))
        with pytest.raises(InvalidSpec, match="alias of 'm'"):
            commands.apply_models(w.state, [lora("a", base="mm")], now=w.now)

    def test_engine_without_adapters_is_refused(self) -> None:
        """A base on an engine the agent renders no LoRA flags for refuses the adapter."""
        w = world_with_base(engine="sglang")
        with pytest.raises(InvalidSpec, match="cannot serve LoRA adapters"):
            commands.apply_models(w.state, [lora("a")], now=w.now)

    def test_a_base_turning_llamacpp_checks_its_adapters_paths(self) -> None:
        """A sim base whose adapter's path holds ',' cannot become llama.cpp: the path
        rule an adapter meets when applied holds when its base changes engine too."""
        w = world_with_base()
        w.apply(commands.apply_models(w.state, [lora("a", source="/x,y")], now=w.now).changes)
        llama = msgspec.structs.replace(spec("m", min_replicas=1), engine="llamacpp", source="/m")
        with pytest.raises(InvalidSpec, match="a path with ',' or ':' cannot be given") as exc:
            commands.apply_models(w.state, [llama], now=w.now)
        assert "adapter 'a'" in exc.value.message
        # With the adapter's path fixed in the same request, the base may change.
        fixed = lora("a", source="/x")
        assert commands.apply_models(w.state, [llama, fixed], now=w.now).changes.models

    @pytest.mark.parametrize("source", ["/p\x00q", "/p\nq", "/p\x1b[2Jq", "/p\x7fq"])
    def test_a_source_with_a_control_character_is_refused(self, source: str) -> None:
        """A path holding NUL or another control character is refused on source: with NUL
        in the start flags every new replica of the base failed to start."""
        w = world_with_base()
        with pytest.raises(InvalidSpec, match="control character") as exc:
            commands.apply_models(w.state, [lora("a", source=source)], now=w.now)
        assert exc.value.param == "[0].source"

    def test_names_shared_with_models_are_conflicts(self) -> None:
        """An adapter named like a model, or a model named like an adapter, is a conflict."""
        w = world_with_base()
        w.model(spec("other"))
        with pytest.raises(Conflict):
            commands.apply_models(w.state, [lora("other")], now=w.now)
        w.apply(commands.apply_models(w.state, [lora("a")], now=w.now).changes)
        with pytest.raises(Conflict):
            commands.apply_models(w.state, [spec("a")], now=w.now)

    def test_an_alias_given_up_in_the_request_may_name_an_adapter(self) -> None:
        """A request that drops a model's alias and applies an adapter by that name is
        applied, as a request moving a name between models is; without the model's new
        spec the alias stands, a conflict naming the model."""
        w = world_with_base()
        aliased = msgspec.structs.replace(spec("b", min_replicas=0), aliases=("b-alias",))
        w.apply(commands.apply_models(w.state, [aliased], now=w.now).changes)
        with pytest.raises(Conflict, match="alias of model 'b'"):
            commands.apply_models(w.state, [lora("b-alias", base="b")], now=w.now)
        plain = msgspec.structs.replace(aliased, aliases=())
        batch = commands.apply_models(w.state, [plain, lora("b-alias", base="b")], now=w.now)
        assert [a.name for a in batch.changes.adapters] == ["b-alias"]

    def test_static_base_rolls_over_runtime_base_does_not(self) -> None:
        """A llama.cpp base (adapters at start only) rolls over for a new adapter; a sim
        base loads it where it runs."""
        for engine, rolls in (("llamacpp", True), ("sim", False)):
            w = world_with_base(engine=engine)
            w.clock.advance(5)
            batch = commands.apply_models(w.state, [lora("a")], now=w.now)
            assert bool(batch.changes.models) is rolls, engine

    def test_delete_adapter_and_base_with_adapters(self) -> None:
        """Deleting an adapter removes only it; a base serving adapters cannot be deleted."""
        w = world_with_base()
        w.apply(commands.apply_models(w.state, [lora("a")], now=w.now).changes)
        with pytest.raises(Conflict, match="delete them first"):
            commands.delete_model(w.state, w.index, "m", now=w.now, grace_s=1)
        batch = commands.delete_model(w.state, w.index, "a", now=w.now, grace_s=1)
        assert (batch.changes.deleted_adapters, batch.changes.deleted_models) == (["a"], [])

    def test_scaling_an_adapter_or_an_alias_names_the_model(self) -> None:
        """`scale` of an adapter or an alias is refused naming the model to scale instead
        of "no model named" alone, which reads as if the name were unknown."""
        w = world_with_base()
        w.apply(commands.apply_models(w.state, [lora("a")], now=w.now).changes)
        aliased = msgspec.structs.replace(spec("b", min_replicas=0), aliases=("b-alias",))
        w.apply(commands.apply_models(w.state, [aliased], now=w.now).changes)
        req = ScaleRequest(max_replicas=3)
        with pytest.raises(DoesNotExist, match="'a' is a LoRA adapter of 'm'"):
            commands.scale_model(w.state, "a", req, now=w.now)
        with pytest.raises(DoesNotExist, match="'b-alias' is an alias of 'b'"):
            commands.scale_model(w.state, "b-alias", req, now=w.now)
        with pytest.raises(DoesNotExist, match="'b-alias' is an alias of 'b'"):
            commands.delete_model(w.state, w.index, "b-alias", now=w.now, grace_s=1)

    def test_api_refuses_base_fields_on_an_adapter(self) -> None:
        """An adapter entry with a base's field (engine) is a 422 that says why."""
        with pytest.raises(InvalidSpec, match="only name, adapter_of and source"):
            decode_specs(b'{"name": "a", "adapter_of": "m", "source": "/x", "engine": "sim"}')
        assert decode_specs(b'{"name": "a", "adapter_of": "m", "source": "/x"}') == [
            lora("a", source="/x")
        ]


class TestAdaptersInLists:
    """Loaded adapters in endpoint lists, outlooks and demand."""

    def test_loaded_adapters_join_the_replica_and_known_names(self) -> None:
        """A ready replica lists the adapters its engine reported; every adapter is known."""
        w = world_with_base()
        w.apply(commands.apply_models(w.state, [lora("a"), lora("b")], now=w.now).changes)
        w.tick()
        rid = w.only("m").id
        desired = w.heartbeat("n1", {rid: "ready"})
        assert desired[0].adapters == {"a": "/a", "b": "/a"}
        r = w.state.replicas[rid]
        w.state.replicas[rid] = dataclasses.replace(
            r, shards=(dataclasses.replace(r.shards[0], adapters=("a", "gone")),)
        )
        eps = endpoint_list(w.state, w.index, version=1)
        assert eps.endpoints[0].models == ("m", "a")
        assert eps.models == ("a", "b", "m")

    def test_outlook_carries_the_adapters_with_their_base(self) -> None:
        """A base that cannot be placed refuses its adapters' requests with the same reason."""
        w = World()
        w.model(spec("m"))
        w.apply(commands.apply_models(w.state, [lora("a")], now=w.now).changes)
        (look,) = outlook(w.state, w.index, unplaceable={"m": "no GPUs"}, evicting={})
        assert look.models == ("m", "a")

    def test_adapter_demand_scales_its_base_from_zero(self) -> None:
        """Requests held for an adapter count as demand for its base at zero replicas."""
        w = World()
        w.node("n1", 2)
        w.model(spec("m", min_replicas=0, max_replicas=1), desired=0)
        w.apply(commands.apply_models(w.state, [lora("a")], now=w.now).changes)
        w.report(demand={"a": 2})
        w.tick()
        assert len(w.replicas("m")) == 1


class TestStoreRoundTrip:
    """Adapters survive a store reload apart from models."""

    @pytest.mark.parametrize("url", ["memory://", "sqlite"])
    def test_adapters_survive_a_reload_apart_from_models(self, url: str, tmp_path: Path) -> None:
        """Adapters share the models table yet load as adapters, and delete as such."""
        store = open_store(f"sqlite:///{tmp_path}/s.db" if url == "sqlite" else url)
        try:
            w = World()
            m = w.model(spec("m"))
            a = Adapter(spec=lora("a"), updated_at=3.0)
            store.apply(Changes(models=[m], adapters=[a]))
            state = store.load()
            assert (list(state.models), state.adapters) == (["m"], {"a": a})
            store.apply(Changes(deleted_adapters=["a"]))
            assert store.load().adapters == {}
        finally:
            store.close()


def shard(engine: str, adapters: dict[str, str]) -> ShardSpec:
    return ShardSpec(
        replica_id="r1",
        rank=0,
        model="base",
        served_names=("base",),
        engine=engine,  # type: ignore[arg-type]
        gpu_indices=(0,),
        adapters=adapters,
    )


class TestAgentFlags:
    """The adapter flags the agent gives each engine."""

    def test_vllm_lists_every_adapter(self) -> None:
        """vLLM: LoRA on, one slot per adapter up to the cap, name=path modules in order."""
        args = start_args(shard("vllm", {"b": "/p/b", "a": "/p/a"}), {})
        assert args == ["--enable-lora", "--max-loras", "2", "--lora-modules", "a=/p/a", "b=/p/b"]

    @pytest.mark.parametrize("engine", ["vllm", "sim"])
    def test_odd_paths_reach_the_engine_unchanged(self, engine: str) -> None:
        """A source with '=', ',', ':' or spaces is read back by vLLM's --lora-modules rule
        (the sim-engine's copy) as the same name and path: `name=path` split it apart."""
        adapters = {"a": "/l/a=1", "b": "/l/b,c", "c": "/l/c d:e", "d": "/l/d"}
        args = start_args(shard(engine, adapters), {})
        items = args[args.index("--lora-modules") + 1 :]
        assert dict(parse_modules(items)) == adapters
        assert "d=/l/d" in items  # plain paths keep the readable form

    def test_vllm_runtime_starts_with_lora_on(self) -> None:
        """A vLLM base allowed to load at run time has LoRA on without adapters yet."""
        env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
        assert loads_at_run_time("vllm", env)
        assert start_args(shard("vllm", {}), env)[:3] == ["--enable-lora", "--max-loras", "8"]
        assert start_args(shard("vllm", {}), {}) == []
        assert start_args(shard("sim", {}), {}) == []

    def test_llamacpp_adapters_unapplied_by_default(self) -> None:
        """llama.cpp: every file at scale 0 in name order; a path it cannot take fails."""
        args = start_args(shard("llamacpp", {"b": "/b.gguf", "a": "/a.gguf"}), {})
        assert args == ["--lora-scaled", "/a.gguf:0,/b.gguf:0"]
        with pytest.raises(ValueError, match="cannot be given"):
            start_args(shard("llamacpp", {"a": "/x:y.gguf"}), {})

    def test_runtime_sync_backs_off_a_refused_load(self) -> None:
        """A load the engine refused is not retried before its backoff ends."""
        st = AdapterState(served={"old": "/o"})
        st.retry_at["bad"] = 100.0
        assert st.todo({"bad": "/x", "new": "/y"}, now=50.0) == (["new"], ["old"])
        assert st.todo({"bad": "/x"}, now=101.0) == (["bad"], ["old"])


class TestSimRegistry:
    """The sim-engine's adapter registry."""

    def test_modules_parse_both_forms(self) -> None:
        """--lora-modules takes name=path and vLLM's JSON objects; anything else is refused."""
        assert parse_modules(["a=/x", '{"name": "b", "path": "/y"}']) == (("a", "/x"), ("b", "/y"))
        with pytest.raises(ValueError, match="name=path"):
            parse_modules(["nopath"])

    @pytest.mark.parametrize("item", ["a=/l/x=y", "a=/l/x,y", "a=/l/x=y,z"])
    def test_modules_split_as_vllm_splits_them(self, item: str) -> None:
        """An item with a second '=' or a ',' is refused as vLLM refuses it (LoRAParserAction:
        `name=path` only without ',', split on every '='; else JSON), not read leniently."""
        with pytest.raises(ValueError, match="--lora-modules"):
            parse_modules([item])

    def test_json_items_carry_any_path(self) -> None:
        """vLLM's JSON form carries a path with '=', ',', ':' and spaces unchanged."""
        item = '{"name": "a", "path": "/l/x=1, y:2"}'
        assert parse_modules([item]) == (("a", "/l/x=1, y:2"),)

    def test_first_use_reads_once_and_lru_evicts(self) -> None:
        """Concurrent first requests read an adapter in once; beyond the cache the least
        recently used one is evicted and read again at its next use."""
        reg = LoraRegistry(LoraSettings(enabled=True, max_loras=1, max_cpu_loras=2, load_ms=0))

        async def go() -> None:
            await asyncio.gather(reg.use("a"), reg.use("a"), reg.use("a"))
            await reg.use("b")
            await reg.use("c")
            await reg.use("a")

        asyncio.run(go())
        assert (reg.loads, reg.evictions) == (4, 2)


class TestRouterLlamacpp:
    """The router's adapter rewrite for llama.cpp."""

    def test_select_adds_the_position(self) -> None:
        """The body keeps its fields and gains llama-server's per-request adapter list."""
        out = msgspec.json.decode(select(b'{"model":"ad","max_tokens":3}', 2))
        assert out == {"model": "ad", "max_tokens": 3, "lora": [{"id": 2, "scale": 1.0}]}

    @pytest.mark.parametrize("cut", range(1, 40))
    def test_rename_survives_any_split(self, cut: int) -> None:
        """However a stream is cut into chunks, every `model` field carries the adapter."""
        answer = b'data: {"id":"x","model":"tiny","choices":[]}\n\ndata: {"model":"tiny"}\n\n'
        r = Rename("ad-a")
        out = r.feed(answer[:cut]) + r.feed(answer[cut:]) + r.flush()
        assert out == answer.replace(b'"model":"tiny"', b'"model":"ad-a"')

    def test_rename_leaves_text_alone(self) -> None:
        """A `"model":"` inside generated text is escaped JSON and stays as it was."""
        answer = b'{"content":"say \\"model\\":\\"x\\"","model":"tiny"}'
        assert Rename("a").feed(answer) == answer.replace(b'"model":"tiny"', b'"model":"a"')


class FakeAdapterClient:
    """The engine's runtime routes: loads succeed unless the path is refused; a load of a
    path in `hang` is never answered."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.refuse: set[str] = set()
        self.hang: set[str] = set()

    async def load(self, host: str, port: int, api_key: str, name: str, path: str) -> str | None:
        self.calls.append(("load", name))
        if path in self.hang:
            await asyncio.Event().wait()
        return "HTTP 400: no such adapter" if path in self.refuse else None

    async def unload(self, host: str, port: int, api_key: str, name: str) -> str | None:
        self.calls.append(("unload", name))
        return None

    async def close(self) -> None:
        pass


class TestAgentRuntimeLoading:
    """Adapters loaded into a running engine without a restart."""

    @pytest.fixture
    def rig(self, tmp_path: Path) -> tuple[Supervisor, FakeProbe, FakeAdapterClient, ManualClock]:
        clock = ManualClock()
        client = FakeAdapterClient()
        probe = FakeProbe()
        sup = Supervisor(
            log_dir=tmp_path / "logs",
            store=StateStore(tmp_path / "state", node="n1"),
            ports=PortAllocator(21000, 21009, is_free=lambda p: True),
            spawner=FakeSpawner(),
            probe=probe,
            clock=clock,
            adapter_client=client,
        )
        return sup, probe, client, clock

    async def test_new_adapters_load_without_a_restart(
        self, rig: tuple[Supervisor, FakeProbe, FakeAdapterClient, ManualClock]
    ) -> None:
        """Started with one adapter, a sim engine is given a second at run time and loses
        the first, reporting what it serves; a refused load waits out its backoff."""
        sup, probe, client, clock = rig
        sup.apply([sup_spec(adapters={"a": "/a"})])
        probe.ready_ports.add(21000)
        await sup.tick()
        assert sup.statuses()[0].adapters == ("a",)
        client.refuse.add("/bad")
        sup.apply([sup_spec(adapters={"b": "/b", "c": "/bad"})])
        await sup.tick()
        (st,) = sup.statuses()
        assert (st.pid, st.adapters) == (101, ("b",))
        assert client.calls == [("unload", "a"), ("load", "b"), ("load", "c")]
        await sup.tick()
        assert len(client.calls) == 3
        clock.advance(31)
        await sup.tick()
        assert client.calls[-1] == ("load", "c")

    async def test_a_new_source_is_loaded_in_place_of_the_old(
        self, rig: tuple[Supervisor, FakeProbe, FakeAdapterClient, ManualClock]
    ) -> None:
        """An adapter applied again with another source is unloaded and loaded from the new
        path, not left serving the old one because its name is already served."""
        sup, probe, client, _ = rig
        sup.apply([sup_spec(adapters={"a": "/old"})])
        probe.ready_ports.add(21000)
        await sup.tick()
        sup.apply([sup_spec(adapters={"a": "/new"})])
        await sup.tick()
        assert client.calls == [("unload", "a"), ("load", "a")]
        assert sup.statuses()[0].adapters == ("a",)
        await sup.tick()
        assert len(client.calls) == 2

    async def test_a_hung_load_holds_up_no_other_engine(
        self, rig: tuple[Supervisor, FakeProbe, FakeAdapterClient, ManualClock]
    ) -> None:
        """An engine that never answers a load leaves the tick free: another engine
        becomes ready and loads its adapter meanwhile."""
        sup, probe, client, _ = rig
        client.hang.add("/slow")
        sup.apply([sup_spec(adapters={"a": "/a"})])
        probe.ready_ports.add(21000)
        await sup.tick()
        first = sup_spec(adapters={"slow": "/slow"})
        second = sup_spec("r2", adapters={"b": "/b"}, gpu_indices=(1,))
        sup.apply([first, second])
        probe.ready_ports.add(21001)
        await asyncio.wait_for(sup.tick(), timeout=5)
        await asyncio.wait_for(sup.tick(), timeout=5)
        assert [(st.state, st.adapters) for st in sup.statuses()] == [
            ("ready", ()),
            ("ready", ("b",)),
        ]
        assert client.calls.count(("load", "slow")) == 1
        await asyncio.wait_for(sup.close(), timeout=5)

    async def test_start_only_engine_keeps_what_it_started_with(
        self, rig: tuple[Supervisor, FakeProbe, FakeAdapterClient, ManualClock]
    ) -> None:
        """A llama.cpp engine is never sent runtime loads and keeps reporting (and
        recording) the adapters it started with, whose positions routers rely on."""
        sup, probe, client, _ = rig
        sup.apply([sup_spec(engine="llamacpp", adapters={"b": "/b"})])
        probe.ready_ports.add(21000)
        await sup.tick()
        sup.apply([sup_spec(engine="llamacpp", adapters={"a": "/a", "b": "/b"})])
        await sup.tick()
        assert sup.statuses()[0].adapters == ("b",)
        assert client.calls == []


class TestSimFlags:
    """The sim-engine's LoRA flags."""

    def test_lora_flags_are_read(self) -> None:
        """vLLM's LoRA flags fill the sim-engine's settings; kept loaded defaults to slots."""
        args, _ = sim_parser().parse_known_args(
            ["--model", "m", "--enable-lora", "--max-loras", "2", "--lora-modules", "a=/a"]
        )
        lora_cfg = config_from_args(args).lora
        assert (lora_cfg.enabled, lora_cfg.cache_size, lora_cfg.modules) == (
            True,
            2,
            (("a", "/a"),),
        )

    @pytest.mark.parametrize(
        ("argv", "says"),
        [
            (["--lora-modules", "a=/a"], "needs --enable-lora"),
            (["--enable-lora", "--lora-modules", "a"], "name=path"),
            (["--enable-lora", "--max-loras", "0"], "must be >= 1"),
        ],
    )
    def test_bad_lora_flags_are_refused(self, argv: list[str], says: str) -> None:
        """A module without --enable-lora, a module without a path, or no slots: refused."""
        args, _ = sim_parser().parse_known_args(["--model", "m", *argv])
        with pytest.raises(ValueError, match=says):
            config_from_args(args)
