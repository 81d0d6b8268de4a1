"""The router's route table: which method and path get which answer, in memory."""

from __future__ import annotations

import re

import pytest

from llmgw.router.apis import catalog
from llmgw.router.apis.passthrough import PassThrough
from llmgw.router.http.routes import FastRoutes
from llmgw.router.http.server import FastServer
from llmgw.router.request.auth import hash_key
from llmgw.runtime.httpserver import Edge, ServerLimits, openai_error
from tests.unit.router_world import Answered, Pipe, World


def ask(
    method: str, path: str, headers: dict[str, str] | None = None, config: str = "models: [m]\n"
) -> Answered:
    """One bodiless request through the router's server and its whole route table."""
    w = World(config)
    lines = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    routes = FastRoutes(w.proxy, PassThrough(w.proxy))
    edge = Edge(ServerLimits(decompress=False), openai_error, name="router")
    server = FastServer(edge, routes, max_body_bytes=w.router.cfg.max_body_bytes)

    async def main() -> Answered:
        conn = server.protocol()
        pipe = Pipe(conn)
        conn.connection_made(pipe)
        head = f"{method} {path} HTTP/1.1\r\nHost: router\r\nConnection: close\r\n{lines}\r\n"
        conn.data_received(head.encode())
        await pipe.closed
        return Answered(bytes(pipe.out))

    answered: Answered = w.run(main)
    return answered


# Each answer the router makes itself under /v1, without an engine: (method, path, status).
OWN_V1_ANSWERS = [
    ("GET", "/v1/models", 200),
    ("GET", "/v1/models/m", 200),
    ("GET", "/v1/models/nope", 404),
    ("POST", "/v1/models", 405),
    ("GET", "/v1/chat/completions", 405),
    ("GET", "/v1/nothing", 404),
]


class TestRequestIdsOnOwnAnswers:
    """The router's own /v1 answers carry the request's id, as its proxied ones do."""

    @pytest.mark.parametrize(("method", "path", "status"), OWN_V1_ANSWERS)
    def test_the_clients_id_is_echoed(self, method: str, path: str, status: int) -> None:
        """A client's x-request-id comes back on each of them."""
        got = ask(method, path, {"x-request-id": "rq-7"})
        assert (got.status, got.headers.get("x-request-id")) == (status, "rq-7")

    @pytest.mark.parametrize(("method", "path", "status"), OWN_V1_ANSWERS)
    def test_an_id_is_made_when_none_came(self, method: str, path: str, status: int) -> None:
        """Without one, each carries an id of the router's own, never an empty one."""
        got = ask(method, path)
        assert got.status == status
        assert re.fullmatch(r"[0-9a-f]{24}", got.headers.get("x-request-id", ""))

    def test_a_keys_refusal_carries_it(self) -> None:
        """A model refused to a key that may not use it, 404, in either API's shape."""
        key = f"{{name: k, sha256: {hash_key('sk-k')}, models: [other]}}"
        config = f"models: [m, other]\napi_keys: [{key}]\n"
        for extra in ({}, {"anthropic-version": "2023-06-01"}):
            hdrs = {"x-api-key": "sk-k", "x-request-id": "rq-8", **extra}
            got = ask("GET", "/v1/models/m", hdrs, config)
            assert (got.status, got.headers.get("x-request-id")) == (404, "rq-8")


class TestModelPaths:
    """/v1/models and /v1/models/{model}: 405 only for a method they do not take."""

    @pytest.mark.parametrize(
        ("method", "path", "status"),
        [
            ("GET", "/v1/models", 200),
            ("GET", "/v1/models/m", 200),
            ("GET", "/v1/models/nope", 404),
            ("POST", "/v1/models", 405),
            ("DELETE", "/v1/models/m", 405),
            ("GET", "/v1/models/", 404),
            ("POST", "/v1/models/", 404),
            ("GET", "/v1/modelsx", 404),
            ("PUT", "/v1/models-list", 404),
        ],
    )
    def test_status(self, method: str, path: str, status: int) -> None:
        """Each answer's status; a 405 offers GET and HEAD, and never to a GET."""
        got = ask(method, path)
        assert got.status == status, got.body
        if status == 405:
            assert got.headers["Allow"] == "GET, HEAD"
            assert (
                f"Method {method} is not allowed on {path}; use GET."
                == (got.json()["error"]["message"])
            )
        if status == 404 and path != "/v1/models/nope":
            assert got.json()["error"]["code"] == "unknown_url"


