"""Edge checks beyond the wire types: each refusal names the field; good input passes."""

from __future__ import annotations

import msgspec
import pytest

from llmgw.controller.api.decode import decode_specs
from llmgw.controller.api.validate import check_heartbeat, check_spec, check_usage
from llmgw.controller.errors import InvalidSpec
from llmgw.wire.agent import GPU, Heartbeat, ShardStatus
from llmgw.wire.models import ModelSpec
from llmgw.wire.usage import HOUR_S, MAX_HOUR, ModelLoad, UsageReport


def _gpu(i: int) -> GPU:
    return GPU(index=i, uuid=f"u{i}", name="H100", gpu_class="H100-80G", memory_mib=1)


def _hb(**kw: object) -> Heartbeat:
    base = Heartbeat(node="n", address="10.0.0.1", gpus=(_gpu(0), _gpu(1)))
    return msgspec.structs.replace(base, **kw)


def _param(check: object, value: object) -> str | None:
    with pytest.raises(InvalidSpec) as info:
        check(value)  # type: ignore[operator]
    return info.value.param


class TestHeartbeat:
    """Heartbeat checks pass good input and name the field of bad input."""

    def test_a_plain_heartbeat_passes(self) -> None:
        """What an agent sends passes untouched."""
        check_heartbeat(
            _hb(shards=(ShardStatus(replica_id="r", rank=0, state="ready", port=21000),))
        )

    @pytest.mark.parametrize(
        ("fields", "param"),
        [
            ({"address": ""}, "address"),
            ({"address": "0.0.0.0"}, "address"),
            ({"address": "::"}, "address"),
            ({"address": "[::]"}, "address"),
            ({"port_range": (22000, 21000)}, "port_range"),
            ({"port_range": (0, 10)}, "port_range"),
            ({"gpus": (_gpu(3), _gpu(3))}, "gpus[1].index"),
            ({"gpus": (_gpu(-1),)}, "gpus[0].index"),
            ({"shards": (ShardStatus(replica_id="r", rank=-1, state="ready"),)}, "shards[0].rank"),
            (
                {"shards": (ShardStatus(replica_id="r", rank=0, state="ready", port=70000),)},
                "shards[0].port",
            ),
        ],
    )
    def test_refusals_name_the_field(self, fields: dict[str, object], param: str) -> None:
        """Values placement or routing would misread are refused, naming the field."""
        assert _param(check_heartbeat, _hb(**fields)) == param


class TestUsage:
    """Usage report checks refuse negative and non-finite figures."""

    def test_zeros_pass(self) -> None:
        """Zero counts are readings, not errors."""
        check_usage(
            UsageReport(
                router_id="r", sent_at=1.0, inflight={"x": 0}, demand={"m": 0},
                load={"m": ModelLoad()},
            )
        )  # fmt: skip

    @pytest.mark.parametrize(
        ("report", "param"),
        [
            (UsageReport(router_id="", sent_at=1.0), "router_id"),
            (UsageReport(router_id="r", sent_at=1.0, inflight={"x": -1}), "inflight.x"),
            (UsageReport(router_id="r", sent_at=1.0, demand={"m": -1}), "demand.m"),
            (
                UsageReport(router_id="r", sent_at=1.0, load={"m": ModelLoad(interval_s=-2.0)}),
                "load.m.interval_s",
            ),
        ],
    )
    def test_negative_counts_are_refused(self, report: UsageReport, param: str) -> None:
        """No router can have seen a negative count; autoscaling must not read one."""
        assert _param(check_usage, report) == param

    def test_a_non_finite_sent_at_is_refused(self) -> None:
        """An infinite sent_at would outrank every later report of that router."""
        assert _param(check_usage, UsageReport(router_id="r", sent_at=float("inf"))) == "sent_at"


