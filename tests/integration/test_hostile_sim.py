"""The sim-engine under hostile input: vLLM's error body (code = the status), one log
line per refusal, no traceback, the process up. Real process on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmgw.testing import start_program
from tests.integration.hostile import (
    assert_openai_error,
    log_lines,
    no_traceback,
    open_fds,
    raw_request,
    rss_kib,
    wait_fds_at_most,
)
from tests.integration.router_fixtures import sim_args

pytestmark = pytest.mark.timeout(60)


def post(path: str, payload: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    ).encode() + payload


class TestSimEngineRefusals:
    """The sim-engine refuses bad bodies and HTTP in vLLM's shape."""

    def test_undecodable_bodies_and_bad_http(self, tmp_path: Path) -> None:
        """Undecodable bodies and bad HTTP get vLLM's error body."""
        deep = b"[" * 5000 + b"]" * 5000
        cases = [
            ("/v1/chat/completions", b'{"model": "m", "messages": ' + deep + b"}"),
            ("/v1/completions", b'{"model": "m", "prompt": ' + deep + b"}"),
            ("/v1/embeddings", b'{"model": "m", "input": ' + deep + b"}"),
            ("/v1/completions", deep),
            ("/sim/faults", b'{"x": ' + deep + b"}"),
            ("/v1/chat/completions", b'{"model": "m\xff", "messages": []}'),
            ("/v1/completions", b'{"model": "m", "prompt": "x", "max_tokens": 1039.5}'),
            ("/v1/completions", b"[]"),
        ]
        with start_program(sim_args(), log_dir=tmp_path) as sim:
            pid = sim.pid
            raw_request(sim.port, post("/v1/completions", b'{"model":"m","prompt":"hi"}'))
            rss0, fds0 = rss_kib(pid), open_fds(pid)
            n0 = len(log_lines(sim.log_text(), "refused request"))
            for path, payload in cases:
                ans = raw_request(sim.port, post(path, payload))
                err = assert_openai_error(ans, 400)
                assert err["code"] == 400, (path, err)
            # What aiohttp refuses before a handler: JSON too, one line each.
            for data in (
                b"GET /health HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n",
                b"POST /v1/completions HTTP/1.1\r\nContent-Length: 1\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            ):
                assert_openai_error(raw_request(sim.port, data), 400)
            ok = raw_request(sim.port, post("/v1/completions", b'{"model":"m","prompt":"hi"}'))
            assert ok.status == 200
            assert sim.alive()
            assert wait_fds_at_most(pid, fds0 + 4) <= fds0 + 4
            assert rss_kib(pid) < rss0 + 20_000
            text = sim.log_text()
            assert len(log_lines(text, "refused request")[n0:]) == len(cases) + 2
            no_traceback(text)


class TestSimEngineRequestLog:
    """--request-log under hostile request ids."""

    def test_request_id_not_utf8(self, tmp_path: Path) -> None:
        """An x-request-id that is not UTF-8 is written with its bytes escaped: it was a
        500 and a traceback, and the request was left out of the log."""
        log = tmp_path / "requests.jsonl"
        with start_program(sim_args(extra=["--request-log", str(log)]), log_dir=tmp_path) as sim:
            data = post("/v1/completions", b'{"model":"m","prompt":"hi","max_tokens":2}')
            data = data.replace(b"Host: x\r\n", b"Host: x\r\nx-request-id: id-\xff\r\n")
            ans = raw_request(sim.port, data)
            assert ans.status == 200
            sim.stop(grace_s=5)
            no_traceback(sim.log_text())
        got = [json.loads(line)["request_id"] for line in log.read_text().splitlines()]
        assert got == ["id-\\xff"]


class TestSimEngineTraceRecord:
    """/sim/state after trace headers that are not UTF-8."""

    def test_state_answers_json(self, tmp_path: Path) -> None:
        """A traceparent and tracestate holding bytes that are not UTF-8 are recorded with
        those bytes escaped, as the request log writes them: /sim/state answered 500 (JSON
        cannot carry the surrogates aiohttp kept) after such a request, every time."""
        with start_program(sim_args(), log_dir=tmp_path) as sim:
            data = post("/v1/completions", b'{"model":"m","prompt":"hi","max_tokens":2}')
            trace = b"traceparent: 00-\xff\xfe-01\r\ntracestate: k=\xe9t\xc3\xa9\r\n"
            data = data.replace(b"Host: x\r\n", b"Host: x\r\n" + trace)
            assert raw_request(sim.port, data).status == 200
            state = raw_request(
                sim.port, b"GET /sim/state HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            sim.stop(grace_s=5)
            no_traceback(sim.log_text())
        assert state.status == 200
        assert state.json()["last_trace"] == {
            "traceparent": "00-\\xff\\xfe-01",
            "tracestate": "k=\\xe9t\u00e9",
        }
