"""Anthropic's Models API on the router: the pure paging and shaping, then the model
routes in memory with and without `anthropic-version`."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.router.apis import anthropicmodels as am
from llmgw.router.apis.passthrough import PassThrough
from llmgw.router.http.routes import FastRoutes
from llmgw.router.http.server import FastServer
from llmgw.router.request.auth import hash_key
from llmgw.runtime.httpserver import Edge, ServerLimits, openai_error
from tests.unit.router_world import Answered, Pipe, World

IDS = ["a", "b", "c", "d", "e"]


def ids(page: am.ModelPage) -> list[str]:
    return [m.id for m in page.data]


class TestReadAsk:
    """A list request's query string read into the page it asks for."""

    def test_defaults(self) -> None:
        """No parameters: the first 20, no cursor."""
        assert am.PageAsk(limit=20, after_id=None, before_id=None) == am.read_ask("")

    def test_all_given(self) -> None:
        """limit, after_id and before_id are read; a repeated one counts its last value."""
        got = am.read_ask("limit=5&after_id=x&before_id=y&limit=7&beta=true")
        assert am.PageAsk(limit=7, after_id="x", before_id="y") == got

    def test_blank_is_not_given(self) -> None:
        """A blank parameter is as if not given."""
        assert am.PageAsk() == am.read_ask("limit=&after_id=")

    def test_escaped_cursor(self) -> None:
        """A cursor's percent-escapes are decoded."""
        got = am.read_ask("after_id=org%2Fmodel%20one")
        assert isinstance(got, am.PageAsk)
        assert got.after_id == "org/model one"

    @pytest.mark.parametrize("limit", ["0", "1001", "-1", "+5", " 5", "1_0", "x", "5.0", "٣"])
    def test_bad_limit(self, limit: str) -> None:
        """A limit that is not a whole number from 1 to 1000 is refused with a reason."""
        got = am.read_ask("limit=" + limit)
        assert isinstance(got, str)
        assert got.startswith("limit:")

    @pytest.mark.parametrize(("limit", "want"), [("1", 1), ("1000", 1000), ("0020", 20)])
    def test_bounds(self, limit: str, want: int) -> None:
        """1 and 1000 are taken, as is a number written with leading zeros."""
        assert am.PageAsk(limit=want) == am.read_ask("limit=" + limit)

    def test_huge_limit(self) -> None:
        """A limit of thousands of digits is refused, not a ValueError from int()."""
        assert isinstance(am.read_ask("limit=" + "9" * 5000), str)


class TestPage:
    """One page of the sorted model ids."""

    def test_first_page(self) -> None:
        """Without a cursor: the first `limit` ids, and more after them."""
        got = am.page(reversed(IDS), am.PageAsk(limit=2))
        assert ids(got) == ["a", "b"]
        assert (got.has_more, got.first_id, got.last_id) == (True, "a", "b")

    def test_after(self) -> None:
        """after_id: the ids after it; the last page says no more."""
        got = am.page(IDS, am.PageAsk(limit=2, after_id="c"))
        assert ids(got) == ["d", "e"]
        assert got.has_more is False

    def test_before(self) -> None:
        """before_id: the last `limit` ids before it, and more before those."""
        got = am.page(IDS, am.PageAsk(limit=2, before_id="d"))
        assert ids(got) == ["b", "c"]
        assert got.has_more is True

    def test_between(self) -> None:
        """Both cursors: the ids between them, taken from the before_id end."""
        got = am.page(IDS, am.PageAsk(limit=1, after_id="a", before_id="d"))
        assert ids(got) == ["c"]
        assert got.has_more is True

    def test_cursor_not_listed(self) -> None:
        """A cursor naming no listed model still pages, by order."""
        got = am.page(IDS, am.PageAsk(limit=10, after_id="bb"))
        assert ids(got) == ["c", "d", "e"]

    def test_empty(self) -> None:
        """An empty page has null first and last ids and no more."""
        got = am.page(IDS, am.PageAsk(after_id="z"))
        assert (got.data, got.has_more, got.first_id, got.last_id) == ([], False, None, None)

    @given(
        models=st.sets(st.text(min_size=1, max_size=4), max_size=30),
        limit=st.integers(min_value=1, max_value=7),
    )
    def test_forward_paging_lists_each_once(self, models: set[str], limit: int) -> None:
        """Following last_id while has_more lists every model once, in order."""
        seen: list[str] = []
        ask = am.PageAsk(limit=limit)
        while True:
            got = am.page(models, ask)
            assert len(got.data) <= limit
            seen += ids(got)
            if not got.has_more:
                break
            ask = am.PageAsk(limit=limit, after_id=got.last_id)
        assert sorted(models) == seen

    @given(
        models=st.sets(st.text(min_size=1, max_size=4), max_size=30),
        limit=st.integers(min_value=1, max_value=7),
    )
    def test_backward_paging_lists_each_once(self, models: set[str], limit: int) -> None:
        """Following first_id backward from past the end lists every model once."""
        seen: list[str] = []
        ask = am.PageAsk(limit=limit, before_id="\U0010ffff" * 5)
        while True:
            got = am.page(models, ask)
            seen = ids(got) + seen
            if not got.has_more:
                break
            ask = am.PageAsk(limit=limit, before_id=got.first_id)
        assert sorted(models) == seen


