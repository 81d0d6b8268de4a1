"""Precise mode for a controller-managed model: the spec's `routing`, the agent's
publisher ports and `--kv-events-config`, and the controller's endpoint fields."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from llmgw.agent.ports import PortAllocator
from llmgw.agent.statefile import StateStore
from llmgw.agent.supervisor import Supervisor
from llmgw.agent.templates import KVEventPorts, render
from llmgw.controller.api.decode import decode_specs
from llmgw.controller.errors import InvalidSpec
from llmgw.controller.fleet.endpoints import endpoint_list
from llmgw.runtime.clock import ManualClock
from llmgw.wire.agent import ShardSpec
from llmgw.wire.models import ModelSpec, RoutingSpec, routing_problem
from llmgw.wire.policy import SpecPolicy
from tests.unit.controller_reconcile_world import World, spec
from tests.unit.test_agent_supervisor import FakeProbe, FakeSpawner


def raw_spec(engine: str = "sim", **routing: Any) -> dict[str, Any]:
    return {"name": "m", "engine": engine, "gpu_classes": ["H100-80G"], "routing": routing}


def with_routing(s: ModelSpec, **routing: Any) -> ModelSpec:
    return msgspec.structs.replace(s, routing=RoutingSpec(**routing))


class TestSpec:
    """The spec's routing section, accepted and refused."""

    @pytest.mark.parametrize(
        ("raw", "field", "words"),
        [
            (raw_spec("sglang", kv_events=True), "routing.kv_events", "radix-cache page"),
            (raw_spec("llamacpp", kv_events=True), "routing.kv_events", "publishes no KV"),
            (raw_spec("vllm", kv_events=True), "routing.tokenizer", "needs its model's tokenizer"),
            (raw_spec("vllm", kv_events=True, tokenizer="sim"), "routing.tokenizer", "hf:"),
            (raw_spec("sim", kv_events=True, tokenizer="hf:/t.json"), "routing.tokenizer", "sim"),
            (raw_spec("sim", tokenizer="sim"), "routing.tokenizer", "only used with kv_events"),
            (raw_spec("sim", kv_events=True, tokenizer="gpt2"), "routing.tokenizer", "expected"),
            (raw_spec("sim", kv_events=True, tokenizer="hf:"), "routing.tokenizer", "expected"),
        ],
    )
    def test_apply_refuses_naming_the_field(
        self, raw: dict[str, Any], field: str, words: str
    ) -> None:
        """A 422 whose param is the routing field and whose message says why."""
        with pytest.raises(InvalidSpec) as exc:
            decode_specs(json.dumps(raw).encode())
        assert exc.value.param == field
        assert words in str(exc.value)
        assert "nothing was applied" in str(exc.value)

    def test_unknown_routing_field_is_named(self) -> None:
        """Unknown routing field is named."""
        with pytest.raises(InvalidSpec) as exc:
            decode_specs(json.dumps(raw_spec("sim", kv_event=True)).encode())
        assert exc.value.param == "routing.kv_event"

    def test_accepted_shapes(self) -> None:
        """sim needs no tokenizer (its own is the default); vllm takes an hf: path."""
        (sim,) = decode_specs(json.dumps(raw_spec("sim", kv_events=True)).encode())
        assert (sim.routing.kv_events, sim.kv_tokenizer) == (True, "sim")
        (vl,) = decode_specs(
            json.dumps(raw_spec("vllm", kv_events=True, tokenizer="hf:/m/tokenizer.json")).encode()
        )
        assert vl.kv_tokenizer == "hf:/m/tokenizer.json"
        (plain,) = decode_specs(json.dumps(raw_spec("vllm")).encode())
        assert plain.routing == RoutingSpec()
        assert routing_problem(plain) is None

    def test_ctl_refuses_before_sending(self) -> None:
        """ctl refuses kv_events for an engine that cannot publish before sending."""
        from llmgw.ctl.errors import SpecError
        from llmgw.ctl.specs import validate

        with pytest.raises(SpecError) as err:
            validate([raw_spec("llamacpp", kv_events=True)], "f.yaml")
        assert "field routing.kv_events: engine llamacpp cannot be followed" in str(err.value)
        (ok,) = validate([raw_spec("sim", kv_events=True)], "f.yaml")
        assert ok.routing.kv_events

    def test_args_cannot_set_the_publisher(self) -> None:
        """The agent renders --kv-events-config itself; a spec's args may not, however spelled."""
        policy = SpecPolicy()
        for arg in ("--kv-events-config", "--kv_events_config={}", "--kv-events"):
            assert policy.refusal(env=(), env_from=(), args=("x", arg)) is not None
        assert policy.refusal(env=(), env_from=(), args=("--kv-cache-dtype", "fp8")) is None


