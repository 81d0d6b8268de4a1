"""Network faults between hosts: long cuts, silent links, a controller restarted mid-start.

The fleet and its helpers are test_multihost.py's; these tests count the
engine processes inside each host's namespace while the links are down, so
"adopted, not started twice, not orphaned" is a count, not a guess.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.testing import Program

from . import netns
from .controller_harness import ticks, wait_ticks
from .netns import Host, Net
from .test_multihost import (
    TOKEN,
    call,
    chat,
    live,
    node_of,
    ready_on,
    sim_model,
    start_agent,
    start_controller,
    start_router,
    wait_for,
)

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

# A fixed port, so that a restarted controller is where its agents look for it.
CTL_PORT = "18080"


@pytest.fixture(autouse=True)
def _need_netns() -> None:
    why = netns.unavailable()
    if why is not None:
        pytest.skip(why)


def engine_pids(host: Host) -> list[int]:
    """The sim-engine processes running in the host's namespace."""
    out = []
    for pid in netns._pids_in(host.ns):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        if b"sim-engine" in argv:
            out.append(pid)
    return sorted(out)


class EngineCounter:
    """Samples a host's engine processes every 0.1 s in a thread; the most seen at once."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.most = 0
        self.seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            pids = engine_pids(self.host)
            self.most = max(self.most, len(pids))
            self.seen.update(pids)
            self._stop.wait(0.1)

    def __enter__(self) -> EngineCounter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@pytest.fixture
def net(tmp_path: Path) -> Iterator[Net]:
    """test_multihost's fleet: controller · router · two GPU hosts."""
    with netns.hosts(["ctl", "router", "gpu-a", "gpu-b"], log_dir=tmp_path / "logs") as n:
        yield n


def node_state(ctl_url: str, name: str) -> str | None:
    for n in call("GET", f"{ctl_url}/admin/nodes"):
        if n["name"] == name:
            return str(n["state"])
    return None


