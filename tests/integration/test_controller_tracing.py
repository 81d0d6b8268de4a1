"""The controller's actions as spans: a real controller, agent and sim-engine, exporting
to an OTLP/HTTP receiver in the test that decodes the real protobuf (llmgw.testing.otlp).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgw.testing import Program, free_port, start_program
from llmgw.testing.procs import llmgw_argv
from llmgw.testing.wait import until
from tests.integration.test_agent_controller import AUTH, TOKEN, admin, sim_model
from tests.integration.test_agent_supervision import AgentRig

otlp = pytest.importorskip("llmgw.testing.otlp", reason="the tracing extra is not installed")

pytestmark = pytest.mark.timeout(120)

# opentelemetry.proto's Span.SpanKind.SPAN_KIND_INTERNAL.
INTERNAL = 1


def start_controller(tmp: Path, port: int, *flags: str) -> Program:
    args = ["controller", "--port", str(port), "--database", f"sqlite:///{tmp / 'c.db'}"]
    args += ["--token", TOKEN, "--tick-s", "0.2", "--heartbeat-interval-s", "0.3"]
    args += ["--heartbeat-timeout-s", "5", "--drain-grace-s", "1", *flags]
    return start_program(args, log_dir=tmp / "controller")


def of(action: str, model: str) -> Any:
    def match(span: Any) -> bool:
        attrs = otlp.attributes(span.attributes)
        return bool(span.name == f"llmgw.{action}" and attrs.get("llmgw.model") == model)

    return match


async def wait_ready(url: str, model: str, *, timeout_s: float = 45.0) -> None:
    async def check() -> bool:
        seen = await admin("GET", f"{url}/admin/replicas?model={model}")
        assert [r["state"] for r in seen] == ["ready"], seen  # shown if it never holds
        return True

    await until(check, timeout_s=timeout_s, ignore=(AssertionError,), what=f"{model} ready")


class TestActionSpans:
    """The controller's placements and stops are exported as spans."""

    async def test_placement_and_stop_exported(self, tmp_path: Path) -> None:
        """Placing a replica, then draining and stopping it (its model deleted), each reach
        the receiver as an INTERNAL span with the model, node, GPUs and reason."""
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        async with otlp.otlp_receiver() as rec:
            tracing = ["--tracing-endpoint", rec.url, "--tracing-export-interval-s", "0.1"]
            ctrl = await asyncio.to_thread(start_controller, tmp_path, port, *tracing)
            agent = AgentRig(tmp_path, url, token=TOKEN, gpus="1xH100-80G")
            try:
                await asyncio.to_thread(agent.start)
                await admin("POST", f"{url}/admin/models", [sim_model("m")])
                placed = await rec.wait_span(of("placement", "m"))
                await wait_ready(url, "m")
                await admin("DELETE", f"{url}/admin/models/m")
                drained = await rec.wait_span(of("drain", "m"))
                stopped = await rec.wait_span(of("stop", "m"), timeout_s=40)
                service = rec.services[rec.spans.index(placed)]
            finally:
                await asyncio.to_thread(agent.cleanup)
                await asyncio.to_thread(ctrl.stop, grace_s=5)
        attrs = otlp.attributes(placed.attributes)
        assert service == "llmgw-controller"
        assert placed.kind == INTERNAL
        assert attrs["llmgw.action"] == "placement"
        assert attrs["llmgw.event"] == "replica.placed"
        assert attrs["llmgw.node"] == "n1"
        assert attrs["llmgw.gpus"] == ["n1:0"]
        assert attrs["llmgw.gpu_count"] == 1
        assert attrs["llmgw.reason_class"] == "new"
        assert attrs["llmgw.reason"] == "placed on n1 GPUs 0"
        assert placed.end_time_unix_nano >= placed.start_time_unix_nano > 0
        drain = otlp.attributes(drained.attributes)
        assert drain["llmgw.reason_class"] == "model_deleted"
        assert drain["llmgw.replica"] == attrs["llmgw.replica"]
        done = otlp.attributes(stopped.attributes)
        assert stopped.kind == INTERNAL
        assert done["llmgw.replica"] == attrs["llmgw.replica"]
        assert done["llmgw.replica.state"] == "stopped"
        assert done["llmgw.node"] == "n1"
        assert done["llmgw.reason"]

    async def test_sleep_and_wake_exported(self, tmp_path: Path) -> None:
        """A sleep-mode model scaled to 0 sleeps, scaled back to 1 wakes: an llmgw.sleep
        span with its level, then an llmgw.wake span, for the same replica."""
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        model = sim_model("s") | {"sleep_mode": True, "weights_gb": 16}
        model["args"] = ["--speed", "10", "--wake-l1-s", "0.2"]
        async with otlp.otlp_receiver() as rec:
            tracing = ["--tracing-endpoint", rec.url, "--tracing-export-interval-s", "0.1"]
            ctrl = await asyncio.to_thread(start_controller, tmp_path, port, *tracing)
            agent = AgentRig(tmp_path, url, token=TOKEN, gpus="1xH100-80G")
            try:
                await asyncio.to_thread(agent.start, "--host-memory-mib", "2000000")
                await admin("POST", f"{url}/admin/models", [model])
                await wait_ready(url, "s")
                scale = f"{url}/admin/models/s/scale"
                await admin("POST", scale, {"min_replicas": 0, "max_replicas": 0})
                slept = await rec.wait_span(of("sleep", "s"), timeout_s=40)
                await admin("POST", scale, {"min_replicas": 1, "max_replicas": 1})
                woke = await rec.wait_span(of("wake", "s"), timeout_s=40)
            finally:
                await asyncio.to_thread(agent.cleanup)
                await asyncio.to_thread(ctrl.stop, grace_s=5)
        sleep = otlp.attributes(slept.attributes)
        wake = otlp.attributes(woke.attributes)
        assert (slept.kind, woke.kind) == (INTERNAL, INTERNAL)
        assert sleep["llmgw.replica"] == wake["llmgw.replica"]
        assert sleep["llmgw.sleep_level"] == 1
        assert sleep["llmgw.node"] == wake["llmgw.node"] == "n1"
        assert wake["llmgw.replica.state"] == "waking"
        assert "surplus" in sleep["llmgw.reason"]