def shard(engine: str = "vllm", **kw: Any) -> ShardSpec:
    base: dict[str, Any] = {
        "replica_id": "r-7",
        "rank": 0,
        "model": "m",
        "served_names": ("m",),
        "engine": engine,
        "gpu_indices": (0,),
        "kv_events": True,
    }
    return ShardSpec(**{**base, **kw})


def kv_config(argv: tuple[str, ...]) -> dict[str, Any]:
    i = argv.index("--kv-events-config")
    out: dict[str, Any] = json.loads(argv[i + 1])
    return out


class TestTemplate:
    """Engine command lines that publish KV events."""

    def test_vllm_binds_a_wildcard_publisher(self) -> None:
        """vLLM binds its PUB only on a wildcard address (it connects to any other)."""
        plan = render(
            shard(),
            port=21000,
            host="10.1.2.3",
            kv_events=KVEventPorts(publish=21001, replay=21002),
        )
        assert kv_config(plan.argv) == {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": "tcp://*:21001",
            "replay_endpoint": "tcp://10.1.2.3:21002",
            "topic": "r-7",
        }

    def test_sim_binds_the_advertised_address(self) -> None:
        """Sim binds the advertised address."""
        plan = render(
            shard("sim"),
            port=21000,
            host="127.0.0.1",
            kv_events=KVEventPorts(publish=21001, replay=21002),
        )
        cfg = kv_config(plan.argv)
        assert (cfg["endpoint"], cfg["replay_endpoint"]) == (
            "tcp://127.0.0.1:21001",
            "tcp://127.0.0.1:21002",
        )

    def test_the_spec_args_still_come_last(self) -> None:
        """The spec args still come last."""
        plan = render(
            shard("sim", args=("--seed", "3")),
            port=1,
            host="h",
            kv_events=KVEventPorts(publish=2, replay=3),
        )
        assert plan.argv[-2:] == ("--seed", "3")

    def test_no_ports_no_flag(self) -> None:
        """Without KV-event ports the engine gets no --kv-events-config."""
        assert "--kv-events-config" not in render(shard(), port=1, host="h").argv

    @pytest.mark.parametrize("engine", ["sglang", "llamacpp"])
    def test_engines_that_cannot_publish_are_refused(self, engine: str) -> None:
        """Engines that cannot publish are refused."""
        with pytest.raises(ValueError, match="publishes no KV events"):
            render(shard(engine), port=1, host="h", kv_events=KVEventPorts(publish=2, replay=3))


@pytest.fixture
def sup(tmp_path: Path) -> tuple[Supervisor, FakeSpawner, StateStore]:
    spawner = FakeSpawner()
    store = StateStore(tmp_path / "state", node="n1")
    s = Supervisor(
        log_dir=tmp_path / "logs",
        store=store,
        # Three ports: one kv shard takes them all.
        ports=PortAllocator(21000, 21002, is_free=lambda p: True),
        spawner=spawner,
        probe=FakeProbe(),
        clock=ManualClock(),
    )
    return s, spawner, store


class TestAgentPorts:
    """The agent's extra ports for a shard that publishes KV events."""

    def test_a_kv_shard_gets_two_more_ports_and_reports_them(
        self, sup: tuple[Supervisor, FakeSpawner, StateStore]
    ) -> None:
        """A KV shard gets two more ports and reports them."""
        s, spawner, _ = sup
        s.apply([shard("sim")])
        (st,) = s.statuses()
        assert (st.state, st.port) == ("starting", 21000)
        assert (st.kv_events_port, st.kv_events_replay_port, st.kv_events_topic) == (
            21001,
            21002,
            "r-7",
        )
        cfg = kv_config(spawner.spawned[0][0])
        assert cfg["endpoint"].endswith(":21001")
        assert cfg["replay_endpoint"].endswith(":21002")

    async def test_ports_are_held_until_the_shard_is_dropped(
        self, sup: tuple[Supervisor, FakeSpawner, StateStore]
    ) -> None:
        """While the KV shard holds the range nothing else starts; once it is gone, all free."""
        s, _, _ = sup
        s.apply([shard("sim")])
        s.apply([shard("sim"), shard("sim", replica_id="r-8", kv_events=False)])
        other = next(x for x in s.statuses() if x.replica_id == "r-8")
        assert other.state == "failed"
        assert "no free port" in other.log_tail[0]
        s.apply([])  # r-7 told to stop, the failed r-8 forgotten
        # The fake exits on SIGTERM; the next tick reaps it, the next apply drops it.
        await s.tick()
        s.apply([])
        assert s.statuses() == ()
        s.apply([shard("sim", replica_id="r-9")])
        (st,) = s.statuses()
        assert st.state == "starting"
        assert {st.port, st.kv_events_port, st.kv_events_replay_port} == {21000, 21001, 21002}

    def test_no_kv_ports_without_the_flag_or_above_rank_0(
        self, sup: tuple[Supervisor, FakeSpawner, StateStore]
    ) -> None:
        """No KV ports without the flag or above rank 0."""
        s, spawner, _ = sup
        s.apply(
            [
                shard("sim", kv_events=False),
                shard(
                    "sim", replica_id="r-w", rank=1, world_size=2, master_addr="h", master_port=1
                ),
            ]
        )
        assert all(x.kv_events_port is None and x.kv_events_topic == "" for x in s.statuses())
        assert all("--kv-events-config" not in argv for argv, _, _ in spawner.spawned)

    def test_readoption_keeps_the_ports(
        self, sup: tuple[Supervisor, FakeSpawner, StateStore], tmp_path: Path
    ) -> None:
        """A restarted agent reports the adopted engine's publisher again, and keeps its ports."""
        s, spawner, store = sup
        s.apply([shard("sim")])
        proc = spawner.spawned[0][2]
        spawner2 = FakeSpawner()
        spawner2.alive[proc.pid] = proc
        again = Supervisor(
            log_dir=tmp_path / "logs",
            store=store,
            ports=PortAllocator(21000, 21002, is_free=lambda p: True),
            spawner=spawner2,
            probe=FakeProbe(),
            clock=ManualClock(),
        )
        again.adopt(store.load())
        (st,) = again.statuses()
        assert (st.kv_events_port, st.kv_events_replay_port) == (21001, 21002)
        again.apply([shard("sim"), shard("sim", replica_id="r-8", kv_events=False)])
        other = next(x for x in again.statuses() if x.replica_id == "r-8")
        assert other.state == "failed"


