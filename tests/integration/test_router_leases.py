"""One key's rpm held fleet-wide by three real routers following a real controller:
each router enforces its leased share, the shares follow demand, and a router cut
off from the controller keeps its share (docs/tenants.md#limits-and-several-routers).

The official `openai` client hammers one key through all three routers with skewed
demand; admitted requests are counted against the bound the docs state:
over T seconds at most rpm × (1 + T/60) + routers."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import openai
import pytest

from llmgw.testing import Program, start_program
from llmgw.testing.wait import wait_until

from .controller_harness import Controller, Db, FakeAgents, controller, spec, wait_for
from .cutwire import CutWire
from .router_fixtures import base_config, router, sim_args
from .test_ctl_controller import ctl
from .test_router_usage_report import metrics, series

pytestmark = pytest.mark.slow

TOKEN = "integration-token"
RPM = 180
TEAM = "hammer"


@dataclass
class Fleet:
    c: Controller
    routers: dict[str, Program]
    # Router "c" reaches the controller only through this wire.
    wire: CutWire
    key: str


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """A controller serving m1 on a sim-engine, three routers following it (one through
    a wire the test can cut), and a key of RPM requests a minute."""
    tmp = tmp_path_factory.mktemp("leases")
    engine = start_program(sim_args(model="m1", speed=2000.0), log_dir=tmp)
    try:
        with controller(Db(f"sqlite:///{tmp}/c.db"), token=TOKEN, log_dir=tmp) as c:
            c.post("/admin/models", [spec("m1")])
            agents = FakeAgents(c, {"n1": 8})
            agents._next_port = int(engine.url.rsplit(":", 1)[1]) - 1
            wire = CutWire(int(c.url.rsplit(":", 1)[1]))
            cfgs = {
                name: base_config(
                    controller={"url": url, "token": TOKEN, "poll_timeout_s": 5.0},
                    router_id=f"router-{name}",
                )
                for name, url in (("a", c.url), ("b", c.url), ("c", wire.url))
            }
            try:
                with (
                    agents,
                    router(tmp, cfgs["a"], name="a") as a,
                    router(tmp, cfgs["b"], name="b") as b,
                    router(tmp, cfgs["c"], name="c") as rc,
                ):
                    wait_for(lambda: c.endpoint_ids(), what="m1 placed and ready")
                    made = ctl(c.url, "keys", "create", "k", "--team", TEAM, "--rpm", str(RPM))
                    assert made.code == 0, made.err
                    yield Fleet(c, {"a": a, "b": b, "c": rc}, wire, made.out.splitlines()[-1])
            finally:
                wire.close()
    finally:
        engine.stop(grace_s=3)


def share(r: Program) -> float:
    return series(metrics(r.url), "llmgw_router_team_rpm_share", team=TEAM)


def shares(f: Fleet) -> dict[str, float]:
    return {name: share(r) for name, r in f.routers.items()}


def even(got: dict[str, float]) -> dict[str, float] | None:
    """The shares when each is at least 80% of a third of the rpm."""
    return got if min(got.values()) >= RPM / 3 * 0.8 else None


def ordered(got: dict[str, float]) -> dict[str, float] | None:
    """The shares when they are ordered as the demand (a > b > c > 0), a with most of it."""
    return got if got["a"] > RPM / 2 and got["a"] > got["b"] > got["c"] > 0 else None


class Counter:
    """Requests sent through each router and how many were admitted (200) or refused (429)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ok: dict[str, int] = {}
        self.refused: dict[str, int] = {}
        # (error code, x-ratelimit-limit-requests) of the refusals.
        self.refusals: set[tuple[object, str | None]] = set()

    def send(self, f: Fleet, name: str, stop: threading.Event, gap_s: float) -> None:
        url = f.routers[name].url + "/v1"
        with openai.OpenAI(base_url=url, api_key=f.key, max_retries=0) as client:
            while not stop.is_set():
                try:
                    client.chat.completions.create(
                        model="m1", messages=[{"role": "user", "content": "hi"}], max_tokens=1
                    )
                    got = self.ok
                except openai.RateLimitError as exc:
                    seen = (exc.code, exc.response.headers.get("x-ratelimit-limit-requests"))
                    with self.lock:
                        self.refusals.add(seen)
                    got = self.refused
                with self.lock:
                    got[name] = got.get(name, 0) + 1
                # An Event's timed wait paces the sender; it ends at once when told to stop.
                stop.wait(gap_s)


