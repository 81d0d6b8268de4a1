"""docs/metrics.md lists exactly the metric families each program registers.

A section's table follows `<!-- metrics: dotted.name.Of.TheMetricsClass -->`; its rows
are `| \\`metric_name\\` | type | labels | meaning |`. `REGISTRIES` says how to build each
class's registry without a process; a program that adds metrics adds a marked table on
the page and one entry here. The standard `process_*` family is not listed per metric.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

PAGE = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
MARK = re.compile(r"<!-- metrics: ([\w.]+) -->")
ROW = re.compile(r"^\|\s*`([a-z_:][a-z0-9_:]*)`\s*\|\s*(\w+)\s*\|")


def _router(cls: Any) -> CollectorRegistry:
    registry: CollectorRegistry = cls(snapshots=lambda: [], held=lambda: {}).registry
    return registry


def _agent(cls: Any) -> CollectorRegistry:
    import tempfile

    from llmgw.agent.config import parse_config
    from llmgw.agent.engineprocs import PopenSpawner
    from llmgw.agent.gpus.fake import FakeInventory
    from llmgw.agent.ports import PortAllocator
    from llmgw.agent.service import Agent
    from llmgw.agent.statefile import StateStore
    from llmgw.agent.supervisor import Supervisor
    from llmgw.wire.agent import Heartbeat, HeartbeatReply

    class _Probe:
        async def check(self, port: int, path: str) -> bool:
            return False

        async def close(self) -> None:
            pass

    class _Client:
        url = "http://c:1"

        async def heartbeat(self, hb: Heartbeat) -> HeartbeatReply:
            return HeartbeatReply(shards=())

        async def close(self) -> None:
            pass

    tmp = Path(tempfile.mkdtemp(prefix="llmgw-docs-"))
    cfg = parse_config(["--controller", "http://c:1", "--node", "n", "--state-dir", str(tmp)])
    sup = Supervisor(
        log_dir=tmp / "logs",
        store=StateStore(tmp, node="n"),
        ports=PortAllocator(21000, 21001, is_free=lambda p: True),
        spawner=PopenSpawner(),
        probe=_Probe(),
    )
    inv = FakeInventory.from_spec("1xH100-80G", uuid_prefix="n")
    agent = Agent(config=cfg, inventory=inv, supervisor=sup, client=_Client(), probe=_Probe())
    registry: CollectorRegistry = cls(agent).registry
    return registry


def _prediction(cls: Any) -> CollectorRegistry:
    from llmgw.router.routing.prefix import PrefixIndex

    registry = CollectorRegistry()
    registry.register(cls(PrefixIndex()))
    return registry


def _shares(cls: Any) -> CollectorRegistry:
    from llmgw.wire.keys import ClientKey

    key = ClientKey(name="k", sha256="a" * 64, team="t", rpm=6, tpm=60)
    registry = CollectorRegistry()
    registry.register(cls(lambda: {key.sha256: (2.0, 20.0)}, lambda: [key]))
    return registry


def _kv_events(cls: Any) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(cls())
    return registry


def _reloads(cls: Any) -> CollectorRegistry:
    from llmgw.router.control.reloadstatus import started

    registry = CollectorRegistry()
    registry.register(cls(lambda: started(1.8e9)))
    return registry


def _controller(cls: Any) -> CollectorRegistry:
    from llmgw.controller.api.services import Services
    from llmgw.controller.config import ControllerConfig
    from llmgw.controller.fleet.live import Fleet
    from llmgw.controller.idle import IdleTracker
    from llmgw.controller.store.memory import MemoryStore
    from llmgw.runtime.clock import ManualClock

    clock, config = ManualClock(), ControllerConfig()
    fleet = Fleet(MemoryStore(), clock=clock, config=config)
    services = Services(fleet, IdleTracker(clock=clock), config=config, clock=clock)
    registry: CollectorRegistry = cls(services).registry
    return registry


def _workers(cls: Any) -> CollectorRegistry:
    registry = CollectorRegistry()
    cls(registry, lambda: 2)
    return registry


REGISTRIES: dict[str, Callable[[Any], CollectorRegistry]] = {
    "llmgw.router.metrics.RouterMetrics": _router,
    "llmgw.router.routing.feedback.PredictionCheck": _prediction,
    "llmgw.router.routing.kvevents.KVEventIndex": _kv_events,
    "llmgw.router.control.leases.ShareMetrics": _shares,
    "llmgw.router.control.reloadstatus.ReloadMetrics": _reloads,
    "llmgw.router.workers.pool.WorkerMetrics": _workers,
    "llmgw.agent.metrics.AgentMetrics": _agent,
    "llmgw.controller.api.metrics.ControllerMetrics": _controller,
}


def documented() -> dict[str, dict[str, str]]:
    """{dotted class: {metric name as scraped: type}} for each marked table."""
    out: dict[str, dict[str, str]] = {}
    lines = PAGE.read_text().splitlines()
    for i, line in enumerate(lines):
        m = MARK.search(line)
        if m is None:
            continue
        rows: dict[str, str] = {}
        for row in lines[i + 1 :]:
            if not row.startswith("|"):
                if rows or row.strip():
                    break
                continue
            cell = ROW.match(row)
            if cell is not None:
                rows[cell.group(1)] = cell.group(2)
        out[m.group(1)] = rows
    return out


def registered(dotted: str) -> dict[str, str]:
    module, _, name = dotted.rpartition(".")
    registry = REGISTRIES[dotted](getattr(importlib.import_module(module), name))
    out = {}
    for family in registry.collect():
        if family.name.startswith("process_"):
            continue
        # Counters are scraped with the _total suffix prometheus_client adds.
        scraped = family.name + "_total" if family.type == "counter" else family.name
        out[scraped] = family.type
    return out


class TestDocsMetrics:
    """docs/metrics.md lists exactly each program's registered metrics."""

    def test_every_program_with_metrics_has_a_section(self) -> None:
        """Each registry known here has a marked table on docs/metrics.md; no table is orphaned."""
        assert documented().keys() == REGISTRIES.keys()

    @pytest.mark.parametrize("dotted", sorted(REGISTRIES))
    def test_section_lists_exactly_the_registered_metrics(self, dotted: str) -> None:
        """Same names and types: nothing registered is undocumented, nothing documented gone."""
        docs = documented().get(dotted, {})
        real = registered(dotted)
        assert sorted(real.keys() - docs.keys()) == [], "registered but not in docs/metrics.md"
        assert sorted(docs.keys() - real.keys()) == [], "in docs/metrics.md but not registered"
        wrong = {n: (docs[n], t) for n, t in real.items() if docs[n] != t}
        assert wrong == {}, "documented type differs (docs, real)"
