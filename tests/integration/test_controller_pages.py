"""`GET /admin/keys` and `GET /admin/models` in pages, through a real controller and ctl.

2,500 keys are written to the SQLite store before the controller starts (one
transaction; 2,500 POSTs would take most of the test), then read back through the
API page by page, while keys are created and revoked between pages.
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.controller.fleet.records import Changes, TenantKey
from llmgw.controller.store import open_store
from llmgw.wire.admin import DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT
from llmgw.wire.keys import ClientKey
from tests.integration.controller_harness import Controller, Db, controller, run_ctl, spec

KEYS = 2_500
NAMES = [f"k{i:05d}" for i in range(KEYS)]


def _seed_keys(db: str, names: list[str]) -> None:
    store = open_store(db)
    try:
        rows = [
            TenantKey(
                key=ClientKey(name=n, sha256=hashlib.sha256(n.encode()).hexdigest(), team="t"),
                created_at=1_700_000_000.0,
            )
            for n in names
        ]
        store.apply(Changes(keys=rows))
    finally:
        store.close()


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    """One controller for the module, started on a store that holds 2,500 keys."""
    tmp = tmp_path_factory.mktemp("pages")
    db = f"sqlite:///{tmp}/c.db"
    _seed_keys(db, NAMES)
    with controller(Db(db), log_dir=tmp) as ctl:
        yield ctl


def page(c: Controller, path: str) -> tuple[list[dict[str, Any]], str | None]:
    """One page: its rows and the `after` its Link rel="next" names (None: the last)."""
    with urllib.request.urlopen(c.url + path, timeout=10) as resp:
        rows = json.loads(resp.read())
        link = resp.headers.get("Link")
    if link is None:
        return rows, None
    m = re.fullmatch(r'<([^>]*)>; rel="next"', link)
    assert m is not None, link
    target = urllib.parse.urlsplit(m.group(1))
    assert target.path == urllib.parse.urlsplit(path).path
    (after,) = urllib.parse.parse_qs(target.query)["after"]
    return rows, after


def walk(c: Controller, route: str, *, limit: int | None = None, between: Any = None) -> list[str]:
    """Every name of a paged route, following each page's cursor; `between(n)` runs
    after page n."""
    names: list[str] = []
    after: str | None = None
    for n in range(10_000):
        query = {k: v for k, v in (("after", after), ("limit", limit)) if v is not None}
        rows, after = page(c, route + ("?" + urllib.parse.urlencode(query) if query else ""))
        names += [r["name"] for r in rows]
        if after is None:
            return names
        assert after == rows[-1]["name"]
        if between is not None:
            between(n)
    raise AssertionError("the cursor never ended")


class TestKeyPages:
    """GET /admin/keys answers in pages of at most `limit` keys, by name."""

    def test_no_parameters_answer_the_first_page_and_say_there_is_more(self, c: Controller) -> None:
        """An old client's request gets the default page, a plain list, and a next link."""
        rows, after = page(c, "/admin/keys")
        assert [r["name"] for r in rows] == NAMES[:DEFAULT_PAGE_LIMIT]
        assert after == NAMES[DEFAULT_PAGE_LIMIT - 1]

    def test_pages_of_the_default_size_hold_every_key_once(self, c: Controller) -> None:
        """Three pages of 1,000, 1,000 and 500: every key once, in name order."""
        turned: list[int] = []
        assert walk(c, "/admin/keys", between=turned.append) == NAMES
        assert turned == [0, 1]

    def test_the_last_page_has_no_next_link(self, c: Controller) -> None:
        """A page that reaches the end says nothing more."""
        rows, after = page(c, f"/admin/keys?after={NAMES[-3]}")
        assert ([r["name"] for r in rows], after) == (NAMES[-2:], None)
        assert page(c, f"/admin/keys?after={NAMES[-1]}") == ([], None)

    def test_a_page_exactly_full_to_the_end_has_no_next_link(self, c: Controller) -> None:
        """`limit` keys left and `limit` asked: the page is the last."""
        rows, after = page(c, f"/admin/keys?after={NAMES[-11]}&limit=10")
        assert (len(rows), after) == (10, None)

    def test_after_is_a_position_not_a_key(self, c: Controller) -> None:
        """A name no key has (a revoked one) still starts the page after it."""
        rows, _ = page(c, "/admin/keys?after=k00499x&limit=2")
        assert [r["name"] for r in rows] == ["k00500", "k00501"]

    def test_largest_limit_answers_everything(self, c: Controller) -> None:
        """limit=MAX_PAGE_LIMIT holds all 2,500 keys in one page."""
        rows, after = page(c, f"/admin/keys?limit={MAX_PAGE_LIMIT}")
        assert (len(rows), after) == (KEYS, None)

    def test_routers_still_get_every_key(self, c: Controller) -> None:
        """The endpoint list routers follow is not paged: every live key's hash is there."""
        listed = c.get("/v1/endpoints?timeout_s=0")["keys"]
        assert sorted(k["name"] for k in listed) == NAMES


