"""The controller's tracing settings, and which actions become which spans (fleet/spans.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.controller.config import parse_args
from llmgw.controller.fleet.records import Event, Replica, Shard
from llmgw.controller.fleet.spans import action_of, attributes
from llmgw.runtime.tracing import TracingSettings

URL = "http://collector:4318/v1/traces"


def ev(kind: str, message: str, *, subject: str = "replica") -> Event:
    return Event(
        id=1,
        at=10.0,
        kind=kind,
        subject=subject,  # type: ignore[arg-type]  # a Literal, checked by the cases
        subject_id="r-1" if subject == "replica" else "m",
        model="m",
        message=message,
    )


def replica(**kw: object) -> Replica:
    fields: dict[str, object] = {
        "id": "r-1",
        "model": "m",
        "state": "pending",
        "shards": (Shard(node="a-1", rank=0, gpus=(0, 1)), Shard(node="a-2", rank=1, gpus=(3,))),
        "created_at": 10.0,
        "state_since": 10.0,
        "updated_at": 10.0,
    }
    fields.update(kw)
    return Replica(**fields)  # type: ignore[arg-type]


class TestSettings:
    """--tracing-* flags, their variables and the config file's `tracing:` mapping."""

    def test_off_by_default(self) -> None:
        """No endpoint given: tracing is off (None), whatever else is set."""
        assert parse_args(["--tracing-sample-ratio", "0.5"], {}).tracing is None

    def test_flags(self) -> None:
        """An endpoint turns it on; the service name defaults to llmgw-controller."""
        got = parse_args(["--tracing-endpoint", URL, "--tracing-export-interval-s", "0.5"], {})
        assert got.tracing == TracingSettings(
            endpoint=URL,
            service_name="llmgw-controller",
            sample_ratio=1.0,
            export_interval_s=0.5,
            export_timeout_s=10.0,
        )

    def test_variable(self) -> None:
        """LLMGW_CONTROLLER_TRACING_ENDPOINT turns it on, as the flag does."""
        got = parse_args([], {"LLMGW_CONTROLLER_TRACING_ENDPOINT": URL})
        assert got.tracing is not None
        assert got.tracing.endpoint == URL

    def test_config_file_mapping(self, tmp_path: Path) -> None:
        """The file may group the settings as the router's does: `tracing: {endpoint: …}`."""
        path = tmp_path / "c.yaml"
        path.write_text(
            f"tracing:\n  endpoint: {URL}\n  service_name: ctl-a\n  sample_ratio: 0.25\n"
            "  max_queued_spans: 16\n"
        )
        got = parse_args(["--config", str(path)], {})
        assert got.tracing == TracingSettings(
            endpoint=URL, service_name="ctl-a", sample_ratio=0.25, max_queued_spans=16
        )

    def test_config_file_unknown_key(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A misspelt key inside the mapping is named, as a flat one is."""
        path = tmp_path / "c.yaml"
        path.write_text(f"tracing:\n  endpoint: {URL}\n  sampel_ratio: 0.5\n")
        with pytest.raises(SystemExit) as exc:
            parse_args(["--config", str(path)], {})
        assert exc.value.code == 2
        assert "tracing_sampel_ratio: no such setting" in capsys.readouterr().err

    @pytest.mark.parametrize(
        ("flags", "said"),
        [
            (["--tracing-endpoint", "collector:4318"], "expected an http(s):// URL"),
            (["--tracing-endpoint", URL, "--tracing-sample-ratio", "1.5"], "expected 0 to 1"),
            (["--tracing-endpoint", URL, "--tracing-export-interval-s", "0"], "positive"),
            (["--tracing-endpoint", URL, "--tracing-service-name", ""], "empty"),
            (["--tracing-endpoint", URL, "--tracing-max-queued-spans", "0"], "expected 1 to"),
        ],
    )
    def test_bad(self, flags: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
        """A bad tracing setting stops the controller at start (exit 2), saying which."""
        with pytest.raises(SystemExit) as exc:
            parse_args(flags, {})
        assert exc.value.code == 2
        assert said in capsys.readouterr().err


class TestActions:
    """Which committed events are actions, and what their spans say."""

    @pytest.mark.parametrize(
        ("kind", "message", "action"),
        [
            ("replica.placed", "placed on a-1 GPUs 0", "placement"),
            ("replica.placed", "restart 2 of r-0 on a-1 GPUs 0", "restart"),
            ("replica.placed", "replacing r-0 (node a-1 drains) on a-2 GPUs 0", "placement"),
            ("replica.evicted", "evicted for big: idle", "eviction"),
            ("replica.draining", "model m deleted", "drain"),
            ("replica.stopped", "drained: no requests in flight", "stop"),
            ("replica.failed", "engine exited with 1", "failure"),
            ("replica.sleeping", "idle for 300s: sleeps at level 1", "sleep"),
            ("replica.waking", "wanted again", "wake"),
            ("replica.ready", "all shards ready", None),
            ("replica.starting", "agent started the engine", None),
        ],
    )
    def test_action_of(self, kind: str, message: str, action: str | None) -> None:
        """Decisions are actions (a placement that restarts is a restart); progress the
        agents report is not."""
        assert action == action_of(ev(kind, message))

    def test_node_events_are_no_action(self) -> None:
        """A node's events (unreachable, drained) make no span."""
        assert action_of(ev("node.unreachable", "no heartbeat", subject="node")) is None

    def test_placement_attributes(self) -> None:
        """A placement's span names the model, every node and GPU, and the reason."""
        got = attributes(ev("replica.placed", "placed on a-1 GPUs 0,1; a-2 GPUs 3"), replica())
        assert got == {
            "llmgw.event": "replica.placed",
            "llmgw.reason": "placed on a-1 GPUs 0,1; a-2 GPUs 3",
            "llmgw.reason_class": "new",
            "llmgw.model": "m",
            "llmgw.replica": "r-1",
            "llmgw.node": "a-1,a-2",
            "llmgw.gpus": ["a-1:0,1", "a-2:3"],
            "llmgw.gpu_count": 3,
            "llmgw.replica.state": "pending",
            "llmgw.restarts": 0,
        }

    def test_sleep_attributes(self) -> None:
        """A sleep's span carries the level it sleeps at."""
        got = attributes(ev("replica.sleeping", "idle"), replica(state="sleeping", sleep_level=1))
        assert (got["llmgw.replica.state"], got["llmgw.sleep_level"]) == ("sleeping", 1)

    def test_forgotten_replica(self) -> None:
        """A replica no longer in the fleet: the event's own attributes only."""
        got = attributes(ev("replica.stopped", "drained"), None)
        assert got == {
            "llmgw.event": "replica.stopped",
            "llmgw.reason": "drained",
            "llmgw.model": "m",
            "llmgw.replica": "r-1",
        }