def hammer(f: Fleet, plan: dict[str, list[float]], seconds: float) -> tuple[Counter, float]:
    """Senders per router (each with its gap between requests) for `seconds`; the counts
    and how long they ran."""
    counter, stop = Counter(), threading.Event()
    threads = [
        threading.Thread(target=counter.send, args=(f, name, stop, gap))
        for name, gaps in plan.items()
        for gap in gaps
    ]
    started = time.monotonic()
    for t in threads:
        t.start()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    return counter, time.monotonic() - started


class TestFleetWideRpm:
    """A key's rpm across three routers."""

    def test_shares_add_up_to_the_limit_and_the_fleet_holds_it(self, fleet: Fleet) -> None:
        """Idle routers split the rpm evenly; hammered with skewed demand, the three admit
        at most rpm × (1 + T/60) + 3 together, where each alone would admit that much."""
        got = wait_until(
            lambda: even(shares(fleet)),
            timeout_s=60,
            what="every router holds about a third of the rpm",
        )
        assert sum(got.values()) <= RPM + 1e-6
        counter, took_s = hammer(fleet, {"a": [0.01] * 4, "b": [0.01] * 2, "c": [0.01]}, 12.0)
        admitted, refused = sum(counter.ok.values()), sum(counter.refused.values())
        print(f"admitted {counter.ok} refused {counter.refused} in {took_s:.1f} s")
        bound = RPM * (1 + took_s / 60) + 3
        assert admitted <= bound, (counter.ok, took_s)
        # The test means something: far more was asked than the bound, and most of the
        # key's minute was served.
        assert admitted + refused >= 2 * bound, (counter.ok, counter.refused)
        assert admitted >= RPM * 0.8, (counter.ok, counter.refused)
        assert counter.refusals == {("rate_limit_exceeded", str(RPM))}
        assert sum(shares(fleet).values()) <= RPM + 1e-6

    def test_shares_follow_demand(self, fleet: Fleet) -> None:
        """One router hammered, one at one request a second, one at one per five: the
        shares go to where the requests are, and still sum to at most the rpm."""
        stop = threading.Event()
        counter = Counter()
        plan = {"a": [0.01, 0.01], "b": [1.0], "c": [5.0]}
        threads = [
            threading.Thread(target=counter.send, args=(fleet, name, stop, gap))
            for name, gaps in plan.items()
            for gap in gaps
        ]
        for t in threads:
            t.start()
        try:
            got = wait_until(
                lambda: ordered(shares(fleet)),
                timeout_s=60,
                what="shares ordered as the demand: a > b > c",
            )
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=30)
        assert sum(got.values()) <= RPM + 1e-6

    def test_a_router_cut_off_keeps_its_share(self, fleet: Fleet) -> None:
        """Cut from the controller, router c keeps enforcing the share it held: it serves
        no more than its bucket holds, and the others' shares leave room for it."""
        rc = fleet.routers["c"]
        before = share(rc)
        assert 0 < before < RPM
        fleet.wire.cut()
        wait_until(
            lambda: rc.log_text().count("usage report failed") >= 3,
            timeout_s=30,
            what="router c's reports fail",
        )
        assert share(rc) == before
        others = share(fleet.routers["a"]) + share(fleet.routers["b"])
        assert others + before <= RPM + 1e-6
        counter, took_s = hammer(fleet, {"c": [0.01, 0.01]}, 3.0)
        assert counter.refused.get("c", 0) > 0
        assert counter.ok.get("c", 0) <= before * (1 + took_s / 60) + 1
