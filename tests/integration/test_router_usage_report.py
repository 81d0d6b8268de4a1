"""Token usage end to end: keys of two teams used through routers (one process, and
two workers) in front of a real sim-engine with the official `openai` client; the
controller's `ctl usage` adds up what the engine counted, and each router's /metrics
counts per team, never per key."""

from __future__ import annotations

import hashlib
import json
import re
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import openai
import pytest

from llmgw.testing import Program, start_program
from llmgw.testing.wait import wait_until

from .controller_harness import Controller, Db, FakeAgents, controller, spec, wait_for
from .router_fixtures import (
    base_config,
    config_path,
    endpoint_entries,
    router,
    sim_args,
    sim_engines,
    write_config,
)
from .test_ctl_controller import ctl

pytestmark = pytest.mark.slow

TOKEN = "integration-token"


@dataclass
class Fleet:
    c: Controller
    # One process, with its access log on.
    one: Program
    # Two workers behind one port (their supervisor reports for both).
    two: Program
    # Team → [requests, prompt, completion] as the client saw the engine's usage.
    sent: dict[str, list[int]] = field(default_factory=dict)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """A controller serving m1 on a real sim-engine, two routers following it."""
    tmp = tmp_path_factory.mktemp("usage")
    engine = start_program(sim_args(model="m1", speed=500.0), log_dir=tmp)
    try:
        with controller(Db(f"sqlite:///{tmp}/c.db"), token=TOKEN, log_dir=tmp) as c:
            c.post("/admin/models", [spec("m1")])
            agents = FakeAgents(c, {"n1": 8})
            agents._next_port = int(engine.url.rsplit(":", 1)[1]) - 1
            follow = {"url": c.url, "token": TOKEN, "poll_timeout_s": 5.0}
            one_cfg = base_config(controller=follow, access_log=True)
            two_cfg = base_config(controller=follow)
            with (
                agents,
                router(tmp, one_cfg, name="one") as one,
                router(tmp, two_cfg, name="two", workers=2) as two,
            ):
                wait_for(lambda: c.endpoint_ids(), what="m1 placed and ready")
                yield Fleet(c, one, two)
    finally:
        engine.stop(grace_s=3)


def create(f: Fleet, name: str, team: str) -> str:
    """A new key from `ctl keys create`, once both routers take it."""
    r = ctl(f.c.url, "keys", "create", name, "--team", team)
    assert r.code == 0, r.err
    key = r.out.splitlines()[-1]
    for router_ in (f.one, f.two):

        def taken(url: str = router_.url) -> bool:
            with openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0) as c:
                try:
                    c.models.list()
                except openai.AuthenticationError:
                    return False
            return True

        wait_for(taken, timeout_s=10, what="the router follows the new key")
    return key


def chat(f: Fleet, router_: Program, key: str, team: str, *, stream: bool = False) -> None:
    """One chat through `router_`, its usage (as the engine counted it) added to `sent`."""
    with openai.OpenAI(base_url=router_.url + "/v1", api_key=key, max_retries=0) as c:
        msgs: list[openai.types.chat.ChatCompletionMessageParam] = [
            {"role": "user", "content": f"hello from {team}, count to ten"}
        ]
        if stream:
            chunks = list(
                c.chat.completions.create(
                    model="m1",
                    messages=msgs,
                    max_tokens=6,
                    stream=True,
                    stream_options={"include_usage": True},
                )
            )
            usage = chunks[-1].usage
        else:
            usage = c.chat.completions.create(model="m1", messages=msgs, max_tokens=5).usage
    assert usage is not None
    got = f.sent.setdefault(team, [0, 0, 0])
    got[0] += 1
    got[1] += usage.prompt_tokens
    got[2] += usage.completion_tokens


