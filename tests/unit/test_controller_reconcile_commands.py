"""Operator commands, request validation and the endpoint sink, as pure values."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from llmgw.controller.api.decode import decode_drain, decode_specs, validation_param
from llmgw.controller.errors import Conflict, DoesNotExist, InvalidRequest, InvalidSpec
from llmgw.controller.fleet import commands
from llmgw.controller.fleet.endpoints import EndpointSink, endpoint_list
from llmgw.wire.models import ScaleRequest
from tests.unit.controller_reconcile_world import World, spec


class TestApplyModels:
    """Applying model specs starts, rolls or refuses as the spec demands."""

    def test_new_model_starts_at_its_minimum(self) -> None:
        """Applying a new spec creates the model with desired = min and one event."""
        w = World()
        batch = commands.apply_models(
            w.state, [spec("m", min_replicas=2, max_replicas=3)], now=w.now
        )
        (m,) = batch.changes.models
        assert (m.name, m.desired_replicas) == ("m", 2)
        assert [e.kind for e in batch.changes.events] == ["model.applied"]

    def test_same_spec_twice_changes_nothing(self) -> None:
        """Re-applying an identical spec is not a change and not an event."""
        w = World()
        w.model(spec("m"))
        assert not commands.apply_models(w.state, [spec("m")], now=w.now).changes

    def test_scaling_fields_do_not_roll_replicas(self) -> None:
        """Changing only priority keeps updated_at, so no replica is replaced."""
        w = World()
        m = w.model(spec("m"))
        w.clock.advance(5)
        batch = commands.apply_models(w.state, [spec("m", priority=3)], now=w.now)
        assert batch.changes.models[0].updated_at == m.updated_at

    def test_engine_relevant_change_rolls_replicas(self) -> None:
        """A new GPU width stamps updated_at: older replicas are rolled over."""
        w = World()
        w.model(spec("m"))
        w.clock.advance(5)
        batch = commands.apply_models(w.state, [spec("m", gpus_per_node=2)], now=w.now)
        assert batch.changes.models[0].updated_at == w.now
        assert "replicas roll over" in batch.changes.events[0].message

    def test_name_served_by_another_model_is_a_conflict(self) -> None:
        """An alias equal to another model's name refuses the whole list."""
        w = World()
        w.model(spec("a"))
        clash = msgspec.structs.replace(spec("b"), aliases=("a",))
        with pytest.raises(Conflict):
            commands.apply_models(w.state, [spec("c"), clash], now=w.now)

    def test_duplicate_names_in_one_request_are_refused(self) -> None:
        """The same name twice in one list is a 422 naming the second index."""
        w = World()
        with pytest.raises(InvalidSpec) as exc:
            commands.apply_models(w.state, [spec("a"), spec("a")], now=w.now)
        assert exc.value.param == "[1].name"


class TestScaleAndOthers:
    """Scale, weight, capacity and cordon commands and their refusals."""

    def test_max_below_min_after_merge_is_400(self) -> None:
        """Raising min above the current max alone is refused, naming max_replicas."""
        w = World()
        w.model(spec("m", min_replicas=1, max_replicas=2))
        with pytest.raises(InvalidRequest) as exc:
            commands.scale_model(w.state, "m", ScaleRequest(min_replicas=3), now=w.now)
        assert (type(exc.value), exc.value.param) == (InvalidRequest, "max_replicas")

    def test_scale_clamps_desired(self) -> None:
        """Lowering max below the desired count lowers desired with it."""
        w = World()
        w.model(spec("m", min_replicas=1, max_replicas=5), desired=4)
        batch = commands.scale_model(w.state, "m", ScaleRequest(max_replicas=2), now=w.now)
        assert batch.changes.models[0].desired_replicas == 2

    def test_unknown_names_are_404(self) -> None:
        """Unknown node, model and replica each raise DoesNotExist."""
        w = World()
        with pytest.raises(DoesNotExist):
            commands.set_operator_state(w.state, "nope", "cordoned", now=w.now)
        with pytest.raises(DoesNotExist):
            commands.delete_model(w.state, w.index, "nope", now=w.now, grace_s=1)
        with pytest.raises(DoesNotExist):
            commands.set_weight(w.state, "r-nope", 2.0, now=w.now)

    def test_weight_must_be_positive(self) -> None:
        """A zero weight is refused; a positive one is recorded with an event."""
        w = World()
        w.node("a")
        w.model(spec("m"))
        w.tick()
        rid = w.only("m").id
        with pytest.raises(InvalidSpec):
            commands.set_weight(w.state, rid, 0.0, now=w.now)
        batch = commands.set_weight(w.state, rid, 1.5, now=w.now)
        assert batch.changes.replicas[0].weight == 1.5

    def test_bench_capacity_is_kept_beside_the_weight(self) -> None:
        """The raw tok/s `ctl bench` measured is stored with the weight; a bad one is refused."""
        w = World()
        w.node("a")
        w.model(spec("m"))
        w.tick()
        rid = w.only("m").id
        with pytest.raises(InvalidSpec, match="capacity_tok_s"):
            commands.set_weight(w.state, rid, 1.0, now=w.now, capacity_tok_s=-3.0)
        batch = commands.set_weight(w.state, rid, 1.25, now=w.now, capacity_tok_s=640.0)
        (r,) = batch.changes.replicas
        assert (r.weight, r.capacity_tok_s) == (1.25, 640.0)
        assert "640 tok/s" in batch.changes.events[0].message

    def test_cordon_twice_is_one_event(self) -> None:
        """Cordoning a cordoned node changes nothing."""
        w = World()
        w.node("a", op="cordoned")
        assert not commands.set_operator_state(w.state, "a", "cordoned", now=w.now).changes


