"""Token usage through a real controller: reports in, `/admin/usage` and `ctl usage` out."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.controller.api.usage import budget_spent
from llmgw.controller.leases import period_start
from llmgw.controller.store import open_store
from llmgw.testing import Program, start_program
from llmgw.testing.wait import wait_until
from llmgw.wire.keys import Budget, ClientKey
from llmgw.wire.usage import DEFAULT_USAGE_LIMIT, TokenUsage
from tests.integration import controller_harness as harness
from tests.integration import pg
from tests.integration.test_controller_keys import READ, ROUTER, TOKEN, call
from tests.integration.test_ctl_controller import ctl, ctl_process

HOUR = int(time.time() // 3600) * 3600
# The fixture, seen by this module's tests as a global.
pg_schema = pg.pg_schema


def start(tmp_path: Path, *extra: str) -> Program:
    router_file = tmp_path / "router.token"
    router_file.write_text(ROUTER + "\n")
    args = [
        "controller", "--port", "0", "--database", f"sqlite:///{tmp_path}/c.db",
        "--token", TOKEN, "--read-token", READ, "--router-token-file", str(router_file),
        *extra,
    ]  # fmt: skip
    return start_program(args, log_dir=tmp_path)


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Program]:
    prog = start(tmp_path)
    try:
        yield prog
    finally:
        prog.stop()


def tokens(key: str, team: str, model: str, requests: int, prompt: int, completion: int) -> Any:
    return {
        "hour": HOUR,
        "key": key,
        "team": team,
        "model": model,
        "requests": requests,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
    }


def report(router_id: str, *rows: Any, counter_id: str = "") -> Any:
    body = {"router_id": router_id, "sent_at": time.time(), "tokens": list(rows)}
    return {**body, "counter_id": counter_id} if counter_id else body


def post(url: str, body: Any) -> int:
    status, _ = call_raw(url, body)
    return status


def call_raw(url: str, body: Any) -> tuple[int, bytes]:
    """POST /v1/usage with the router token, as a router does."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url + "/v1/usage", data=data, method="POST")
    req.add_header("Authorization", f"Bearer {ROUTER}")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def teams(url: str, *, token: str = TOKEN) -> dict[str, tuple[int, int, int]]:
    status, got = call(url, "GET", "/admin/usage?by=team&since_s=3600", token=token)
    assert status == 200, got
    return {
        r["team"]: (r["requests"], r["prompt_tokens"], r["completion_tokens"]) for r in got["rows"]
    }


class TestUsageRetention:
    """The controller deletes token usage past --usage-retention-days."""

    def test_hours_past_the_retention_are_deleted(self, tmp_path: Path) -> None:
        """An hour 40 days old goes soon after start when 32 days are kept; this hour,
        and one 31 days old, stay."""
        store = open_store(f"sqlite:///{tmp_path}/c.db")
        try:
            store.record_usage(
                "r1",
                [
                    TokenUsage(**{**tokens("alice", "research", "m1", 1, 1, 1), "hour": hour})
                    for hour in (HOUR - 40 * 86_400, HOUR - 31 * 86_400, HOUR)
                ],
            )
        finally:
            store.close()
        prog = start(tmp_path, "--usage-retention-days", "32")
        try:

            def hours() -> list[int] | None:
                status, got = call(prog.url, "GET", f"/admin/usage?by=team&since_s={50 * 86_400}")
                assert status == 200, got
                kept = [r["hour"] for r in got["rows"]]
                return kept if len(kept) == 2 else None

            kept = wait_until(hours, timeout_s=30, what="the 40-day-old hour deleted")
            assert kept == [HOUR - 31 * 86_400, HOUR]
        finally:
            prog.stop()


