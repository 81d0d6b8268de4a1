"""Client keys end to end: `ctl keys` on a real controller, a router following it, a
sim-engine behind it, and the official `openai` client seeing OpenAI's errors."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from llmgw.testing import Program, start_program

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
from .test_router_usage_report import metrics, series

pytestmark = pytest.mark.slow

TOKEN = "integration-token"


@dataclass
class Fleet:
    c: Controller
    router: Program
    # A second router following the same controller.
    other: Program


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """A controller serving m1 (one replica on a real sim-engine) and m2 (none), and a
    router following it."""
    tmp = tmp_path_factory.mktemp("tenants")
    engine = start_program(sim_args(model="m1", speed=200.0), log_dir=tmp)
    try:
        with controller(Db(f"sqlite:///{tmp}/c.db"), token=TOKEN, log_dir=tmp) as c:
            c.post("/admin/models", [spec("m1"), spec("m2", min_replicas=0, max_replicas=1)])
            agents = FakeAgents(c, {"n1": 8})
            # The first shard reported lands on the real engine's port.
            agents._next_port = int(engine.url.rsplit(":", 1)[1]) - 1
            cfg = base_config(controller={"url": c.url, "token": TOKEN, "poll_timeout_s": 5.0})
            with agents, router(tmp, cfg) as r, router(tmp, cfg, name="other") as r2:
                wait_for(lambda: c.endpoint_ids(), what="m1 placed and ready")
                yield Fleet(c, r, r2)
    finally:
        engine.stop(grace_s=3)


def create(f: Fleet, name: str, *flags: str) -> str:
    """A new key from `ctl keys create`, once the router takes it."""
    r = ctl(f.c.url, "keys", "create", name, "--team", "t", *flags)
    assert r.code == 0, r.err
    key = r.out.splitlines()[-1]

    def taken() -> bool:
        with client(f, key) as c:
            try:
                c.models.list()
            except openai.AuthenticationError:
                return False
        return True

    wait_for(taken, timeout_s=10, what="the router follows the new key")
    return key


def client(f: Fleet, key: str, *, other: bool = False) -> openai.OpenAI:
    url = (f.other if other else f.router).url
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


def chat(
    f: Fleet, key: str, model: str = "m1", *, other: bool = False
) -> openai.types.chat.ChatCompletion:
    with client(f, key, other=other) as c:
        return c.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )


class TestKeysEndToEnd:
    """What a client with a key sees through the router."""

    def test_created_key_works_and_a_revoked_one_is_refused_within_seconds(
        self, fleet: Fleet
    ) -> None:
        """A key from ctl is served by both routers; after `ctl keys revoke` each answers
        401 invalid_api_key within a few seconds."""
        key = create(fleet, "rev")
        assert chat(fleet, key).choices
        wait_for(lambda: _status(fleet, key, other=True) == 200, what="the other router")
        assert ctl(fleet.c.url, "keys", "revoke", "rev").code == 0
        revoked_at = time.monotonic()

        def refused(other: bool) -> bool:
            try:
                chat(fleet, key, other=other)
            except openai.AuthenticationError as exc:
                return exc.code == "invalid_api_key"
            return False

        wait_for(lambda: refused(False), timeout_s=10, what="the revoke reaches the router")
        wait_for(lambda: refused(True), timeout_s=10, what="the revoke reaches the other")
        assert time.monotonic() - revoked_at < 5.0

    def test_unknown_key_is_401_once_keys_exist(self, fleet: Fleet) -> None:
        """With keys in the controller, a key it does not know is refused."""
        create(fleet, "someone")
        with pytest.raises(openai.AuthenticationError) as info:
            chat(fleet, "sk-llmgw-not-a-key")
        assert info.value.code == "invalid_api_key"

    def test_model_outside_the_allowlist_is_403_and_hidden(self, fleet: Fleet) -> None:
        """A key for m1 gets 403 model_not_allowed on m2, and /v1/models lists only m1."""
        key = create(fleet, "only-m1", "--models", "m1")
        with pytest.raises(openai.PermissionDeniedError) as info:
            chat(fleet, key, model="m2")
        assert info.value.code == "model_not_allowed"
        with client(fleet, key) as c:
            assert [m.id for m in c.models.list()] == ["m1"]
            with pytest.raises(openai.NotFoundError):
                c.models.retrieve("m2")
        assert chat(fleet, key).choices

    def test_rpm_limit_is_429_with_openai_headers(self, fleet: Fleet) -> None:
        """A key of 60 rpm over two routers: answers carry x-ratelimit-* naming the whole
        limit; past this router's share it is 429 rate_limit_exceeded with Retry-After."""
        key = create(fleet, "rpm60", "--rpm", "60")
        wait_for(
            lambda: (
                series(metrics(fleet.router.url), "llmgw_router_team_rpm_share", team="t") >= 25
            ),
            timeout_s=30,
            what="the router holds about half of the rpm",
        )
        with client(fleet, key) as c:
            raw = c.chat.completions.with_raw_response.create(
                model="m1", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
            assert raw.headers["x-ratelimit-limit-requests"] == "60"
            # A share of the minute, never all of it.
            assert 0 <= int(raw.headers["x-ratelimit-remaining-requests"]) < 59
            assert raw.headers["x-ratelimit-reset-requests"].endswith("s")
            stream = c.chat.completions.with_raw_response.create(
                model="m1", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
            )
            assert stream.headers["x-ratelimit-limit-requests"] == "60"
            assert list(stream.parse())

        def refused() -> openai.RateLimitError | None:
            try:
                chat(fleet, key)
            except openai.RateLimitError as exc:
                return exc
            return None

        err = wait_for(refused, timeout_s=30, what="the router's share is spent")
        assert err.code == "rate_limit_exceeded"
        headers = err.response.headers
        assert 1 <= int(headers["Retry-After"]) <= 60
        assert headers["x-ratelimit-remaining-requests"] == "0"

    def test_spent_budget_is_insufficient_quota(self, fleet: Fleet) -> None:
        """Once the engine's usage has spent the budget fleet-wide, the key gets 429
        insufficient_quota (before that, a router out of its allowance says retry)."""
        key = create(fleet, "tiny", "--budget-tokens", "1", "--per", "day")
        wait_for(lambda: _status(fleet, key) == 200, timeout_s=30, what="an allowance")

        def spent() -> str | None:
            try:
                chat(fleet, key)
            except openai.RateLimitError as exc:
                return exc.code if exc.code == "insufficient_quota" else None
            return None

        assert wait_for(spent, timeout_s=30, what="the fleet's budget spent") == (
            "insufficient_quota"
        )

    def test_keys_hold_while_the_controller_is_away(self, fleet: Fleet) -> None:
        """With the controller stopped, the router's last list stays in force: a key it
        had keeps working and a key revoked before stays refused."""
        # Last in the module: it stops the module's controller.
        kept = create(fleet, "kept")
        gone = create(fleet, "gone")
        ctl(fleet.c.url, "keys", "revoke", "gone")
        wait_for(lambda: _status(fleet, gone) == 401, timeout_s=10, what="revoke followed")
        fleet.c.program.stop(grace_s=5)
        assert _status(fleet, kept) == 200
        assert _status(fleet, gone) == 401


def _status(f: Fleet, key: str, *, other: bool = False) -> int:
    try:
        chat(f, key, other=other)
    except openai.APIStatusError as exc:
        return exc.status_code
    return 200


class TestStandaloneRouter:
    """A router without a controller enforces the same fields from its file."""

    def test_file_key_with_models_and_rpm(self, tmp_path: Path) -> None:
        """`api_keys[]` with models and rpm: 403 outside the list, 429 past the rate; the
        access log names the key and its team on every line, never the key itself."""
        key = "sk-file-key-1"
        with sim_engines(tmp_path, [200.0], model="m1") as engines:
            cfg = base_config(
                # m2 is known (so not a 404) but never reached: the key may not use it.
                endpoints=[
                    *endpoint_entries(engines, model="m1"),
                    {"id": "other", "url": engines[0].url, "models": ["m2"]},
                ],
                api_keys=[
                    {
                        "name": "filed",
                        "sha256": hashlib.sha256(key.encode()).hexdigest(),
                        "team": "ops",
                        "models": ["m1"],
                        "rpm": 1,
                    }
                ],
                access_log=True,
            )
            path = write_config(config_path(tmp_path), cfg)
            argv = ["router", "--config", str(path), "--port", "0", "--log-format", "json"]
            with start_program([*argv, "--workers", "1"], log_dir=tmp_path) as r:
                msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
                with openai.OpenAI(base_url=r.url + "/v1", api_key=key, max_retries=0) as c:
                    with pytest.raises(openai.PermissionDeniedError):
                        c.chat.completions.create(model="m2", messages=msgs, max_tokens=2)
                    assert c.chat.completions.create(model="m1", messages=msgs, max_tokens=2)
                    with pytest.raises(openai.RateLimitError) as info:
                        c.chat.completions.create(model="m1", messages=msgs, max_tokens=2)
                assert info.value.code == "rate_limit_exceeded"
                log = r.log_text()
        assert key not in log
        lines = [json.loads(x) for x in log.splitlines() if x.startswith("{")]
        access = [x for x in lines if x.get("logger") == "llmgw.router.access"]
        assert [(x["status"], x["key"], x["team"]) for x in access] == [
            (403, "filed", "ops"),
            (200, "filed", "ops"),
            (429, "filed", "ops"),
        ]