def metrics(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text: str = resp.read().decode()
    return text


def series(text: str, name: str, **labels: str) -> float:
    """One series' value on a /metrics page; 0 when it is absent."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if m and ",".join(sorted(m.group(1).split(","))) == wanted:
            return float(m.group(2))
    return 0.0


class TestUsageEndToEnd:
    """Two keys of two teams through two routers; the controller's sums and /metrics."""

    def test_ctl_usage_by_team_shows_what_the_engine_counted(self, fleet: Fleet) -> None:
        """`ctl usage --by team -o json` holds each team's requests and tokens, summed over
        both routers (one of them two workers), equal to the usage the client saw."""
        alice = create(fleet, "alice", "research")
        bob = create(fleet, "bob", "infra")
        for _ in range(3):
            chat(fleet, fleet.one, alice, "research")
        chat(fleet, fleet.two, alice, "research", stream=True)
        for _ in range(2):
            chat(fleet, fleet.two, bob, "infra")
        chat(fleet, fleet.one, bob, "infra", stream=True)
        want = {team: tuple(v) for team, v in fleet.sent.items()}

        def by_team() -> dict[str, tuple[int, int, int]]:
            r = ctl(fleet.c.url, "usage", "--by", "team", "-o", "json")
            assert r.code == 0, r.err
            doc = r.json()
            assert isinstance(doc, dict)
            out: dict[str, list[int]] = {}
            for row in doc["rows"]:
                acc = out.setdefault(row["team"], [0, 0, 0])
                acc[0] += row["requests"]
                acc[1] += row["prompt_tokens"]
                acc[2] += row["completion_tokens"]
            return {t: (v[0], v[1], v[2]) for t, v in out.items()}

        wait_until(lambda: by_team() == want, timeout_s=15, what=f"ctl usage shows {want}")
        by_key = ctl(fleet.c.url, "usage", "--by", "key", "-o", "json").json()
        assert isinstance(by_key, dict)
        assert {(r["key"], r["team"]) for r in by_key["rows"]} == {
            ("alice", "research"),
            ("bob", "infra"),
        }

    def test_router_metrics_count_per_team_never_per_key(self, fleet: Fleet) -> None:
        """Each router's /metrics has the team series, summed over its workers, and no
        series names a key; the access log names key and team, never the key itself."""
        alice = create(fleet, "carol", "research")
        before = series(metrics(fleet.two.url), "llmgw_router_team_requests_total",
                        team="research", model="m1", outcome="ok")  # fmt: skip
        for _ in range(4):
            chat(fleet, fleet.two, alice, "research")
        text = metrics(fleet.two.url)
        got = series(
            text, "llmgw_router_team_requests_total", team="research", model="m1", outcome="ok"
        )
        assert got - before == 4
        assert series(text, "llmgw_router_team_prompt_tokens_total", team="research", model="m1")
        assert "carol" not in text
        assert 'key="' not in text
        chat(fleet, fleet.one, alice, "research")
        log = fleet.one.log_text()
        assert alice not in log
        assert hashlib.sha256(alice.encode()).hexdigest() not in log
        lines = [x for x in log.splitlines() if "request_id=" in x and "key=carol" in x]
        assert lines
        assert all("team=research" in x for x in lines)


class TestLastReport:
    """A router that stops sends what it counted since its last report."""

    def test_stopping_router_reports_its_last_requests(self, fleet: Fleet, tmp_path: Path) -> None:
        """With a report due only in a minute, a request answered just before the router
        stops is in `ctl usage` all the same."""
        key = create(fleet, "dave", "late")
        follow = {"url": fleet.c.url, "token": TOKEN, "poll_timeout_s": 5.0}
        cfg = base_config(controller=follow, report_interval_s=60.0)
        with router(tmp_path, cfg, name="late") as r:
            wait_until(lambda: _serves(r, key), timeout_s=10, what="the router takes the key")
            chat(fleet, r, key, "late")
        rows = ctl(fleet.c.url, "usage", "--by", "key", "-o", "json").json()
        assert isinstance(rows, dict)
        got = [(x["requests"], x["prompt_tokens"]) for x in rows["rows"] if x["key"] == "dave"]
        assert got == [(fleet.sent["late"][0], fleet.sent["late"][1])]


def _serves(r: Program, key: str) -> bool:
    with openai.OpenAI(base_url=r.url + "/v1", api_key=key, max_retries=0) as c:
        try:
            c.models.list()
        except openai.AuthenticationError:
            return False
    return True


class TestStandaloneRouter:
    """A router without a controller still counts per team."""

    def test_file_keys_count_per_team_over_workers(self, tmp_path: Path) -> None:
        """Two workers, a file key of team ops: /metrics counts its requests and tokens."""
        key = "sk-file-usage-1"
        with sim_engines(tmp_path, [500.0], model="m1") as engines:
            cfg = base_config(
                endpoints=endpoint_entries(engines, model="m1"),
                api_keys=[
                    {
                        "name": "filed",
                        "sha256": hashlib.sha256(key.encode()).hexdigest(),
                        "team": "ops",
                    }
                ],
            )
            path = write_config(config_path(tmp_path), cfg)
            argv = ["router", "--config", str(path), "--port", "0", "--workers", "2"]
            with start_program(argv, log_dir=tmp_path) as r:
                with openai.OpenAI(base_url=r.url + "/v1", api_key=key, max_retries=0) as c:
                    prompt = 0
                    for _ in range(3):
                        u = c.chat.completions.create(
                            model="m1",
                            messages=[{"role": "user", "content": "hi"}],
                            max_tokens=3,
                        ).usage
                        assert u is not None
                        prompt += u.prompt_tokens
                text = metrics(r.url)
        assert (
            series(text, "llmgw_router_team_requests_total", team="ops", model="m1", outcome="ok")
            == 3
        )
        assert (
            series(text, "llmgw_router_team_prompt_tokens_total", team="ops", model="m1") == prompt
        )
        assert json.dumps("filed") not in text


class TestWorkersLease:
    """A router of two workers holds one share of a key's rpm, one bucket for both."""

    def test_two_workers_admit_the_routers_share_not_each(self, fleet: Fleet) -> None:
        """Each worker shows the router's share, merged on /metrics as one; hammered, the
        router admits about its share, not twice it."""
        r = ctl(fleet.c.url, "keys", "create", "limited", "--team", "lim", "--rpm", "60")
        assert r.code == 0, r.err
        key = r.out.splitlines()[-1]

        def held() -> tuple[float, float] | None:
            one, two = (
                series(metrics(p.url), "llmgw_router_team_rpm_share", team="lim")
                for p in (fleet.one, fleet.two)
            )
            return (one, two) if min(one, two) >= 20 else None

        one, two = wait_for(held, timeout_s=60, what="both routers hold a share")
        assert one + two <= 60 + 1e-6
        admitted = 0
        with openai.OpenAI(base_url=fleet.two.url + "/v1", api_key=key, max_retries=0) as c:
            started = time.monotonic()
            for _ in range(int(two) * 3):
                try:
                    c.chat.completions.create(
                        model="m1", messages=[{"role": "user", "content": "hi"}], max_tokens=1
                    )
                    admitted += 1
                except openai.RateLimitError:
                    pass
            took_s = time.monotonic() - started
        # The workers' one bucket holds the router's share, refilled at its rate.
        assert admitted <= two * (1 + took_s / 60) + 2, (admitted, two, took_s)
