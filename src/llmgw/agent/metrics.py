"""The agent's Prometheus metrics (`GET /metrics`; reference: docs/metrics.md).

Counters and the start-up histogram are touched by the supervisor as engines
start, become ready and exit (`EngineEvents`); everything else (engines by
state, per-card health and readings, the controller link) is read from the
agent's live state when /metrics is scraped. Labels are bounded: engine kind,
shard state, GPU index and class of this node; no replica id (replicas churn).
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from llmgw.agent.service import Agent

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Engines take seconds (sim) to many minutes (a 70B model loading weights).
STARTUP_BUCKETS = (1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800)
SHARD_STATES = ("starting", "ready", "failed", "stopped")


class EngineEvents:
    """What the supervisor counts as it goes; registered in the agent's registry."""

    def __init__(self) -> None:
        self.starts = Counter(
            "llmgw_agent_engine_starts",
            "Engine processes started (or attempted), by engine kind.",
            ["engine"],
            registry=None,
        )
        self.exits = Counter(
            "llmgw_agent_engine_exits",
            "Engine processes that ended: how=failed (exited on its own, or never started) "
            "or how=stopped (asked to).",
            ["engine", "how"],
            registry=None,
        )
        self.startup = Histogram(
            "llmgw_agent_engine_startup_seconds",
            "Seconds from process start to the first healthy probe.",
            ["engine"],
            buckets=STARTUP_BUCKETS,
            registry=None,
        )
        self.sleeps = Counter(
            "llmgw_agent_engine_sleeps",
            "Engines put to sleep (op=sleep) or woken and warmed up (op=wake) on the "
            "controller's word.",
            ["engine", "op"],
            registry=None,
        )

    def started(self, engine: str) -> None:
        self.starts.labels(engine).inc()

    def ready(self, engine: str, seconds: float) -> None:
        self.startup.labels(engine).observe(max(0.0, seconds))

    def exited(self, engine: str, how: str) -> None:
        self.exits.labels(engine, how).inc()

    def slept(self, engine: str, op: str) -> None:
        self.sleeps.labels(engine, op).inc()


class _Live(Collector):
    def __init__(self, agent: Agent) -> None:
        self._agent = agent

    def collect(self) -> Iterator[Metric]:
        agent = self._agent
        sup = agent.supervisor
        engines = GaugeMetricFamily(
            "llmgw_agent_engines",
            "Engine processes (shards) this agent knows, by engine kind and state.",
            labels=["engine", "state"],
        )
        by: Tally[tuple[str, str]] = Tally()
        kinds = {"sim"}
        for engine, state in sup.engine_states():
            by[(engine, state)] += 1
            kinds.add(engine)
        for engine in sorted(kinds):
            for state in SHARD_STATES:
                engines.add_metric([engine, state], float(by[(engine, state)]))
        yield engines

        gpus = agent.inventory.gpus()
        busy = sup.busy_gpus()
        labels = ["gpu", "gpu_class"]
        healthy = GaugeMetricFamily(
            "llmgw_agent_gpu_healthy",
            "1 when the card is healthy, 0 when taken out.",
            labels=labels,
        )
        assigned = GaugeMetricFamily(
            "llmgw_agent_gpu_assigned",
            "1 when an engine of this node runs on the card.",
            labels=labels,
        )
        temp = GaugeMetricFamily(
            "llmgw_agent_gpu_temperature_celsius", "Card temperature.", labels=labels
        )
        util = GaugeMetricFamily(
            "llmgw_agent_gpu_utilization_ratio",
            "Fraction of the last sample period the card was busy (NVML utilization.gpu).",
            labels=labels,
        )
        used = GaugeMetricFamily(
            "llmgw_agent_gpu_memory_used_bytes", "Card memory in use.", labels=labels
        )
        total = GaugeMetricFamily(
            "llmgw_agent_gpu_memory_total_bytes", "Card memory in all.", labels=labels
        )
        xid = GaugeMetricFamily(
            "llmgw_agent_gpu_xid_events",
            "Critical XID events seen since the agent started (absent without event support).",
            labels=labels,
        )
        ecc = GaugeMetricFamily(
            "llmgw_agent_gpu_ecc_uncorrected_errors",
            "Uncorrectable volatile ECC errors NVML reports (absent on cards without ECC).",
            labels=labels,
        )
        cls = {g.index: g.gpu_class for g in gpus}
        for g in gpus:
            lv = [str(g.index), g.gpu_class]
            healthy.add_metric(lv, 1.0 if g.healthy else 0.0)
            assigned.add_metric(lv, 1.0 if g.index in busy else 0.0)
        for t in agent.inventory.telemetry(busy):
            lv = [str(t.index), cls.get(t.index, "")]
            for fam, value in (
                (temp, t.temperature_c),
                (util, t.utilization),
                (used, t.memory_used_bytes),
                (total, t.memory_total_bytes),
                (xid, t.xid_events),
                (ecc, t.ecc_uncorrected),
            ):
                if value is not None:
                    fam.add_metric(lv, float(value))
        yield from (healthy, assigned, temp, util, used, total, xid, ecc)

        hb = agent.heartbeater
        now = agent.clock.wall()
        age = GaugeMetricFamily(
            "llmgw_agent_heartbeat_age_seconds",
            "Seconds since the controller last accepted a heartbeat; absent before the first.",
        )
        if hb.last_ok_at is not None:
            age.add_metric([], max(0.0, now - hb.last_ok_at))
        yield age
        fails = GaugeMetricFamily(
            "llmgw_agent_heartbeat_consecutive_failures",
            "Heartbeats in a row the controller did not accept.",
        )
        fails.add_metric([], float(hb.failures))
        yield fails
        info = GaugeMetricFamily(
            "llmgw_agent_info",
            "Always 1; the node and GPU inventory kind.",
            labels=["node", "inventory"],
        )
        info.add_metric([agent.config.node, agent.inventory.kind], 1.0)
        yield info


class AgentMetrics:
    def __init__(self, agent: Agent) -> None:
        self.registry = CollectorRegistry()
        ev = agent.supervisor.events
        for c in (ev.starts, ev.exits, ev.startup, ev.sleeps):
            self.registry.register(c)
        self.registry.register(_Live(agent))

    def render(self) -> bytes:
        return generate_latest(self.registry)
