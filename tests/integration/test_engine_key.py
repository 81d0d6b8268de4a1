"""An engine started with a key answers only its holder on /v1/*, exactly as vLLM does."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import openai
import pytest

from llmgw.testing import Program, start_program

KEY = "k-" + "x" * 40
UNAUTHORIZED = {"error": "Unauthorized"}


@pytest.fixture(params=["flag", "env"])
def keyed_engine(request: pytest.FixtureRequest) -> Iterator[Program]:
    """The key from --api-key, or from VLLM_API_KEY (how the agent passes it)."""
    args = ["sim-engine", "--port", "0", "--model", "m", "--speed", "50"]
    env = None
    if request.param == "flag":
        args += ["--api-key", KEY]
    else:
        env = {"VLLM_API_KEY": KEY}
    with start_program(args, env=env) as prog:
        yield prog


class _Reply:
    def __init__(self, status_code: int, text: str) -> None:
        self.status_code = status_code
        self.text = text

    def json(self) -> object:
        return json.loads(self.text)


class _Client:
    """A few plain HTTP calls (urllib), so nothing of ours is on the client side."""

    def __init__(self, base_url: str) -> None:
        self.base = base_url

    def request(
        self,
        method: str,
        path: str,
        headers: dict[str, str] | None = None,
        json: object = None,
    ) -> _Reply:
        data = None if json is None or method == "GET" else _dumps(json)
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return _Reply(r.status, r.read().decode())
        except urllib.error.HTTPError as e:
            return _Reply(e.code, e.read().decode())

    def get(self, path: str, headers: dict[str, str] | None = None) -> _Reply:
        return self.request("GET", path, headers)

    def post(self, path: str, json: object, headers: dict[str, str] | None = None) -> _Reply:
        return self.request("POST", path, headers, json)


def _dumps(doc: object) -> bytes:
    return json.dumps(doc).encode()


CHAT = {"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}


class TestEngineKey:
    """An engine with a key answers only its holder on /v1/*."""

    def test_v1_needs_the_key(self, keyed_engine: Program) -> None:
        """No key, a wrong key, another scheme: 401 with vLLM's body, on every /v1 route."""
        url = keyed_engine.url
        bad = [
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": f"Basic {KEY}"},
            {"Authorization": KEY},
            {"Authorization": f"Bearer {KEY}x"},
        ]
        c = _Client(url)
        for headers in bad:
            for method, path in (
                ("POST", "/v1/chat/completions"),
                ("POST", "/v1/completions"),
                ("GET", "/v1/models"),
                ("POST", "/v1/embeddings"),
            ):
                r = c.request(method, path, headers=headers, json=CHAT)
                assert r.status_code == 401, (headers, path, r.text)
                assert r.json() == UNAUTHORIZED
        ok = c.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200, ok.text
        # The scheme is case-insensitive in vLLM.
        ok2 = c.get("/v1/models", headers={"Authorization": f"bearer {KEY}"})
        assert ok2.status_code == 200

    def test_health_and_metrics_stay_open(self, keyed_engine: Program) -> None:
        """Health and metrics stay open."""
        c = _Client(keyed_engine.url)
        assert c.get("/health").status_code == 200
        metrics = c.get("/metrics")
        assert metrics.status_code == 200
        assert KEY not in metrics.text
        assert c.get("/version").status_code == 200

    def test_openai_client_with_and_without_the_key(self, keyed_engine: Program) -> None:
        """The official client: AuthenticationError without the key, an answer with it."""
        base = keyed_engine.url + "/v1"
        hi: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
        with (
            openai.OpenAI(base_url=base, api_key="nope", max_retries=0) as bad,
            pytest.raises(openai.AuthenticationError),
        ):
            bad.chat.completions.create(model="m", max_tokens=2, messages=hi)
        with openai.OpenAI(base_url=base, api_key=KEY, max_retries=0) as good:
            out = good.chat.completions.create(model="m", max_tokens=2, messages=hi)
        assert out.choices[0].message.content

    def test_no_key_is_open(self) -> None:
        """Without a key (and no VLLM_API_KEY) /v1 is open, as in vLLM."""
        with start_program(
            ["sim-engine", "--port", "0", "--model", "m", "--speed", "50"],
            env={"VLLM_API_KEY": ""},
        ) as prog:
            assert _Client(prog.url).get("/v1/models").status_code == 200