class TestStopWithCollectorAway:
    """A collector that never answers does not hold the controller's stop."""

    async def test_stop_bounded(self, tmp_path: Path) -> None:
        """With an action's span batched for a collector that accepts no connection,
        SIGTERM stops the controller within seconds (it waited out the export timeout)."""
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with otlp.unanswering_endpoint() as endpoint:
            flags = ["--tracing-endpoint", endpoint, "--tracing-export-interval-s", "0.1"]
            flags += ["--tracing-export-timeout-s", "30"]
            with start_controller(tmp_path, port, *flags) as c:
                # No agent: the model finds no room, an action with a span.
                await admin("POST", f"{url}/admin/models", [sim_model("m")])

                async def unplaceable() -> bool:
                    events = await admin("GET", f"{url}/admin/events")
                    return "model.unplaceable" in json.dumps(events)

                await until(unplaceable, timeout_s=30, what="model.unplaceable")
                t0 = time.monotonic()
                c.signal(signal.SIGTERM)
                await asyncio.to_thread(c.proc.wait, 20)
                took_s = time.monotonic() - t0
                text = c.log_text()
        assert c.proc.returncode == 0
        assert took_s < 9.0
        assert "tracing stopped with spans unsent" in text
        assert "Traceback" not in text


async def metrics_page(url: str) -> str:
    async with (
        aiohttp.ClientSession(headers=AUTH) as s,
        s.get(f"{url}/metrics") as resp,
    ):
        assert resp.status == 200
        return await resp.text()


class TestSpansLost:
    """Spans a collector never receives are counted on the controller's /metrics."""

    async def test_full_queue_and_failed_export_counted(self, tmp_path: Path) -> None:
        """Three models found no room at once, a one-span queue and a collector that never
        answers: spans past the queue are `queue_full`, the timed-out one `export_failed`."""
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with otlp.unanswering_endpoint() as endpoint:
            flags = ["--tracing-endpoint", endpoint, "--tracing-export-interval-s", "0.05"]
            flags += ["--tracing-export-timeout-s", "0.5", "--tracing-max-queued-spans", "1"]
            with start_controller(tmp_path, port, *flags):
                before = otlp.spans_dropped(await metrics_page(url), "controller")
                # No agent: each model finds no room, an action with a span, in one tick.
                await admin("POST", f"{url}/admin/models", [sim_model(m) for m in "abc"])

                lost = await otlp.wait_spans_lost(lambda: metrics_page(url), "controller")
        assert before == {"queue_full": 0.0, "export_failed": 0.0}
        assert lost.keys() == {"queue_full", "export_failed"}
        assert sum(lost.values()) <= 3


class TestTracingRefused:
    """Tracing configured without the SDK stops the controller at start."""

    def test_sdk_missing_refused_at_start(self, tmp_path: Path) -> None:
        """Tracing configured without the OpenTelemetry SDK: the controller exits 2 saying
        what to install, instead of running untraced."""
        env = otlp.without_sdk(tmp_path / "shadow")
        argv = llmgw_argv("controller", "--port", "0", "--database", "memory://")
        argv += ["--tracing-endpoint", "http://127.0.0.1:9/v1/traces"]
        got = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert (got.returncode, got.stdout) == (2, ""), got.stderr
        assert "pip install 'llmgw[tracing]'" in got.stderr

    def test_off_needs_no_sdk(self, tmp_path: Path) -> None:
        """Without tracing set, a controller that cannot import OpenTelemetry starts and
        serves: off, the SDK is never loaded."""
        env = otlp.without_sdk(tmp_path / "shadow")
        args = ["controller", "--port", "0", "--database", "memory://"]
        with start_program(args, env=env, log_dir=tmp_path / "controller") as ctrl:
            assert ctrl.url.startswith("http://127.0.0.1:")
