"""The passed-through APIs (Responses, Anthropic Messages) as a hostile client meets
them: odd but valid JSON is the engine's to judge or the router's 400 in the API's
own error shape, never a 5xx or a traceback.

Real processes on 127.0.0.1 only (a sim-engine, a router), bounded in count and time.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.testing import Program
from tests.integration.hostile import Answer, no_traceback, peak_kib, raw_request, rss_kib
from tests.integration.router_fixtures import (
    MODEL,
    base_config,
    endpoint_entries,
    router,
    sim_engines,
)

pytestmark = pytest.mark.timeout(90)


@contextlib.contextmanager
def fleet(tmp_path: Path) -> Iterator[Program]:
    """A router in front of one fast sim-engine."""
    with sim_engines(tmp_path, [100.0]) as engines:
        conf = base_config(endpoints=endpoint_entries(engines))
        with router(tmp_path, conf) as r:
            yield r


def post(port: int, path: str, doc: Any) -> Answer:
    payload = json.dumps(doc).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    )
    return raw_request(port, head.encode("ascii") + payload)


def assert_api_error(path: str, ans: Answer) -> None:
    """A 4xx in the route's error shape: Anthropic's on the Messages paths, else OpenAI's."""
    assert 400 <= ans.status < 500, (path, ans.status, ans.body[:300])
    doc = ans.json()
    if path.startswith("/v1/messages"):
        assert doc["type"] == "error", doc
        assert isinstance(doc["error"]["type"], str), doc
        assert isinstance(doc["error"]["message"], str), doc
    else:
        assert set(doc["error"]) >= {"message", "type", "param", "code"}, doc


class TestContentPartsOfOddTypes:
    """Content parts whose `type` is not a string reach the engine's judgement."""

    def test_no_answer_is_a_5xx(self, tmp_path: Path) -> None:
        """A text part, system block or input item typed by an array or an object is a
        request like any other for the router (its conversation key takes it as an opaque
        part): the engine's answer, never the router's 500."""
        cases: list[tuple[str, dict[str, Any]]] = []
        for kind in ([], {}, ["text"]):
            part = {"type": kind, "text": "hi"}
            turn = {"role": "user", "content": [part]}
            cases += [
                ("/v1/messages", {"model": MODEL, "max_tokens": 2, "messages": [turn]}),
                (
                    "/v1/messages",
                    {"model": MODEL, "max_tokens": 2, "system": [part], "messages": []},
                ),
                ("/v1/messages/count_tokens", {"model": MODEL, "messages": [turn]}),
                ("/v1/responses", {"model": MODEL, "max_output_tokens": 2, "input": [turn]}),
            ]
        with fleet(tmp_path) as r:
            for path, doc in cases:
                ans = post(r.port, path, doc)
                if ans.status != 200:
                    assert_api_error(path, ans)
                    assert "x-llmgw-endpoint" in ans.headers, (path, doc, ans.body)
            assert r.alive()
            no_traceback(r.log_text())


def tiny_items(opener: bytes, closer: bytes, size: int) -> bytes:
    """A JSON body of `size` bytes: `opener`, then one-byte items `0,0,...`, then `closer`."""
    n = (size - len(opener) - len(closer) + 1) // 2
    return opener + b",".join([b"0"] * n) + closer


class TestBodiesOfManyTinyItems:
    """A conversation of millions of one-byte items costs the router no more than its bytes."""

    def test_keying_them_stays_small(self, tmp_path: Path) -> None:
        """An 8 MiB `input` or `messages` of `0,0,...` raises the router's peak memory by
        less than 300 MiB (1.3 GB when every item was rewritten into a chat turn)."""
        size = 8 * 1024 * 1024 - 64
        cases = [
            ("/v1/responses", tiny_items(b'{"model":"m","input":[', b"]}", size)),
            ("/v1/messages", tiny_items(b'{"model":"m","max_tokens":1,"messages":[', b"]}", size)),
        ]
        with fleet(tmp_path) as r:
            rss0 = rss_kib(r.pid)
            for path, body in cases:
                head = (
                    f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                    "Connection: close\r\n\r\n"
                )
                ans = raw_request(r.port, head.encode("ascii") + body, timeout_s=60)
                assert ans.status < 500, (path, ans.status, ans.body[:300])
            peak_mib = (peak_kib(r.pid) - rss0) // 1024
            assert peak_mib < 300, peak_mib
            no_traceback(r.log_text())