class TestNearMissMessagesPaths:
    """A path under /v1/messages the router does not serve is refused in Anthropic's shape."""

    @pytest.mark.parametrize(
        ("method", "path"),
        [
            ("POST", "/v1/messages/"),
            ("POST", "/v1/messages/batches"),
            ("GET", "/v1/messages/msg_1"),
            ("POST", "/v1/messages/count_tokens/"),
            ("DELETE", "/v1/messages/batches/b1"),
        ],
    )
    def test_anthropic_404(self, method: str, path: str) -> None:
        """404 `not_found_error` in `{"type": "error", "error": {...}}`, the client's id on it."""
        got = ask(method, path, {"x-request-id": "rq-9"})
        assert (got.status, got.headers["x-request-id"]) == (404, "rq-9")
        doc = got.json()
        assert doc["type"] == "error", doc
        assert doc["error"] == {
            "type": "not_found_error",
            "message": f"Invalid URL ({method} {path}).",
        }

    @pytest.mark.parametrize("path", ["/v1/messagesx", "/v1/message", "/v1/chat/completions/"])
    def test_other_paths_keep_openais_404(self, path: str) -> None:
        """A path merely starting with the same letters is OpenAI's `unknown_url`."""
        got = ask("POST", path)
        assert (got.status, got.json()["error"]["code"]) == (404, "unknown_url")


def ask_raw(data: bytes) -> Answered:
    """Raw bytes on one connection to the router's server as the program builds it
    (Anthropic's error shape on the Messages paths), read until it closes."""
    w = World("models: [m]\n")
    routes = FastRoutes(w.proxy, PassThrough(w.proxy))
    edge = Edge(ServerLimits(decompress=False), openai_error, name="router")
    server = FastServer(
        edge, routes, max_body_bytes=w.router.cfg.max_body_bytes, errors=catalog.EDGE_ERRORS
    )

    async def main() -> Answered:
        conn = server.protocol()
        pipe = Pipe(conn)
        conn.connection_made(pipe)
        conn.data_received(data)
        await pipe.closed
        return Answered(bytes(pipe.out))

    answered: Answered = w.run(main)
    return answered


class TestServerAnswersInTheApisShape:
    """What the server answers itself on a Messages path is in Anthropic's error shape."""

    @pytest.mark.parametrize(
        ("head", "status"),
        [
            (b"Host: r\r\n", 408),
            (b"Host: r\r\nx-bad: a\x01b\r\n\r\n", 400),
            (b"Host: r\r\nExpect: later\r\nContent-Length: 2\r\n\r\n{}", 417),
        ],
        ids=["late head", "bad header", "unknown expect"],
    )
    @pytest.mark.parametrize(
        ("path", "anthropic"),
        [
            ("/v1/messages", True),
            ("/v1/messages/count_tokens?beta=true", True),
            ("/tokenize", False),
        ],
    )
    def test_shape(self, head: bytes, status: int, path: str, anthropic: bool) -> None:
        """A late head, a header the parser refuses and an unknown Expect: Anthropic's
        `{"type": "error", ...}` on the Messages paths, OpenAI's object elsewhere."""
        got = ask_raw(f"POST {path} HTTP/1.1\r\n".encode() + head)
        assert got.status == status, got.body
        doc = got.json()
        if anthropic:
            assert doc["type"] == "error", doc
            assert set(doc["error"]) == {"type", "message"}
        else:
            assert set(doc["error"]) == {"message", "type", "param", "code"}