class TestUsageReports:
    """Reports' token rows kept by the controller."""

    def test_a_retried_report_counts_once(self, controller: Program) -> None:
        """The same report posted twice (its answer lost, say) adds nothing the second time."""
        body = report("r1", tokens("alice", "research", "m1", 2, 30, 7))
        assert post(controller.url, body) == 200
        assert post(controller.url, body) == 200
        assert teams(controller.url) == {"research": (2, 30, 7)}

    def test_two_routers_add_up(self, controller: Program) -> None:
        """Two router processes' totals for one team are summed."""
        assert (
            post(controller.url, report("r1", tokens("alice", "research", "m1", 1, 10, 5))) == 200
        )
        assert post(controller.url, report("r2", tokens("bob", "research", "m1", 2, 20, 6))) == 200
        assert post(controller.url, report("r2", tokens("carol", "infra", "m2", 1, 1, 1))) == 200
        assert teams(controller.url) == {"infra": (1, 1, 1), "research": (3, 30, 11)}

    def test_a_restarted_router_with_a_fixed_router_id_adds_up(self, controller: Program) -> None:
        """A router_id set in the file survives a restart; its new counter's totals, starting
        at zero again, add to the old ones instead of hiding under them."""
        url = controller.url
        old = report("edge-1", tokens("alice", "research", "m1", 5, 50, 10), counter_id="edge-1@a")
        new = report("edge-1", tokens("alice", "research", "m1", 1, 7, 2), counter_id="edge-1@b")
        assert post(url, old) == 200
        assert post(url, new) == 200
        assert teams(url) == {"research": (6, 57, 12)}

    def test_usage_survives_a_controller_restart(self, tmp_path: Path) -> None:
        """What was reported is still there after the controller restarts on its database."""
        prog = start(tmp_path)
        try:
            body = report("r1", tokens("alice", "research", "m1", 4, 40, 8))
            assert post(prog.url, body) == 200
        finally:
            prog.stop()
        prog = start(tmp_path)
        try:
            assert teams(prog.url) == {"research": (4, 40, 8)}
        finally:
            prog.stop()

    @pytest.mark.parametrize(
        ("row", "param"),
        [
            ({"hour": HOUR + 1}, "hour"),
            ({"requests": -1}, "requests"),
            ({"key": ""}, "key"),
            ({"team": "a\u0000b"}, "team"),
            ({"prompt_tokens": "many"}, "prompt_tokens"),
            ({"extra": 1}, "extra"),
        ],
    )
    def test_bad_rows_are_refused_and_nothing_is_kept(
        self, controller: Program, row: dict[str, Any], param: str
    ) -> None:
        """A report with a bad token row is a 400/422 naming the field; none of its rows count."""
        good = tokens("alice", "research", "m1", 1, 1, 1)
        status, body = call_raw(controller.url, report("r1", good, {**good, **row}))
        assert status in (400, 422)
        error = json.loads(body)["error"]
        assert param in (error.get("param") or "") + error["message"]
        assert teams(controller.url) == {}


class TestUsageApi:
    """`GET /admin/usage`: groups, tokens and bad parameters."""

    def test_by_key_names_key_and_team(self, controller: Program) -> None:
        """Rows by key carry the key and its team, and the read-only token may read them."""
        post(controller.url, report("r1", tokens("alice", "research", "m1", 1, 10, 5)))
        status, got = call(controller.url, "GET", "/admin/usage", token=READ)
        assert status == 200
        assert got["by"] == "key"
        assert got["rows"] == [
            {
                "hour": HOUR,
                "key": "alice",
                "team": "research",
                "requests": 1,
                "prompt_tokens": 10,
                "completion_tokens": 5,
            }
        ]

    def test_router_token_may_not_read_usage(self, controller: Program) -> None:
        """The router token reports usage but may not read it back (403)."""
        status, got = call(controller.url, "GET", "/admin/usage", token=ROUTER)
        assert status == 403
        assert got["error"]["type"] == "permission_error"

    @pytest.mark.parametrize(
        ("query", "param"),
        [
            ("by=user", "by"),
            ("since_s=0", "since_s"),
            ("since_s=-5", "since_s"),
            ("since_s=soon", "since_s"),
            ("since_s=nan", "since_s"),
            ("since_s=1e12", "since_s"),
            ("by=key&by=team", "by"),
        ],
    )
    def test_bad_parameters_are_a_400(self, controller: Program, query: str, param: str) -> None:
        """A bad `by` or `since_s` is a 400 in the house error shape, naming the parameter."""
        status, got = call(controller.url, "GET", f"/admin/usage?{query}")
        assert status == 400
        assert got["error"]["type"] == "invalid_request_error"
        assert got["error"]["param"] == param

    def test_in_openapi(self, controller: Program) -> None:
        """/openapi.json describes the route and its parameters."""
        status, doc = call(controller.url, "GET", "/openapi.json")
        assert status == 200
        params = {p["name"] for p in doc["paths"]["/admin/usage"]["get"]["parameters"]}
        assert params == {"by", "since_s", "limit"}
        assert "UsageAnswer" in doc["components"]["schemas"]


