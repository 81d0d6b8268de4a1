"""The router's route table: which method and path get which answer, in memory."""

from __future__ import annotations

import pytest

from llmgw.router.apis.passthrough import PassThrough
from llmgw.router.http.routes import FastRoutes
from llmgw.router.http.server import FastServer
from llmgw.runtime.httpserver import Edge, ServerLimits, openai_error
from tests.unit.router_world import Answered, Pipe, World


def ask(method: str, path: str) -> Answered:
    """One bodiless request through the router's server and its whole route table."""
    w = World("models: [m]\n")
    routes = FastRoutes(w.proxy, PassThrough(w.proxy))
    edge = Edge(ServerLimits(decompress=False), openai_error, name="router")
    server = FastServer(edge, routes, max_body_bytes=w.router.cfg.max_body_bytes)

    async def main() -> Answered:
        conn = server.protocol()
        pipe = Pipe(conn)
        conn.connection_made(pipe)
        head = f"{method} {path} HTTP/1.1\r\nHost: router\r\nConnection: close\r\n\r\n"
        conn.data_received(head.encode())
        await pipe.closed
        return Answered(bytes(pipe.out))

    answered: Answered = w.run(main)
    return answered


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
        """Each answer's status; a 405 offers GET, and never to a GET."""
        got = ask(method, path)
        assert got.status == status, got.body
        if status == 405:
            assert got.headers["Allow"] == "GET"
            assert (
                f"Method {method} is not allowed on {path}; use GET."
                == (got.json()["error"]["message"])
            )
        if status == 404 and path != "/v1/models/nope":
            assert got.json()["error"]["code"] == "unknown_url"