def events(ctl_url: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = call("GET", f"{ctl_url}/admin/events")
    return out


class TestAgentCutOffLong:
    """An agent cut off past the heartbeat timeout comes back with its engine, never two."""

    def test_cut_shorter_than_grace_adopts_the_same_engine(self, net: Net, tmp_path: Path) -> None:
        """Unreachable but within the grace: the same replica and process on return."""
        ctl = start_controller(net["ctl"], f"sqlite:///{tmp_path / 'c.db'}",
                               "--unreachable-grace-s", "10")  # fmt: skip
        start_agent(net["gpu-a"], [ctl.url], tmp_path)
        call("POST", f"{ctl.url}/admin/models", sim_model("m"))
        first = wait_for(lambda: ready_on(ctl.url, "m"), what="m ready")
        pids = wait_for(lambda: engine_pids(net["gpu-a"]) or None, what="engine process")
        assert len(pids) == 1
        with EngineCounter(net["gpu-a"]) as counter:
            net.cut("gpu-a")
            wait_for(lambda: node_state(ctl.url, "gpu-a") == "unreachable", what="unreachable")
            time.sleep(2.0)
            net.restore("gpu-a")
            t0 = time.monotonic()
            wait_for(lambda: node_state(ctl.url, "gpu-a") == "ready", what="gpu-a ready again")
            back = wait_for(lambda: ready_on(ctl.url, "m"), what="m ready again")
            recovered_s = time.monotonic() - t0
        print(f"recovered in {recovered_s:.1f}s, most engines at once {counter.most}")
        assert back["id"] == first["id"]
        assert engine_pids(net["gpu-a"]) == pids
        assert counter.most == 1
        assert counter.seen == set(pids)

    def test_cut_past_grace_leaves_one_engine(self, net: Net, tmp_path: Path) -> None:
        """Past the grace, nowhere else to go: one engine on return, the replica ready."""
        ctl = start_controller(net["ctl"], f"sqlite:///{tmp_path / 'c.db'}")
        start_agent(net["gpu-a"], [ctl.url], tmp_path)
        router = start_router(net["router"], ctl.url, tmp_path)
        call("POST", f"{ctl.url}/admin/models", sim_model("m"))
        wait_for(lambda: ready_on(ctl.url, "m"), what="m ready")
        wait_for(lambda: chat(router.url, "m", stream=False), what="router serves m")
        with EngineCounter(net["gpu-a"]) as counter:
            net.cut("gpu-a")
            wait_for(lambda: node_state(ctl.url, "gpu-a") == "unreachable", what="unreachable")
            time.sleep(4.0)  # past the 2 s grace: the replica is failed
            during = live(ctl.url, "m")
            net.restore("gpu-a")
            t0 = time.monotonic()
            wait_for(lambda: ready_on(ctl.url, "m"), what="m ready again")
            wait_for(lambda: chat(router.url, "m", stream=False), what="router serves m again")
            recovered_s = time.monotonic() - t0
            wait_ticks(ctl.url, TOKEN, 5)
        print(f"during the cut: {[(r['id'], r['state']) for r in during]}")
        print(f"recovered in {recovered_s:.1f}s, most engines at once {counter.most}")
        assert len(live(ctl.url, "m")) == 1
        assert len(engine_pids(net["gpu-a"])) == 1
        assert counter.most == 1
        kinds = [e["kind"] for e in events(ctl.url)]
        # Said once each, in order: gone, its replica failed, back, a new start.
        cut = kinds.index("node.unreachable")
        assert kinds.count("node.unreachable") == 1, kinds
        assert kinds.index("replica.failed") > cut, kinds
        assert kinds.index("node.reachable") > kinds.index("replica.failed"), kinds
        assert kinds[-1] == "replica.ready", kinds


class TestControllerRestartMidStart:
    """A controller restarted while an agent starts an engine: one engine, one replica."""

    def test_restart_while_starting(self, net: Net, tmp_path: Path) -> None:
        """SIGKILL the controller during a slow start; the new one adopts the start."""
        db = f"sqlite:///{tmp_path / 'c.db'}"
        ctl = start_controller(net["ctl"], db, "--port", CTL_PORT)
        slow = _slow_agent(net["gpu-a"], ctl.url, tmp_path)
        call("POST", f"{ctl.url}/admin/models", sim_model("m"))
        wait_for(
            lambda: [r for r in live(ctl.url, "m") if r["state"] == "starting"] or None,
            what="m starting",
        )
        first = live(ctl.url, "m")
        with EngineCounter(net["gpu-a"]) as counter:
            ctl.kill()
            ctl2 = start_controller(net["ctl"], db, "--port", CTL_PORT)
            t0 = time.monotonic()
            rep = wait_for(lambda: ready_on(ctl2.url, "m"), what="m ready after restart")
            ready_s = time.monotonic() - t0
            wait_ticks(ctl2.url, TOKEN, 5)
        print(f"ready {ready_s:.1f}s after restart; most engines {counter.most}")
        assert [r["id"] for r in first] == [rep["id"]]
        assert len(live(ctl2.url, "m")) == 1
        assert counter.most == 1
        assert len(counter.seen) == 1
        assert slow.alive()


def _slow_agent(host: Host, ctl_url: str, tmp: Path) -> Program:
    """An agent whose sim engines take 4 s to start listening."""
    return start_agent(
        host,
        [ctl_url],
        tmp,
        extra=["--engine-bin", "sim=sh -c 'sleep 4; exec \"$0\" \"$@\"' "
               f"{sys.executable} -m llmgw sim-engine"],
    )  # fmt: skip


def endpoint_of(router_url: str) -> str:
    """The replica that answered one short request through the router."""
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    req = urllib.request.Request(
        f"{router_url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return str(resp.headers["x-llmgw-endpoint"])


def timed_chat(router_url: str, model: str, *, key: str = "unused") -> tuple[float, str]:
    """Seconds one request took through the router, and its answer or its error."""
    import openai

    # Closed on the way out: a pooled connection left to the collector is a
    # ResourceWarning in whichever later test it is collected.
    with openai.OpenAI(
        base_url=f"{router_url}/v1", api_key=key, timeout=40.0, max_retries=0
    ) as client:
        t0 = time.monotonic()
        try:
            out = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            text = out.choices[0].message.content or ""
        except openai.APIError as exc:
            text = f"error: {exc}"
        return time.monotonic() - t0, text


class TestSilentLinks:
    """Links that drop packets without a word: every call ends in bounded time."""

    def test_router_silent_from_controller_keeps_list_and_keys(
        self, net: Net, tmp_path: Path
    ) -> None:
        """The router serves with its last list and keys, and follows again once healed."""
        ctl = start_controller(net["ctl"], f"sqlite:///{tmp_path / 'c.db'}")
        for name in ("gpu-a", "gpu-b"):
            start_agent(net[name], [ctl.url], tmp_path)
        router = start_router(net["router"], ctl.url, tmp_path)
        key = call("POST", f"{ctl.url}/admin/keys", {"name": "k", "team": "t"})["key"]
        call("POST", f"{ctl.url}/admin/models", sim_model("m"))
        wait_for(lambda: ready_on(ctl.url, "m"), what="m ready")
        wait_for(lambda: not timed_chat(router.url, "m", key=key)[1].startswith("error"),
                 what="router serves m with the key")  # fmt: skip
        net.silence_between("router", "ctl")
        call("POST", f"{ctl.url}/admin/models", sim_model("n"))
        wait_for(lambda: ready_on(ctl.url, "n"), what="n ready")
        worst = 0.0
        deadline = time.monotonic() + 12.0  # past the 2 s long-poll plus its 5 s slack
        while time.monotonic() < deadline:
            took, text = timed_chat(router.url, "m", key=key)
            assert not text.startswith("error"), text
            worst = max(worst, took)
            time.sleep(0.2)
        net.heal_between("router", "ctl")
        t0 = time.monotonic()
        wait_for(lambda: not timed_chat(router.url, "n", key=key)[1].startswith("error"),
                 what="router serves n")  # fmt: skip
        print(f"slowest request while silent {worst:.2f}s; n served {time.monotonic() - t0:.1f}s "
              "after the heal")  # fmt: skip

    def test_agent_silent_from_controller(self, net: Net, tmp_path: Path) -> None:
        """A silent agent keeps its engine, slows no tick, and is reachable again once healed."""
        ctl = start_controller(net["ctl"], f"sqlite:///{tmp_path / 'c.db'}",
                               "--unreachable-grace-s", "30")  # fmt: skip
        for name in ("gpu-a", "gpu-b"):
            start_agent(net[name], [ctl.url], tmp_path)
        call("POST", f"{ctl.url}/admin/models", sim_model("m", max_replicas=2, min_replicas=2))
        wait_for(lambda: len([r for r in live(ctl.url, "m") if r["state"] == "ready"]) == 2,
                 what="two ready replicas")  # fmt: skip
        before = {r["id"] for r in live(ctl.url, "m")}
        pids = engine_pids(net["gpu-a"])
        with EngineCounter(net["gpu-a"]) as counter:
            net.silence_between("gpu-a", "ctl")
            wait_for(lambda: node_state(ctl.url, "gpu-a") == "unreachable", what="unreachable")
            # The controller never calls agents: a hung one costs its ticks nothing,
            # and the other node's heartbeats keep arriving (0.2 s ticks: about 40).
            t0, n0 = time.monotonic(), ticks(ctl.url, TOKEN)
            time.sleep(8.0)  # past the agent's 5 s request timeout, hung calls and all
            rate = (ticks(ctl.url, TOKEN) - n0) / (time.monotonic() - t0)
            assert node_state(ctl.url, "gpu-b") == "ready"
            net.heal_between("gpu-a", "ctl")
            t0 = time.monotonic()
            wait_for(lambda: node_state(ctl.url, "gpu-a") == "ready", what="gpu-a ready again")
            back_s = time.monotonic() - t0
            wait_for(lambda: len([r for r in live(ctl.url, "m") if r["state"] == "ready"]) == 2,
                     what="two ready again")  # fmt: skip
        print(f"{rate:.1f} ticks/s while silent; gpu-a ready {back_s:.1f}s after the heal; "
              f"most engines {counter.most}")  # fmt: skip
        assert rate > 2.0
        assert {r["id"] for r in live(ctl.url, "m")} == before
        assert engine_pids(net["gpu-a"]) == pids
        assert counter.most == 1

    def test_engine_host_silent_from_router(self, net: Net, tmp_path: Path) -> None:
        """An engine the router cannot hear: requests go elsewhere in bounded time."""
        ctl = start_controller(net["ctl"], f"sqlite:///{tmp_path / 'c.db'}")
        for name in ("gpu-a", "gpu-b"):
            start_agent(net[name], [ctl.url], tmp_path)
        router = start_router(net["router"], ctl.url, tmp_path)
        call("POST", f"{ctl.url}/admin/models", sim_model("m", min_replicas=2, max_replicas=2))
        wait_for(lambda: len([r for r in live(ctl.url, "m") if r["state"] == "ready"]) == 2,
                 what="two ready replicas")  # fmt: skip
        # Both replicas served through pooled connections first.
        wait_for(lambda: len(call("GET", f"{ctl.url}/v1/endpoints")["endpoints"]) == 2,
                 what="both listed")  # fmt: skip
        # The same prompt goes back to the same replica (prefix affinity), on the
        # connection its last answer left in the router's pool: that host goes silent.
        served = {endpoint_of(router.url) for _ in range(5)}
        assert len(served) == 1, served
        (rid,) = served
        node = next(node_of(r) for r in live(ctl.url, "m") if r["id"] == rid)
        net.silence_between("router", node)
        took = []
        deadline = time.monotonic() + 20.0
        while time.monotonic() < deadline:
            t, text = timed_chat(router.url, "m")
            took.append(t)
            assert not text.startswith("error"), (took, text)
        print(f"{len(took)} requests after {node} went silent; slowest {max(took):.1f}s, "
              f"first {took[0]:.1f}s")  # fmt: skip
        # The connect timeout (3 s) once, not twice: no fresh try on the silent host.
        assert max(took) < 5.5, took
        net.heal_between("router", node)
