"""A leading controller whose host goes silent, on a PostgreSQL left at its defaults.

test_multihost's HA test cuts the leader's link and runs PostgreSQL with
server-side keepalives of a second; here the leader's host drops every packet
(`Net.silence`: no reset, no "no route") and the server keeps its own defaults,
as most installations do, so whatever bounds the takeover is the controllers'.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from . import netns
from .controller_harness import wait_ticks
from .test_multihost import (
    TOKEN,
    PrivatePostgres,
    call,
    live,
    ready_on,
    sim_model,
    start_agent,
    start_controller,
    start_router,
    wait_for,
)
from .test_netfaults import timed_chat

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


@pytest.fixture(autouse=True)
def _need_netns() -> None:
    why = netns.unavailable()
    if why is not None:
        pytest.skip(why)


def leads(url: str) -> bool:
    return bool(call("GET", f"{url}/healthz", timeout_s=3)["leader"])


class TestSilentLeader:
    """The standby takes over from a silent leader in bounded time; agents and routers follow."""

    def test_leader_host_silent(self, tmp_path: Path) -> None:
        """Stock PostgreSQL keepalives, the leader's host silenced: the standby leads within
        seconds, the agent heartbeats it, a router on it serves a key made there."""
        names = ["pg", "ctl-1", "ctl-2", "gpu-a", "router"]
        with netns.hosts(names, log_dir=tmp_path / "logs") as net:
            pg = PrivatePostgres(net["pg"], tmp_path, stock_keepalives=True)
            try:
                # Agents give up on a silent controller after their 5 s request timeout.
                slow_hb = ("--heartbeat-timeout-s", "8")
                c1 = start_controller(net["ctl-1"], pg.url, *slow_hb)
                wait_for(lambda: leads(c1.url), what="ctl-1 leads")
                c2 = start_controller(net["ctl-2"], pg.url, *slow_hb)
                wait_for(lambda: not leads(c2.url), what="ctl-2 stands by")
                start_agent(net["gpu-a"], [c1.url, c2.url], tmp_path)
                router = start_router(net["router"], c2.url, tmp_path)
                # A key from the start: with none, the router's /v1 is open, and a key
                # made later would be "served" before the router had heard of it.
                k0 = call("POST", f"{c1.url}/admin/keys", {"name": "k0", "team": "t"})["key"]
                call("POST", f"{c1.url}/admin/models", sim_model("m"))
                rid = wait_for(lambda: ready_on(c1.url, "m"), what="m ready")["id"]
                wait_for(lambda: not timed_chat(router.url, "m", key=k0)[1].startswith("error"),
                         what="router serves m")  # fmt: skip

                net.silence("ctl-1")
                t0 = time.monotonic()
                wait_for(lambda: leads(c2.url), timeout_s=120, what="ctl-2 takes over")
                lead_s = time.monotonic() - t0

                def beats_c2() -> bool:
                    nodes = call("GET", f"{c2.url}/admin/nodes")
                    return [n["state"] for n in nodes] == ["ready"] and all(
                        time.time() - (n["last_heartbeat"] or 0) < 1.0 for n in nodes
                    )

                wait_for(beats_c2, what="the agent heartbeats ctl-2")
                agent_s = time.monotonic() - t0
                key = call("POST", f"{c2.url}/admin/keys", {"name": "k", "team": "t"})["key"]
                wait_for(lambda: not timed_chat(router.url, "m", key=key)[1].startswith("error"),
                         what="router serves with the new leader's key")  # fmt: skip
                key_s = time.monotonic() - t0
                wait_ticks(c2.url, TOKEN, 5)
                print(f"ctl-2 led {lead_s:.1f}s after ctl-1 went silent; agent on it "
                      f"{agent_s:.1f}s; router served a key made there {key_s:.1f}s")  # fmt: skip
                assert [r["id"] for r in live(c2.url, "m")] == [rid]
                # Past the leader session's own bound (keepalives, user timeout), a
                # standby's reload and the agent's 5 s request timeout, on a loaded machine.
                assert lead_s < 30.0
                assert agent_s < 40.0
            finally:
                for host in net.hosts.values():
                    for prog in host.programs:
                        prog.stop(grace_s=3)
                pg.stop()
