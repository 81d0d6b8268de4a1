"""A controller-leased budget behind `llmgw router --workers 2`: one allowance per router.

A real controller leases the router an allowance of a key's token budget; the
router's two workers spend it from the row of the key they share, so a client
whose requests all reach one worker (one keep-alive connection, pinned as in
test_router_keyshare.py) spends the whole allowance, not one worker's half, and
both workers together spend no more than it (docs/tenants.md, "Workers").
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass

import aiohttp
import pytest

from llmgw.testing import Program, start_program
from llmgw.testing.wait import wait_until

from .controller_harness import Controller, Db, FakeAgents, controller, spec, wait_for
from .router_fixtures import MODEL, Reply, base_config, chat_body, post, router, sim_args
from .test_ctl_controller import ctl, json_list
from .test_router_keyshare import PROBE, pinned

pytestmark = pytest.mark.slow

TOKEN = "integration-token"
ROUTER_ID = "router-w"
# Tokens a day of each test's key; each request uses about a dozen.
BUDGET = 400
# Reports (and so leases) two seconds apart: a pinned client spends the whole budget
# well within one, so a worker's half of the allowance shows as a refusal at half.
REPORT_S = 2.0


@dataclass
class Fleet:
    c: Controller
    router: Program


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """A controller serving the model on a sim-engine, and one router of two workers
    following it, with an unlimited file key to pin connections with."""
    tmp = tmp_path_factory.mktemp("budgetshare")
    engine = start_program(sim_args(speed=2000.0), log_dir=tmp)
    try:
        with controller(Db(f"sqlite:///{tmp}/c.db"), token=TOKEN, log_dir=tmp) as c:
            c.post("/admin/models", [spec(MODEL)])
            agents = FakeAgents(c, {"n1": 8})
            agents._next_port = int(engine.url.rsplit(":", 1)[1]) - 1
            probe = {"name": "probe", "sha256": hashlib.sha256(PROBE.encode()).hexdigest()}
            cfg = base_config(
                controller={"url": c.url, "token": TOKEN, "poll_timeout_s": 5.0},
                router_id=ROUTER_ID,
                api_keys=[probe],
                report_interval_s=REPORT_S,
            )
            with agents, router(tmp, cfg, workers=2) as r:
                wait_for(lambda: c.endpoint_ids(), what="the model placed and ready")
                yield Fleet(c, r)
    finally:
        engine.stop(grace_s=3)


def budget_key(f: Fleet, name: str) -> str:
    """A new key of BUDGET tokens a day, once the router holds an allowance of all of it
    (the controller grants nothing while it warms up, its first lease)."""
    made = ctl(
        f.c.url, "keys", "create", name, "--team", "budget",
        "--budget-tokens", str(BUDGET), "--per", "day",
    )  # fmt: skip
    assert made.code == 0, made.err

    def leased() -> float | None:
        (k,) = [v for v in json_list(f.c.url, "keys", "list") if v["name"] == name]
        got = [s["budget"] for s in k["shares"] if s["router"] == ROUTER_ID]
        return got[0] if got and got[0] is not None and got[0] >= BUDGET - 1 else None

    wait_until(leased, timeout_s=45, what="the router's allowance of the whole budget")
    return made.out.splitlines()[-1]


class Spender:
    """Requests of one key on one pinned connection until the first refusal."""

    def __init__(self, session: aiohttp.ClientSession, url: str, key: str) -> None:
        self.session = session
        self.url = url
        self.headers = {"Authorization": f"Bearer {key}", "x-llmgw-debug": "1"}
        # Tokens the engine counted in the admitted answers, and the largest of one.
        self.tokens = 0
        self.most = 0
        self.workers: set[str] = set()
        self.refused: Reply | None = None

    async def one(self) -> Reply:
        reply = await post(
            self.session, self.url, chat_body("hi", max_tokens=1), headers=self.headers
        )
        if reply.status == 200:
            usage = reply.json()["usage"]
            used = usage["prompt_tokens"] + usage["completion_tokens"]
            self.tokens += used
            self.most = max(self.most, used)
            self.workers.add(reply.headers["x-llmgw-worker"])
        return reply

    async def until_refused(self, *, most: int = 4 * BUDGET) -> Reply:
        for _ in range(most):
            reply = await self.one()
            if reply.status != 200:
                self.refused = reply
                return reply
        raise AssertionError(f"still admitted after {most} requests ({self.tokens} tokens)")


def assert_spent(reply: Reply) -> None:
    """429 insufficient_quota, which the openai package does not retry."""
    assert reply.status == 429, reply.body
    err = reply.json()["error"]
    assert (err["type"], err["code"]) == ("insufficient_quota", "insufficient_quota"), err
    assert reply.headers["x-should-retry"] == "false"
    assert "retry-after" not in reply.headers


class TestOneAllowancePerRouter:
    """A leased budget's allowance is the router's, whichever worker spends it."""

    async def test_one_worker_spends_the_whole_allowance(self, fleet: Fleet) -> None:
        """Every request on one worker: the key spends its whole budget there before
        429 insufficient_quota, and the other worker then refuses it too."""
        key = budget_key(fleet, "pinned")
        url = fleet.router.url
        async with AsyncExitStack() as stack:
            conns = await pinned(stack, url)
            one = Spender(conns[0], url, key)
            assert_spent(await one.until_refused())
            other = Spender(conns[1], url, key)
            replies = [await other.one() for _ in range(3)] + [await one.one()]
        print(f"budget {BUDGET}: worker 0 spent {one.tokens}, worker 1 {other.tokens}")
        assert one.workers == {"0"}
        # Admitted while the allowance was not spent: the last answer may overdraw it.
        assert BUDGET - 1 <= one.tokens <= BUDGET + one.most
        assert other.tokens == 0
        for reply in replies:
            assert_spent(reply)

    async def test_both_workers_together_spend_it_once(self, fleet: Fleet) -> None:
        """Both workers spending at once: together no more than the budget, plus the
        one answer each had in flight when it ran out."""
        key = budget_key(fleet, "both")
        url = fleet.router.url
        async with AsyncExitStack() as stack:
            conns = await pinned(stack, url)
            spenders = [Spender(s, url, key) for s in conns]
            for refused in await asyncio.gather(*(s.until_refused() for s in spenders)):
                assert_spent(refused)
        got = [s.tokens for s in spenders]
        print(f"budget {BUDGET}: workers spent {got}")
        assert [s.workers for s in spenders] == [{"0"}, {"1"}]
        assert BUDGET - 1 <= sum(got) <= BUDGET + sum(s.most for s in spenders)
