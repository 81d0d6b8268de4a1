"""Anthropic's Models API through a real router, with the official `anthropic` package.

One sim-engine behind two routers, one with keys (one of them restricted to two
models) and one without; `models.list()` (paged, forward and backward) and
`models.retrieve()`, sync and async, and the errors as the package raises them.
The `openai` package's models.list() on the same routes still gets OpenAI's list.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import openai
import pytest

from llmgw.router.request.auth import hash_key

from .router_fixtures import MODEL, base_config, endpoint_entries, router, sim_engines

pytestmark = pytest.mark.timeout(120)

KEY = "sk-models-all"
NARROW = "sk-models-narrow"
# Known models with no replica: the list holds what a router can serve or hold for.
COLD = ["cold-a", "cold-b", "org/cold-c"]
ALL = sorted([MODEL, *COLD])


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A sim-engine behind a router with keys and another without; their URLs."""
    log_dir = tmp_path_factory.mktemp("router-anthropic-models")
    keys = [
        {"name": "all", "sha256": hash_key(KEY)},
        {"name": "narrow", "sha256": hash_key(NARROW), "models": [MODEL, "cold-b"]},
    ]
    with sim_engines(log_dir, [100.0]) as engines:
        common = {"endpoints": endpoint_entries(engines), "models": COLD}
        with (
            router(log_dir, base_config(api_keys=keys, **common), name="keyed") as keyed,
            router(log_dir, base_config(**common), name="open") as open_,
        ):
            yield keyed.url, open_.url


@pytest.fixture
def keyed(urls: tuple[str, str]) -> str:
    return urls[0]


@pytest.fixture
def open_url(urls: tuple[str, str]) -> str:
    return urls[1]


Make = Callable[..., anthropic.Anthropic]
Auth = Callable[[str], dict[str, Any]]


def _api_key(key: str) -> dict[str, Any]:
    # The package's own way; which header carries the key depends on its version
    # (x-api-key in the 0.x releases, `Authorization: Bearer` in some later ones).
    return {"api_key": key}


def _x_api_key(key: str) -> dict[str, Any]:
    return {"api_key": None, "default_headers": {"x-api-key": key}}


@pytest.fixture(params=[_api_key, _x_api_key], ids=["api_key", "x-api-key"])
def auth(request: pytest.FixtureRequest) -> Auth:
    """The client's key as the package sends it, then in x-api-key whatever its version."""
    way: Auth = request.param
    return way


@pytest.fixture
def client(auth: Auth) -> Iterator[Make]:
    """Sync clients (url, key=KEY), each closed after the test."""
    made: list[anthropic.Anthropic] = []

    def make(url: str, key: str = KEY) -> anthropic.Anthropic:
        made.append(anthropic.Anthropic(base_url=url, max_retries=0, **auth(key)))
        return made[-1]

    yield make
    for c in made:
        c.close()


class TestList:
    """client.models.list() against the router."""

    def test_all_models_with_a_key(self, client: Make, keyed: str) -> None:
        """A key lists every known model as Anthropic's model objects."""
        got = list(client(keyed).models.list())
        assert [m.id for m in got] == ALL
        first = got[0]
        assert ("model", ALL[0]) == (first.type, first.display_name)
        assert first.created_at.year == 1970

    def test_paging_forward(self, client: Make, keyed: str) -> None:
        """With a limit, each page holds that many and the package pages on to the end."""
        page = client(keyed).models.list(limit=3)
        assert ALL[:3] == [m.id for m in page.data]
        assert (True, ALL[0], ALL[2]) == (page.has_more, page.first_id, page.last_id)
        assert page.has_next_page()
        rest = page.get_next_page()
        assert ALL[3:] == [m.id for m in rest.data]
        assert not rest.has_next_page()
        assert [m.id for m in client(keyed).models.list(limit=1)] == ALL

    def test_paging_backward(self, client: Make, keyed: str) -> None:
        """before_id pages backward from first_id."""
        page = client(keyed).models.list(limit=2, before_id=ALL[-1])
        assert ALL[-3:-1] == [m.id for m in page.data]
        back = page.get_next_page()
        assert ALL[:1] == [m.id for m in back.data]
        assert not back.has_next_page()

    def test_restricted_key(self, client: Make, keyed: str) -> None:
        """A key restricted to some models lists only those."""
        page = client(keyed, NARROW).models.list()
        assert [m.id for m in page.data] == ["cold-b", MODEL]
        assert (page.has_more, page.data[0].type) == (False, "model")

    def test_keys_off(self, client: Make, open_url: str) -> None:
        """A router without keys lists every model, whatever key the client sends."""
        page = client(open_url, "anything").models.list()
        assert [m.id for m in page.data] == ALL
        assert {"model"} == {m.type for m in page.data}
        assert (False, ALL[-1]) == (page.has_more, page.last_id)

    async def test_async(self, auth: Auth, keyed: str) -> None:
        """The async client pages through the same list."""
        aclient = anthropic.AsyncAnthropic(base_url=keyed, max_retries=0, **auth(KEY))
        assert [m.id async for m in aclient.models.list(limit=2)] == ALL
        await aclient.close()

    def test_bad_key(self, client: Make, keyed: str) -> None:
        """A wrong key is Anthropic's authentication_error."""
        with pytest.raises(anthropic.AuthenticationError) as info:
            client(keyed, "wrong").models.list()
        assert info.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]

    def test_bad_limit(self, client: Make, keyed: str) -> None:
        """A limit out of range is Anthropic's invalid_request_error."""
        with pytest.raises(anthropic.BadRequestError) as info:
            client(keyed).models.list(limit=0)
        assert info.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]