class TestBadPageParameters:
    """A bad `limit` or `after` is a 400 naming it, in the admin API's error shape."""

    @pytest.mark.parametrize("route", ["/admin/keys", "/admin/models"])
    @pytest.mark.parametrize(
        ("query", "param", "words"),
        [
            ("limit=0", "limit", f"1..{MAX_PAGE_LIMIT}"),
            (f"limit={MAX_PAGE_LIMIT + 1}", "limit", f"1..{MAX_PAGE_LIMIT}"),
            ("limit=ten", "limit", "must be an integer"),
            ("limit=1.5", "limit", "must be an integer"),
            ("limit=", "limit", "must be an integer"),
            ("limit=1&limit=2", "limit", "given 2 times"),
            ("after=", "after", "after must be"),
            ("after=-x", "after", "after must be"),
            ("after=a%20b", "after", "after must be"),
            ("after=a%00b", "after", "after must be"),
            ("after=" + "a" * 129, "after", "after must be"),
            ("after=a&after=b", "after", "given 2 times"),
            ("offset=5", "offset", "unknown query parameter"),
        ],
    )
    def test_refused_naming_the_parameter(
        self, c: Controller, route: str, query: str, param: str, words: str
    ) -> None:
        """The status is 400, the type invalid_request_error, `param` the parameter."""
        err = c.error("GET", f"{route}?{query}")
        body = err.body["error"]
        assert (err.status, body["type"], body["param"]) == (400, "invalid_request_error", param)
        assert words in body["message"]

    def test_model_cursor_takes_a_slash(self, c: Controller) -> None:
        """Model names hold '/': a cursor with one is a name, not a refusal."""
        assert page(c, "/admin/models?after=meta-llama%2FLlama-3") == ([], None)

    def test_openapi_lists_the_parameters(self, c: Controller) -> None:
        """The document the controller checks queries against lists limit and after."""
        doc = c.get("/openapi.json")
        for route in ("/admin/keys", "/admin/models"):
            names = [p["name"] for p in doc["paths"][route]["get"]["parameters"]]
            assert names == ["after", "limit"]
            assert "Link" in doc["paths"][route]["get"]["responses"]["200"]["headers"]


class TestModelPages:
    """GET /admin/models answers in pages too, and ctl follows them."""

    def test_models_in_pages_and_ctl_lists_all(self, c: Controller) -> None:
        """1,005 models: a first page of 1,000 with a next link; ctl shows all 1,005."""
        models = [f"m{i:04d}" for i in range(1_005)]
        c.post("/admin/models", [spec(m) for m in models], timeout_s=60)
        rows, after = page(c, "/admin/models")
        assert (len(rows), after) == (DEFAULT_PAGE_LIMIT, models[DEFAULT_PAGE_LIMIT - 1])
        assert walk(c, "/admin/models", limit=300) == models
        code, out, err = run_ctl(c, "models", "-o", "json")
        assert (code, err) == (0, "")
        assert [m["name"] for m in json.loads(out)] == models
        code, out, _ = run_ctl(c, "models", "-o", "tsv")
        assert (code, len(out.splitlines())) == (0, 1 + len(models))


class TestCtlKeysList:
    """`ctl keys list` follows the pages to the end."""

    def test_json_prints_one_whole_list(self, c: Controller) -> None:
        """-o json: one JSON list of every key, not the first page."""
        code, out, err = run_ctl(c, "keys", "list", "-o", "json")
        assert (code, err) == (0, "")
        assert [k["name"] for k in json.loads(out)] == NAMES

    def test_tsv_has_a_row_per_key(self, c: Controller) -> None:
        """-o tsv: a header and one row per key."""
        code, out, _ = run_ctl(c, "keys", "list", "-o", "tsv")
        assert code == 0
        assert len(out.splitlines()) == 1 + KEYS


class TestCursorWalk:
    """A walk through the pages while keys change, on a controller of its own."""

    def test_link_is_relative_and_keeps_the_limit(self, tmp_path: Path) -> None:
        """The next link is the route's own path with `after` and the page's `limit`."""
        db = f"sqlite:///{tmp_path}/c.db"
        _seed_keys(db, ["a", "b", "c"])
        with controller(Db(db), log_dir=tmp_path) as c:
            with urllib.request.urlopen(c.url + "/admin/keys?limit=2", timeout=10) as resp:
                assert resp.headers["Link"] == '</admin/keys?after=b&limit=2>; rel="next"'
            with urllib.request.urlopen(c.url + "/admin/keys", timeout=10) as resp:
                assert resp.headers.get("Link") is None

    def test_keys_created_and_revoked_between_pages(self, tmp_path: Path) -> None:
        """Each key that lives through the walk is seen exactly once; a key revoked ahead
        of the cursor is not seen, one created ahead of it is, one behind it is not."""
        db = f"sqlite:///{tmp_path}/c.db"
        _seed_keys(db, NAMES)
        created_ahead, created_behind = "k02400a", "k00001a"
        revoked_ahead = "k02000"

        with controller(Db(db), log_dir=tmp_path) as c:

            def between(n: int) -> None:
                if n == 0:
                    c.post("/admin/keys", {"name": created_ahead, "team": "t"})
                    c.post("/admin/keys", {"name": created_behind, "team": "t"})
                    c.call("DELETE", f"/admin/keys/{revoked_ahead}")
                    c.call("DELETE", "/admin/keys/k00002")  # behind: listed already

            names = walk(c, "/admin/keys", limit=700, between=between)
        assert len(names) == len(set(names))
        assert names == sorted(names)
        assert names == sorted({*NAMES, created_ahead} - {revoked_ahead})