class TestValidation:
    """Request validation names the field, index and model at fault."""

    def test_param_names_the_field_path(self) -> None:
        """msgspec's messages become a field path for `param`."""
        assert validation_param("Expected `int`, got `str` - at `$[1].gpus_per_node`") == (
            "[1].gpus_per_node"
        )
        assert validation_param("Object contains unknown field `bogus`") == "bogus"
        assert validation_param("max_replicas (1) is below min_replicas (3)") == "max_replicas"

    def test_list_error_names_index_model_and_field(self) -> None:
        """The second spec's bad field refuses the request, naming index, model and field."""
        body = b'[{"name":"a","engine":"sim","gpu_classes":["x"]},'
        body += b'{"name":"b","engine":"sim","gpu_classes":["x"],"min_replicas":-1}]'
        with pytest.raises(InvalidSpec) as exc:
            decode_specs(body)
        assert exc.value.param == "[1].min_replicas"
        assert "models[1] ('b')" in exc.value.message

    def test_malformed_json_is_400(self) -> None:
        """A body that is not JSON is a plain InvalidRequest (400), not InvalidSpec (422)."""
        with pytest.raises(InvalidRequest) as exc:
            decode_specs(b"{nope")
        assert type(exc.value) is InvalidRequest

    def test_a_drain_without_grace_takes_the_controllers_default(self) -> None:
        """No grace_s in the body: None (the configured --drain-grace-s), not the wire's 30."""

        def parts(body: bytes) -> tuple[float | None, bool, bool]:
            req = decode_drain(body)
            grace = None if isinstance(req.grace_s, msgspec.UnsetType) else req.grace_s
            return grace, req.force, req.evict_idle

        assert parts(b"") == (None, False, False)
        assert parts(b'{"force": true}') == (None, True, False)
        assert parts(b'{"grace_s": 5}') == (5.0, False, False)
        assert parts(b'{"evict_idle": true}') == (None, False, True)

    def test_a_drain_grace_must_be_finite_and_not_negative(self) -> None:
        """A negative grace names the field."""
        with pytest.raises(InvalidSpec) as exc:
            decode_drain(b'{"grace_s": -1}')
        assert exc.value.param == "grace_s"


class TestSink:
    """The endpoint sink's list and its long poll."""

    def test_priority_scheduling_is_as_the_agent_reported(self) -> None:
        """A replica whose agent says its engine orders by priority is listed so; one
        whose agent does not say (FCFS, or an older agent) is not."""
        w = World()
        w.node("a")
        w.model(spec("m", min_replicas=2, max_replicas=2))
        w.tick()
        one, two = (r.id for r in w.replicas("m"))
        w.heartbeat("a", {one: "ready", two: "ready"}, priority=frozenset({one}))
        out = endpoint_list(w.state, w.index, version=1)
        got = {e.id: e.priority_scheduling for e in out.endpoints}
        assert got == {one: True, two: False}

    def test_list_has_ready_replicas_and_every_name(self) -> None:
        """Only ready replicas are endpoints; models lists every name and alias."""
        w = World()
        w.node("a")
        w.model(msgspec.structs.replace(spec("m", min_replicas=2, max_replicas=2), aliases=("mm",)))
        w.model(spec("idle", min_replicas=0))
        w.tick()
        first = w.replicas("m")[0].id
        w.heartbeat("a", {first: "ready"})
        out = endpoint_list(w.state, w.index, version=7)
        assert [e.id for e in out.endpoints] == [first]
        assert out.endpoints[0].models == ("m", "mm")
        assert out.models == ("idle", "m", "mm")

    async def test_long_poll_wakes_on_bump(self) -> None:
        """A waiter holding the current version returns as soon as the version moves."""
        sink = EndpointSink(start_version=10, max_waiters=4)
        waiter = asyncio.create_task(sink.wait_changed(10, timeout_s=5))
        await asyncio.sleep(0)
        assert not waiter.done()
        sink.bump()
        await asyncio.wait_for(waiter, 1)
        assert sink.version == 11

    async def test_other_version_returns_at_once(self) -> None:
        """A caller with an older (or newer, from another controller) version gets the list now."""
        sink = EndpointSink(start_version=10, max_waiters=4)
        await asyncio.wait_for(sink.wait_changed(3, timeout_s=5), 0.5)
        await asyncio.wait_for(sink.wait_changed(99, timeout_s=5), 0.5)
        await asyncio.wait_for(sink.wait_changed(None, timeout_s=5), 0.5)