class TestRetrieve:
    """client.models.retrieve(id) against the router."""

    def test_known(self, client: Make, keyed: str) -> None:
        """A known model, with or without a replica, is its model object."""
        for name in (MODEL, "cold-a", "org/cold-c"):
            got = client(keyed).models.retrieve(name)
            assert (name, "model") == (got.id, got.type)

    def test_keys_off(self, client: Make, open_url: str) -> None:
        """A router without keys answers without one."""
        got = client(open_url, "anything").models.retrieve(MODEL)
        assert (got.id, got.type, got.display_name) == (MODEL, "model", MODEL)

    def test_unknown(self, client: Make, keyed: str, open_url: str) -> None:
        """An unknown model is Anthropic's not_found_error, keys on or off."""
        for url in (keyed, open_url):
            with pytest.raises(anthropic.NotFoundError) as info:
                client(url).models.retrieve("nope")
            assert info.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]

    def test_restricted_key(self, client: Make, keyed: str) -> None:
        """A restricted key finds its own models and not the others."""
        assert client(keyed, NARROW).models.retrieve("cold-b").id == "cold-b"
        with pytest.raises(anthropic.NotFoundError):
            client(keyed, NARROW).models.retrieve("cold-a")

    def test_bad_key(self, client: Make, keyed: str) -> None:
        """A wrong key is Anthropic's authentication_error."""
        with pytest.raises(anthropic.AuthenticationError) as info:
            client(keyed, "wrong").models.retrieve(MODEL)
        assert info.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


class TestRequestId:
    """Every answer on the Anthropic-shaped paths carries the request id where the
    anthropic package reads it (`request-id`): the access log's id, never None."""

    def test_list_and_retrieve(self, client: Make, keyed: str) -> None:
        """A page of the list and one model: `request_id` is the router's x-request-id."""
        c = client(keyed)
        for raw in (
            c.models.with_raw_response.list(limit=2),
            c.models.with_raw_response.retrieve(MODEL),
        ):
            assert raw.request_id == raw.headers["x-request-id"]

    def test_errors(self, client: Make, keyed: str) -> None:
        """A wrong key, a bad limit, an unknown model and a path the router does not serve
        under /v1/messages: each error's `request_id` is the router's x-request-id."""
        c = client(keyed)
        calls: list[Callable[[], object]] = [
            lambda: client(keyed, "wrong").models.list(),
            lambda: client(keyed, "wrong").models.retrieve(MODEL),
            lambda: c.models.list(limit=0),
            lambda: c.models.retrieve("nope"),
            lambda: c.messages.batches.list(),
        ]
        for call in calls:
            with pytest.raises(anthropic.APIStatusError) as info:
                call()
            assert info.value.request_id == info.value.response.headers["x-request-id"]


class TestOpenAiUnchanged:
    """The openai package on the same routes still gets OpenAI's shapes."""

    def test_list_and_retrieve(self, keyed: str) -> None:
        """models.list() is OpenAI's whole list; retrieve its model object."""
        with openai.OpenAI(base_url=keyed + "/v1", api_key=NARROW, max_retries=0) as oai:
            assert [m.id for m in oai.models.list()] == ["cold-b", MODEL]
            assert oai.models.retrieve(MODEL).object == "model"
            with pytest.raises(openai.NotFoundError) as info:
                oai.models.retrieve("cold-a")
        assert info.value.code == "model_not_found"

    def test_bad_key(self, keyed: str) -> None:
        """A wrong bearer is OpenAI's invalid_api_key."""
        oai = openai.OpenAI(base_url=keyed + "/v1", api_key="wrong", max_retries=0)
        with oai, pytest.raises(openai.AuthenticationError) as info:
            oai.models.list()
        assert info.value.code == "invalid_api_key"
