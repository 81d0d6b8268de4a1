"""End-to-end faults on one running `llmgw up` (tests/e2e/fleet.yaml), in order.

The tests share one system and run in file order: each leaves the fleet in the
state the next one expects (documented per test).
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.e2e.conftest import Load, System, pid_alive, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _hello(system: System, model: str, *, timeout: float = 90) -> str:
    r = system.client().chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4, timeout=timeout
    )
    return r.choices[0].message.content or ""


class TestFaults:
    """Faults on one running llmgw up, in order."""

    def test_fleet_comes_up(self, fault_system: System) -> None:
        """Both chat replicas and the never-used model are ready."""
        wait_for(lambda: len(fault_system.ready("chat")) == 2, timeout_s=120, what="chat ready")
        wait_for(lambda: fault_system.ready("idle-unknown"), timeout_s=60, what="idle-unknown")
        assert _hello(fault_system, "chat")

    def test_scale_from_zero(self, fault_system: System) -> None:
        """The first request to a min_replicas 0 model is held until a replica starts."""
        assert fault_system.ready("zero") == []
        assert _hello(fault_system, "zero", timeout=120)
        assert len(fault_system.ready("zero")) == 1

    def test_drain_node_with_traffic_loses_nothing(self, fault_system: System) -> None:
        """Draining a node under load fails no request and leaves the node empty."""
        rep = fault_system.ready("chat")[0]
        node = rep["shards"][0]["node"]
        with Load(fault_system, "chat", workers=3) as load:
            wait_for(lambda: load.ok >= 3, timeout_s=30, what="traffic flowing")
            t0 = time.monotonic()
            fault_system.ctl("drain", node, "--timeout", "120", timeout_s=150)
            drained_s = time.monotonic() - t0
            served = load.ok
            wait_for(lambda: load.ok >= served + 3, timeout_s=30, what="traffic after the drain")
        assert load.failures == []
        assert load.ok > 0
        print(f"drain took {drained_s:.1f}s, {load.ok} requests during it")

        def node_empty() -> bool:
            nodes = {n["name"]: n for n in fault_system.ctl("nodes", "--json")}
            return nodes[node]["gpus_used"] == []

        # The drained engines' cards are free once their agent's next heartbeat says so.
        wait_for(node_empty, timeout_s=30, what=f"{node}'s cards freed")
        assert len(fault_system.ready("chat")) == 2

    def test_kill_engine_is_replaced_and_requests_retried(self, fault_system: System) -> None:
        """SIGKILL of a chat engine under load: every request succeeds; the replica is replaced."""
        rep = fault_system.ready("chat")[0]
        pid = rep["shards"][0]["pid"]
        with Load(fault_system, "chat", workers=3) as load:
            wait_for(lambda: load.ok >= 3, timeout_s=30, what="traffic flowing")
            os.kill(pid, signal.SIGKILL)

            def replaced() -> bool:
                ready = fault_system.ready("chat")
                return len(ready) == 2 and all(r["shards"][0]["pid"] != pid for r in ready)

            wait_for(
                replaced,
                timeout_s=90,
                what="the killed chat replica to be replaced",
            )
        assert load.failures == []

    def test_kill_controller_under_load(self, fault_system: System) -> None:
        """With the controller SIGKILLed, serving goes on; it comes back with the same state."""
        before = {(r["id"], r["state"]) for r in fault_system.replicas() if r["state"] == "ready"}
        pid = fault_system.pid("controller")
        with Load(fault_system, "chat", workers=3) as load:
            os.kill(pid, signal.SIGKILL)
            time.sleep(4.0)
            wait_for(
                lambda: fault_system.pid("controller") != pid,
                timeout_s=60,
                what="up to restart the controller",
            )
            wait_for(lambda: fault_system.replicas(), timeout_s=60, what="controller answering")
        assert load.failures == []
        after = {(r["id"], r["state"]) for r in fault_system.replicas() if r["state"] == "ready"}
        assert before <= after

    def test_router_restart_evicts_nothing(self, fault_system: System) -> None:
        """A restarted router knows nothing of idleness, so nothing is drained because of it."""
        before = {r["id"] for r in fault_system.replicas() if r["state"] == "ready"}
        pid = fault_system.pid("router")
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: fault_system.pid("router") != pid, timeout_s=60, what="router back")
        wait_for(lambda: _hello(fault_system, "chat"), timeout_s=60, what="router serving")
        time.sleep(5.0)  # longer than every idle timeout of the never-used models
        after = {r["id"] for r in fault_system.replicas() if r["state"] == "ready"}
        assert before <= after
        assert fault_system.ready("idle-unknown")

    def test_idle_eviction_picks_known_idle_only(self, fault_system: System) -> None:
        """With the fleet full, a request for an unplaced model evicts the known-idle replica."""
        assert _hello(fault_system, "idle-known", timeout=120)
        known = fault_system.ready("idle-known")[0]["id"]
        unknown = fault_system.ready("idle-unknown")[0]["id"]

        def known_idle_past_its_timeout() -> bool:
            # Gone from the list: the controller has already acted on its idleness.
            idle = {r["id"]: r["idle_seconds"] for r in fault_system.replicas()}
            return known not in idle or idle[known] >= 2  # its model's idle_timeout_s

        wait_for(known_idle_past_its_timeout, timeout_s=60, what="idle-known idle past 2 s")
        assert _hello(fault_system, "late", timeout=120)
        states = {r["id"]: r["state"] for r in fault_system.replicas()}
        assert states.get(known) in (None, "draining", "stopped")
        assert states[unknown] == "ready"
        events = fault_system.ctl("events", "--json", "--replica", known)
        assert any("idle" in e["message"] for e in events)

    def test_kill_and_restart_agent_readopts_engines(self, fault_system: System) -> None:
        """A SIGKILLed agent comes back and re-adopts its engines; they never stop serving."""
        rep = fault_system.ready("chat")[0]
        node = rep["shards"][0]["node"]
        engine_pid = rep["shards"][0]["pid"]
        child = f"agent {node}"
        agent_pid = fault_system.pid(child)
        with Load(fault_system, "chat", workers=2) as load:
            os.kill(agent_pid, signal.SIGKILL)
            wait_for(lambda: fault_system.pid(child) != agent_pid, timeout_s=60, what="agent back")
            time.sleep(3.0)
        assert load.failures == []
        assert pid_alive(engine_pid)
        again = {r["id"]: r for r in fault_system.ready("chat")}
        assert again[rep["id"]]["shards"][0]["pid"] == engine_pid