class TestShapes:
    """The model object and the page as JSON."""

    def test_model_info(self) -> None:
        """A model: Anthropic's fields, the epoch for its unknown date, its id as its name."""
        want = (
            b'{"id":"m","display_name":"m","created_at":"1970-01-01T00:00:00Z",'
            b'"type":"model","lifecycle":"active"}'
        )
        assert want == am.encode(am.model_info("m"))

    def test_empty_page(self) -> None:
        """An empty page writes null cursors."""
        got = am.encode(am.page([], am.PageAsk()))
        assert got == b'{"data":[],"has_more":false,"first_id":null,"last_id":null}'

    def test_asked(self) -> None:
        """Only a request naming anthropic-version asks for Anthropic's shape."""
        assert am.asked({"anthropic-version": "2023-06-01"})
        assert not am.asked({"x-api-key": "k"})


KEY = "sk-all"
NARROW = "sk-narrow"
KEYS = (
    "models: [m1, m2, m3]\n"
    f"api_keys: [{{name: all, sha256: {hash_key(KEY)}}},"
    f" {{name: narrow, sha256: {hash_key(NARROW)}, models: [m2]}}]\n"
)
ANTHROPIC = {"anthropic-version": "2023-06-01"}


def get(config: str, path: str, headers: dict[str, str] | None = None) -> Answered:
    """One GET through the router's server and its whole route table, in memory."""
    w = World(config)
    routes = FastRoutes(w.proxy, PassThrough(w.proxy))
    edge = Edge(ServerLimits(decompress=False), openai_error, name="router")
    server = FastServer(edge, routes, max_body_bytes=w.router.cfg.max_body_bytes)
    lines = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())

    async def main() -> Answered:
        conn = server.protocol()
        pipe = Pipe(conn)
        conn.connection_made(pipe)
        head = f"GET {path} HTTP/1.1\r\nHost: router\r\nConnection: close\r\n{lines}\r\n"
        conn.data_received(head.encode())
        await pipe.closed
        return Answered(bytes(pipe.out))

    answered: Answered = w.run(main)
    return answered


class TestModelRoutes:
    """GET /v1/models and /v1/models/{id}: the shape the request asks for, either key header."""

    def test_openai_shape_unchanged(self) -> None:
        """Without anthropic-version the list stays OpenAI's."""
        got = get(KEYS, "/v1/models", {"Authorization": "Bearer " + KEY})
        assert got.status == 200
        doc = got.json()
        assert doc["object"] == "list"
        assert [m["id"] for m in doc["data"]] == ["m1", "m2", "m3"]

    def test_x_api_key_opens_the_openai_list(self) -> None:
        """x-api-key is taken without anthropic-version too, as on /v1/messages."""
        got = get(KEYS, "/v1/models", {"x-api-key": KEY})
        assert got.status == 200
        assert got.json()["object"] == "list"

    def test_anthropic_page(self) -> None:
        """With anthropic-version: one page in Anthropic's shape, its limit and cursor read."""
        got = get(KEYS, "/v1/models?limit=1&after_id=m1", {"x-api-key": KEY, **ANTHROPIC})
        assert got.status == 200
        doc = got.json()
        assert [m["id"] for m in doc["data"]] == ["m2"]
        assert (doc["has_more"], doc["first_id"], doc["last_id"]) == (True, "m2", "m2")
        assert doc["data"][0]["type"] == "model"

    def test_narrow_key_lists_its_models(self) -> None:
        """A key restricted to m2 lists only m2, and cannot retrieve m1."""
        hdrs = {"x-api-key": NARROW, **ANTHROPIC}
        assert [m["id"] for m in get(KEYS, "/v1/models", hdrs).json()["data"]] == ["m2"]
        assert get(KEYS, "/v1/models/m2", hdrs).json()["id"] == "m2"
        assert get(KEYS, "/v1/models/m1", hdrs).status == 404

    def test_anthropic_model(self) -> None:
        """A model retrieved with anthropic-version is Anthropic's model object."""
        got = get("models: [m]\n", "/v1/models/m", ANTHROPIC)
        assert got.status == 200
        assert am.encode(am.model_info("m")) == got.body

    @pytest.mark.parametrize(
        ("path", "headers", "status", "kind"),
        [
            ("/v1/models", {"x-api-key": "wrong"}, 401, "authentication_error"),
            ("/v1/models", {}, 401, "authentication_error"),
            ("/v1/models/m1", {"x-api-key": "wrong"}, 401, "authentication_error"),
            ("/v1/models/nope", {"x-api-key": KEY}, 404, "not_found_error"),
            ("/v1/models?limit=0", {"x-api-key": KEY}, 400, "invalid_request_error"),
        ],
    )
    def test_anthropic_errors(
        self, path: str, headers: dict[str, str], status: int, kind: str
    ) -> None:
        """With anthropic-version every refusal is in Anthropic's error shape."""
        got = get(KEYS, path, {**headers, **ANTHROPIC})
        assert status == got.status
        doc = got.json()
        assert doc["type"] == "error"
        assert kind == doc["error"]["type"]

    def test_openai_errors_unchanged(self) -> None:
        """Without anthropic-version a wrong key is OpenAI's 401 and the limit is ignored."""
        got = get(KEYS, "/v1/models?limit=0", {"x-api-key": "wrong"})
        assert got.status == 401
        assert got.json()["error"]["code"] == "invalid_api_key"
        assert get(KEYS, "/v1/models?limit=0", {"x-api-key": KEY}).status == 200