class TestUsageHour:
    """A usage row's hour is bounded where the store can keep it."""

    def test_an_hour_past_year_9999_is_refused_by_the_schema(self) -> None:
        """The last hour of 9999 decodes; the next, or one too large for a 64-bit
        column, is a validation error naming the field, not a failed write."""
        row = {"key": "k", "model": "m"}
        body = {"router_id": "r", "sent_at": 1.0, "tokens": [{**row, "hour": MAX_HOUR}]}
        assert msgspec.json.decode(msgspec.json.encode(body), type=UsageReport).tokens
        for hour in (MAX_HOUR + HOUR_S, 3600 * 10**20):
            body["tokens"] = [{**row, "hour": hour}]
            with pytest.raises(msgspec.ValidationError, match=r"tokens\[0\]\.hour"):
                msgspec.json.decode(msgspec.json.encode(body), type=UsageReport)


class TestUsageNames:
    """A report's names hold no control character, a line end at their end included."""

    @pytest.mark.parametrize("field", ["router_id", "counter_id"])
    def test_a_trailing_line_end_is_refused(self, field: str) -> None:
        """A router_id or counter_id ending in a line end is refused as any other control
        character is (Python's `$` matches before one), not kept and shown in tables."""
        body = {"router_id": "r", "sent_at": 1.0, field: "r1\n"}
        with pytest.raises(msgspec.ValidationError, match=rf"at `\$\.{field}`"):
            msgspec.json.decode(msgspec.json.encode(body), type=UsageReport)


class TestHeartbeatMemory:
    """Memory figures in a heartbeat are bounded where the store can keep them."""

    def test_memory_past_an_exbibyte_is_refused_by_the_schema(self) -> None:
        """2**40 MiB decodes; one more, for the node or a card, is a validation error."""
        base = msgspec.to_builtins(Heartbeat(node="n", address="10.0.0.1", gpus=(_gpu(0),)))
        ok = {**base, "host_memory_mib": 2**40}
        assert msgspec.convert(ok, Heartbeat).host_memory_mib == 2**40
        with pytest.raises(msgspec.ValidationError, match="host_memory_mib"):
            msgspec.convert({**base, "host_memory_mib": 2**63}, Heartbeat)
        card = {**base["gpus"][0], "memory_mib": 2**40 + 1}
        with pytest.raises(msgspec.ValidationError, match="memory_mib"):
            msgspec.convert({**base, "gpus": [card]}, Heartbeat)


class TestSpec:
    """Spec checks name an empty GPU class."""

    def test_empty_gpu_class_is_named(self) -> None:
        """A blank GPU class could never be placed: the field is named."""
        spec = ModelSpec(name="m", engine="sim", gpu_classes=("H100-80G", " "))
        assert check_spec(spec) == ("gpu_classes", "a GPU class must not be empty")
        assert check_spec(ModelSpec(name="m", engine="sim", gpu_classes=("H100-80G",))) is None


class TestSpecLabel:
    """A refused spec is named by its position and name as the body gave them."""

    @pytest.mark.parametrize(
        ("body", "said"),
        [
            (b"{}", "model spec (no name): Object missing required field `name`"),
            (b'{"name": 5}', "model spec (no name): Expected `str`, got `int`"),
            (b'{"name": "m"}', "model spec 'm': Object missing required field `engine`"),
            (b"[{}]", "model spec models[0]: Object missing required field `name`"),
            (b'[{"name": ["m"]}]', "model spec models[0]: Expected `str`, got `array`"),
            (b'[{"name": "m"}]', "model spec models[0] ('m'): Object missing required field"),
            (b'{"adapter_of": "m"}', "adapter spec (no name): Object missing required field"),
        ],
    )
    def test_a_missing_or_odd_name_is_not_shown_as_a_value(self, body: bytes, said: str) -> None:
        """A spec without a string name is "(no name)" or its position, never `None`."""
        with pytest.raises(InvalidSpec) as info:
            decode_specs(body)
        assert info.value.message.startswith(said), info.value.message