class TestUsageLimit:
    """`GET /admin/usage?limit=N`: at most N rows, whole hours, the newest kept."""

    def test_the_newest_whole_hours_that_fit(self, controller: Program) -> None:
        """Three hours of three keys with limit 4: the newest hour, `since` moved to it."""
        rows = [
            {**tokens(k, "t", "m1", 1, 2, 3), "hour": HOUR - i * 3600}
            for i in range(3)
            for k in ("a", "b", "c")
        ]
        assert post(controller.url, report("r1", *rows)) == 200
        status, got = call(controller.url, "GET", "/admin/usage?since_s=86400&limit=4")
        assert status == 200, got
        assert (got["since"], got["truncated"]) == (HOUR, True)
        assert [(r["hour"], r["key"]) for r in got["rows"]] == [(HOUR, k) for k in "abc"]
        status, got = call(controller.url, "GET", "/admin/usage?since_s=86400&limit=9")
        assert (len(got["rows"]), got["truncated"]) == (9, False)

    def test_an_hour_over_the_limit_is_cut(self, controller: Program) -> None:
        """The newest hour alone holds more rows than the limit: its first ones, truncated."""
        post(controller.url, report("r1", *(tokens(k, "t", "m1", 1, 2, 3) for k in "abc")))
        status, got = call(controller.url, "GET", "/admin/usage?limit=2")
        assert status == 200, got
        assert (got["since"], got["truncated"]) == (HOUR, True)
        assert [r["key"] for r in got["rows"]] == ["a", "b"]

    def test_the_default_is_bounded(self, tmp_path: Path) -> None:
        """With more rows than the default limit kept, the answer holds at most that many."""
        store = open_store(f"sqlite:///{tmp_path}/c.db")
        keys = [f"k{i:05d}" for i in range(DEFAULT_USAGE_LIMIT // 2 + 1)]
        store.record_usage(
            "r1",
            [
                TokenUsage(hour=HOUR - h * 3600, key=k, team="t", model="m", requests=1)
                for h in range(2)
                for k in keys
            ],
        )
        store.close()
        prog = start(tmp_path)
        try:
            status, got = call(prog.url, "GET", "/admin/usage")
            assert status == 200
            assert (len(got["rows"]), got["truncated"]) == (len(keys), True)
            assert {r["hour"] for r in got["rows"]} == {HOUR}
        finally:
            prog.stop()

    @pytest.mark.parametrize("limit", ["0", "-1", "100001", "ten", "1e400", ""])
    def test_bad_limits_are_a_400(self, controller: Program, limit: str) -> None:
        """A limit out of 1..100000 or not an integer is refused naming it."""
        status, got = call(controller.url, "GET", f"/admin/usage?limit={limit}")
        assert (status, got["error"]["param"]) == (400, "limit")


class TestBudgetSpendAtScale:
    """A usage report's budget spend stays cheap however much usage the period holds."""

    def test_a_month_of_usage_is_summed_by_the_store(self, tmp_path: Path) -> None:
        """60,000 rows of 3,000 keys this period: one budgeted key's spend is read in bounded
        time, not by building every key's rows (that took 0.3 s per report at 50,000)."""
        store = open_store(f"sqlite:///{tmp_path}/c.db")
        start = period_start("month", time.time())
        rows = [
            TokenUsage(
                hour=start + (i // 3000) * 3600, key=f"k{i % 3000}", team="t", model="m",
                requests=1, prompt_tokens=3, completion_tokens=4,
            )
            for i in range(60_000)
        ]  # fmt: skip
        for i in range(0, len(rows), 20_000):
            store.record_usage("r1", rows[i : i + 20_000])
        key = ClientKey(name="k7", sha256="a" * 64, budget=Budget(tokens=10**9, per="month"))
        try:
            took = min(timed(lambda: budget_spent(store, [key], time.time())) for _ in range(3))
            assert budget_spent(store, [key], time.time()) == {"k7": 20 * 7}
            # What a spend read cost when it built every key's rows, timed beside it: a
            # ratio holds on a loaded machine, where a fixed budget in seconds does not.
            every = min(timed(lambda: store.usage(since=start, by="key")) for _ in range(3))
        finally:
            store.close()
        assert took < every / 5, f"one key {took:.3f} s, every key {every:.3f} s"


def timed(f: Any) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


class TestCtlUsage:
    """`ctl usage`, table and JSON, and its bad inputs."""

    def test_json_and_table(self, controller: Program) -> None:
        """-o json is the controller's answer; the table shows one line per hour and team."""
        post(controller.url, report("r1", tokens("alice", "research", "m1", 2, 30, 7)))
        got = ctl(controller.url, "usage", "--by", "team", "--since", "2h", "-o", "json")
        assert got.code == 0, got.err
        data = got.json()
        assert isinstance(data, dict)
        assert [(r["team"], r["prompt_tokens"]) for r in data["rows"]] == [("research", 30)]
        table = ctl(controller.url, "usage", "--by", "team", "-o", "wide")
        assert table.code == 0, table.err
        header, line = table.out.splitlines()
        assert header.split() == [
            "HOUR", "(UTC)", "TEAM", "REQUESTS", "PROMPT", "COMPLETION", "TOTAL",
        ]  # fmt: skip
        assert line.split()[2:] == ["research", "2", "30", "7", "37"]

    def test_no_usage_says_so(self, controller: Program) -> None:
        """No usage: a line on stderr, exit 0."""
        got = ctl(controller.url, "usage", "-o", "wide")
        assert (got.code, got.out) == (0, "")
        assert got.err.startswith("no usage since ")

    @pytest.mark.parametrize("since", ["soon", "0h", "-1d", "5"])
    def test_bad_duration_exits_2(self, controller: Program, since: str) -> None:
        """A bad --since is a bad command line: exit 2 and a clear line, nothing asked."""
        got = ctl_process(controller.url, "usage", f"--since={since}")
        assert got.returncode == 2
        assert "--since" in got.stderr
        assert since in got.stderr
        assert "Traceback" not in got.stderr

    def test_a_cut_answer_says_so(self, controller: Program) -> None:
        """--limit below the rows: the newest rows shown, and a line on stderr saying from when."""
        post(controller.url, report("r1", *(tokens(k, "t", "m1", 1, 2, 3) for k in "abc")))
        got = ctl(controller.url, "usage", "--limit", "2", "-o", "wide")
        assert got.code == 0, got.err
        assert [line.split()[2] for line in got.out.splitlines()[1:]] == ["a", "b"]
        assert "more rows than --limit 2" in got.err

    @pytest.mark.parametrize("limit", ["0", "100001", "ten"])
    def test_bad_limit_exits_2(self, controller: Program, limit: str) -> None:
        """A --limit outside 1..100000 is a bad command line: exit 2, nothing asked."""
        got = ctl_process(controller.url, "usage", f"--limit={limit}")
        assert got.returncode == 2
        assert "--limit" in got.stderr
        assert "Traceback" not in got.stderr

    def test_bad_by_exits_2(self, controller: Program) -> None:
        """--by outside key, team, model is a bad command line."""
        got = ctl_process(controller.url, "usage", "--by", "user")
        assert got.returncode == 2
        assert "--by" in got.stderr


@pytest.mark.postgres
class TestStandby:
    """Controllers sharing one PostgreSQL database."""

    def test_a_standby_keeps_reports_and_the_leader_reads_them(
        self, pg_schema: pg.PgSchema
    ) -> None:
        """A report posted to the standby is kept (usage is not fleet state, and a standby
        refusing it would make routers lose it); the leader sums it with its own."""
        db = harness.Db(pg_schema.url, pg_schema.schema)
        with harness.controller(db) as a:
            assert a.leader()
            with harness.controller(db) as b:
                assert not b.leader()
                body = report("r1", tokens("alice", "research", "m1", 2, 20, 4))
                assert post(b.url, body) == 200
                assert post(a.url, report("r2", tokens("bob", "research", "m1", 1, 5, 1))) == 200
                # Again, to the other one: still counted once.
                assert post(a.url, body) == 200
                for c in (a, b):
                    got = c.get("/admin/usage?by=team")
                    assert [
                        (r["team"], r["requests"], r["prompt_tokens"]) for r in got["rows"]
                    ] == [("research", 3, 25)]