class TestController:
    """The controller asks rank 0 to publish and tells routers where to follow."""

    def world(self, **routing: Any) -> World:
        w = World()
        w.node("a")
        w.model(with_routing(spec("m"), **routing))
        w.tick()
        return w

    def test_rank_0_is_asked_to_publish(self) -> None:
        """Rank 0 is asked to publish."""
        w = self.world(kv_events=True)
        rid = w.only("m").id
        (sh,) = w.heartbeat("a", {rid: "starting"})
        assert sh.kv_events

    def test_ready_replica_names_its_publisher(self) -> None:
        """Ready replica names its publisher."""
        w = self.world(kv_events=True)
        rid = w.only("m").id
        w.heartbeat("a", {rid: "ready"}, port=9000, kv_ports={rid: (9001, 9002)})
        (ep,) = endpoint_list(w.state, w.index, version=1).endpoints
        assert ep.url == "http://a.lan:9000"
        assert (ep.kv_events, ep.kv_events_replay, ep.kv_events_topic, ep.tokenizer) == (
            "tcp://a.lan:9001",
            "tcp://a.lan:9002",
            rid,
            "sim",
        )

    def test_no_reported_publisher_means_guessing(self) -> None:
        """An agent that did not start a publisher (older, or the replica predates the spec)."""
        w = self.world(kv_events=True)
        rid = w.only("m").id
        w.heartbeat("a", {rid: "ready"})
        (ep,) = endpoint_list(w.state, w.index, version=1).endpoints
        assert (ep.kv_events, ep.tokenizer) == ("", "")

    def test_a_model_without_precise_mode_is_never_followed(self) -> None:
        """A model without precise mode is never followed."""
        w = self.world()
        rid = w.only("m").id
        (sh,) = w.heartbeat("a", {rid: "ready"}, kv_ports={rid: (9001, 9002)})
        assert not sh.kv_events
        (ep,) = endpoint_list(w.state, w.index, version=1).endpoints
        assert ep.kv_events == ""

    def test_multi_node_only_rank_0_publishes(self) -> None:
        """Multi-node: only rank 0 publishes."""
        w = World()
        w.node("a")
        w.node("b")
        w.model(with_routing(spec("m", gpus_per_node=8, nodes=2), kv_events=True))
        w.tick()
        r = w.only("m")
        asked = {s.node: s.rank for s in r.shards}
        got = {n: w.heartbeat(n, {r.id: "starting"}) for n in ("a", "b")}
        for node, (sh,) in got.items():
            assert sh.kv_events == (asked[node] == 0)

    def test_turning_it_on_rolls_the_replicas_over(self) -> None:
        """The engines must be started with the publisher: a routing change is not live."""
        from llmgw.controller.fleet import commands

        w = World()
        old = w.model(spec("m"))
        batch = commands.apply_models(w.state, [with_routing(spec("m"), kv_events=True)], now=1e9)
        (m,) = batch.changes.models
        assert m.updated_at == 1e9 != old.updated_at
        assert [e.message for e in batch.changes.events] == ["updated routing; replicas roll over"]
