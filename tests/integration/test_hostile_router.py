"""The router as a hostile client meets it: every answer OpenAI's error object, one log
line per refusal, the process up, and its memory and descriptors back where they were.

Real processes on 127.0.0.1 only (a sim-engine, a router), bounded in count and time.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import io
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgw.testing import Program, start_program, wait_until
from tests.integration.hostile import (
    Answer,
    assert_openai_error,
    log_lines,
    no_traceback,
    open_fds,
    parse_answer,
    raw_request,
    rss_kib,
    wait_fds_at_most,
)
from tests.integration.router_fixtures import (
    MODEL,
    base_config,
    chat_body,
    config_path,
    endpoint_entries,
    post,
    router,
    sim_engines,
    write_config,
)

pytestmark = pytest.mark.timeout(90)

REFUSED = "refused request"


def head(method: str, path: str, *lines: str, body: bytes = b"") -> bytes:
    out = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n" + "".join(f"{x}\r\n" for x in lines)
    return out.encode("latin-1") + b"\r\n" + body


def post_json(payload: bytes, *extra: str) -> bytes:
    return head(
        "POST",
        "/v1/chat/completions",
        "Content-Type: application/json",
        f"Content-Length: {len(payload)}",
        "Connection: close",
        *extra,
        body=payload,
    )


def nested(depth: int, *, where: str) -> bytes:
    """A chat body with `depth` levels of arrays at `where`."""
    deep = "[" * depth + "]" * depth
    if where == "top":
        return deep.encode()
    if where == "content":
        return ('{"model": "m", "messages": [{"role": "user", "content": ' + deep + "}]}").encode()
    if where == "tools":
        return ('{"model": "m", "messages": [], "tools": ' + deep + "}").encode()
    return ('{"model": "m", "x": ' + deep + "}").encode()


@contextlib.contextmanager
def fleet(tmp_path: Path, **cfg: Any) -> Iterator[tuple[Program, Program]]:
    with sim_engines(tmp_path, [50.0]) as engines:
        conf = base_config(endpoints=endpoint_entries(engines), **cfg)
        with router(tmp_path, conf) as r:
            yield engines[0], r


class Footprint:
    """RSS and open descriptors of a process, taken after a warm-up."""

    def __init__(self, prog: Program) -> None:
        self.pid = prog.pid
        self.rss = rss_kib(self.pid)
        self.fds = open_fds(self.pid)

    def check(self, *, rss_margin_kib: int = 25_000, fd_margin: int = 6) -> tuple[int, int]:
        fds = wait_fds_at_most(self.pid, self.fds + fd_margin)
        rss = rss_kib(self.pid)
        assert fds <= self.fds + fd_margin, (self.fds, fds)
        assert rss <= self.rss + rss_margin_kib, (self.rss, rss)
        return rss, fds


def warm(url: str) -> None:
    body = json.dumps(chat_body("warm up")).encode()
    for _ in range(5):
        req = urllib.request.Request(
            url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200


def ok_request(port: int) -> Answer:
    ans = raw_request(port, post_json(json.dumps(chat_body("still there")).encode()))
    assert ans.status == 200, ans.body[:300]
    return ans


class TestAnswersBeforeAnyHandler:
    """Answers given before any handler are OpenAI's error object."""

    # (what, raw request): aiohttp's parser refuses each before the router sees it.
    PARSER_CASES = (
        ("header line too long", head("GET", "/healthz", "X-Big: " + "a" * 9000)),
        ("too many headers", head("GET", "/healthz", *(f"X-H{i}: 1" for i in range(200)))),
        ("nul in a header name", head("GET", "/healthz", "Ho\x00st: x")),
        ("space before the colon", head("GET", "/healthz", "X-Bad : 1")),
        (
            "content-length with transfer-encoding",
            head(
                "POST",
                "/v1/chat/completions",
                "Content-Length: 4",
                "Transfer-Encoding: chunked",
                body=b"0\r\n\r\n",
            ),
        ),
        (
            "two content-lengths",
            head("POST", "/v1/completions", "Content-Length: 2", "Content-Length: 3", body=b"{}"),
        ),
        (
            "obfuscated transfer-encoding",
            head("POST", "/v1/completions", "Transfer-Encoding: chunked, identity", body=b"0\r\n"),
        ),
        ("bad method", b"G\x01T / HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("not http at all", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64),
        ("bad version", b"GET / HTTP/9.9\r\nHost: x\r\n\r\n"),
        ("request line too long", b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n"),
    )

    def test_every_answer_is_openais_error_object(self, tmp_path: Path) -> None:
        """Every answer given before a handler is OpenAI's error object."""
        with fleet(tmp_path) as (_, r):
            warm(r.url)
            before = Footprint(r)
            lines0 = len(log_lines(r.log_text(), REFUSED))
            for what, data in self.PARSER_CASES:
                ans = raw_request(r.port, data)
                err = assert_openai_error(ans, 400)
                assert err["code"] == "bad_http_request", (what, err)
                assert ans.closed, what
            # Routing: every path and method answers in OpenAI's shape.
            for method, path, status in (
                ("GET", "/nope", 404),
                ("GET", "/", 404),
                ("DELETE", "/healthz", 405),
                ("POST", "/metrics", 405),
                ("GET", "/v1/nope", 404),
                ("GET", "/v1/chat/completions", 405),
                ("PUT", "/v1/models", 405),
            ):
                ans = raw_request(r.port, head(method, path, "Connection: close"))
                assert_openai_error(ans, status)
                if status == 405:
                    assert ans.headers.get("allow"), (method, path)
            for _ in range(3):
                ok_request(r.port)
            assert r.alive()
            after = before.check()
            text = r.log_text()
            refused = log_lines(text, REFUSED)[lines0:]
            assert len(refused) == len(self.PARSER_CASES), refused
            no_traceback(text)
        print(f"footprint before {before.rss} KiB/{before.fds} fds, after {after}")


class TestUndecodableBodies:
    """Undecodable bodies are a 400 in one log line."""

    def test_each_is_a_400_in_one_log_line(self, tmp_path: Path) -> None:
        """Each undecodable body is a 400 with one log line."""
        bodies: list[tuple[str, bytes]] = []
        for depth in (200, 900, 990, 1000, 1100, 50_000):
            for where in ("top", "content", "tools", "extra"):
                bodies.append((f"depth {depth} at {where}", nested(depth, where=where)))
        bodies += [
            ("objects nested", b'{"model": "m", "x": ' + b'{"a":' * 5000 + b"1" + b"}" * 5001),
            ("invalid utf-8", b'{"model": "m\xff\xfe", "messages": []}'),
            ("lone surrogate", b'{"model": "\\ud800", "messages": []}'),
            ("not json", b"model=m"),
            ("truncated", b'{"model": "m", "messages": [{"role"'),
            ("an array", b'["model", "m"]'),
            ("a number", b"1e999999"),
            ("model a number", b'{"model": 1039.0, "messages": []}'),
            ("model null", b'{"model": null}'),
            ("empty", b""),
        ]
        with fleet(tmp_path) as (_, r):
            warm(r.url)
            before = Footprint(r)
            lines0 = len(log_lines(r.log_text(), REFUSED))
            refusals = 0
            outcomes: list[tuple[str, int, bool]] = []
            for what, payload in bodies:
                ans = raw_request(r.port, post_json(payload))
                # A depth the decoder takes is a request like any other (the sim-engine
                # answers it); anything else is the router's 400. Never a 5xx.
                assert ans.status in (200, 400), (what, ans.status, ans.body[:200])
                if ans.status == 400:
                    assert_openai_error(ans, 400)
                    # The router's own refusals (not an engine's 400 relayed) log a line.
                    mine = "x-llmgw-endpoint" not in ans.headers
                    refusals += mine and ans.json()["error"]["param"] != "model"
                outcomes.append((what, ans.status, "x-llmgw-endpoint" in ans.headers))
            # A gzip bomb: the router does not inflate request bodies.
            bomb = gzip.compress(b"[" * 2_000_000)
            ans = raw_request(r.port, post_json(bomb, "Content-Encoding: gzip"))
            assert_openai_error(ans, 400)
            refusals += 1
            # Broken chunked framing after the head.
            ans = raw_request(
                r.port,
                head(
                    "POST",
                    "/v1/chat/completions",
                    "Transfer-Encoding: chunked",
                    body=b"zz\r\n{}\r\n0\r\n\r\n",
                ),
            )
            assert ans.status == 400, ans.body
            assert_openai_error(ans, 400)
            refusals += 1
            # Declared larger than max_body_bytes: refused before reading.
            ans = raw_request(
                r.port,
                head("POST", "/v1/chat/completions", f"Content-Length: {9 * 1024 * 1024}"),
            )
            assert_openai_error(ans, 413)
            refusals += 1
            ok_request(r.port)
            assert r.alive()
            before.check()
            text = r.log_text()
            assert len(log_lines(text, REFUSED)[lines0:]) == refusals, outcomes
            no_traceback(text)


class TestHeadsTheParserTakes:
    """Heads llhttp parses but the router must not serve are refused before any handler."""

    CHUNKED_BODY = b"2\r\n{}\r\n0\r\n\r\n"
    # (what, raw request, status): each refused before a handler, the connection closed.
    CASES = (
        (
            "a coding before chunked",
            head(
                "POST",
                "/v1/chat/completions",
                "Transfer-Encoding: gzip, chunked",
                body=CHUNKED_BODY,
            ),
            501,
        ),
        (
            "a coding that is not chunked, on a route that reads no body",
            head(
                "GET",
                "/healthz",
                "Transfer-Encoding: xchunked",
                body=b"GET /metrics HTTP/1.1\r\n\r\n",
            ),
            501,
        ),
        (
            "identity",
            head("POST", "/v1/completions", "Transfer-Encoding: identity", body=b"{}"),
            501,
        ),
        ("no Host", b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n", 400),
        ("two Hosts", head("GET", "/healthz", "Host: elsewhere", "Connection: close"), 400),
        ("HTTP/2.0 in the request line", b"GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n", 400),
    )

    def test_each_is_refused_and_the_router_serves_on(self, tmp_path: Path) -> None:
        """Each is a 400 or 501 in OpenAI's shape and one log line; a chat then works."""
        with fleet(tmp_path) as (_, r):
            lines0 = len(log_lines(r.log_text(), REFUSED))
            for what, data, status in self.CASES:
                ans = raw_request(r.port, data)
                err = assert_openai_error(ans, status)
                assert err["code"] == ("not_implemented" if status == 501 else "bad_http_request")
                assert ans.closed, what
            # HTTP/1.0 needs no Host.
            ans = raw_request(r.port, b"GET /healthz HTTP/1.0\r\n\r\n")
            assert ans.status == 200, ans.body
            ok_request(r.port)
            text = r.log_text()
            assert len(log_lines(text, REFUSED)[lines0:]) == len(self.CASES)
            no_traceback(text)

    def test_expect_100_with_a_body_over_the_limit_gets_no_100(self, tmp_path: Path) -> None:
        """A body declared over max_body_bytes gets its 413 with no 100 Continue before it."""
        with fleet(tmp_path) as (_, r):
            data = head(
                "POST",
                "/v1/chat/completions",
                "Content-Type: application/json",
                f"Content-Length: {9 * 1024 * 1024}",
                "Expect: 100-continue",
            )
            # parse_answer reads the first status line: a 100 first would be seen here.
            assert_openai_error(raw_request(r.port, data), 413)
            ok_request(r.port)


class TestBodiesNotJson:
    """A JSON route's body sent as another media type is a 415, none at all is JSON."""

    def test_form_text_and_multipart_are_415(self, tmp_path: Path) -> None:
        """text/plain, a form and multipart (what a page posts without a preflight) are 415."""
        payload = json.dumps(chat_body("hi")).encode()
        with fleet(tmp_path) as (engine, r):
            for path in ("/v1/chat/completions", "/v1/messages"):
                for ctype in (
                    "text/plain",
                    "application/x-www-form-urlencoded",
                    "multipart/form-data; boundary=x",
                ):
                    data = head(
                        "POST",
                        path,
                        f"Content-Type: {ctype}",
                        f"Content-Length: {len(payload)}",
                        "Connection: close",
                        body=payload,
                    )
                    ans = raw_request(r.port, data)
                    assert ans.status == 415, (path, ctype, ans.body)
                    assert "x-llmgw-endpoint" not in ans.headers
                    if path == "/v1/chat/completions":
                        assert_openai_error(ans, 415)
            for ctype in ("application/json; charset=utf-8", "application/vnd.api+json"):
                ans = raw_request(
                    r.port, post_json(payload).replace(b"application/json", ctype.encode())
                )
                assert ans.status == 200, (ctype, ans.body)
            # No Content-Type at all: read as JSON, as vLLM's FastAPI reads it.
            bare = head(
                "POST",
                "/v1/chat/completions",
                f"Content-Length: {len(payload)}",
                "Connection: close",
                body=payload,
            )
            assert raw_request(r.port, bare).status == 200
            no_traceback(r.log_text())
            assert engine.alive()


class TestConnectionsAndSlowClients:
    """Connection and slow-client limits."""

    def test_limits(self, tmp_path: Path) -> None:
        """Connection caps and idle, header and body timeouts hold against slow clients."""
        with fleet(
            tmp_path,
            max_client_connections=40,
            # Every connection comes from 127.0.0.1: the cap as a whole, not a share.
            client_share=1.0,
            idle_timeout_s=2.0,
            header_timeout_s=0.5,
            body_timeout_s=0.5,
        ) as (_, r):
            warm(r.url)
            before = Footprint(r)
            lines0 = len(log_lines(r.log_text(), REFUSED))
            # An established keep-alive connection, used once.
            keep = socket.create_connection(("127.0.0.1", r.port), timeout=5)
            keep.sendall(head("GET", "/healthz"))
            assert keep.recv(65536).startswith(b"HTTP/1.1 200")
            # 60 idle connections: the 39 that fit are held, the rest refused at once.
            idle: list[socket.socket] = []
            refused = 0
            t0 = time.monotonic()
            try:
                for _ in range(60):
                    s = socket.create_connection(("127.0.0.1", r.port), timeout=5)
                    idle.append(s)
                pending = list(idle)

                def over_the_cap_refused() -> bool:
                    nonlocal refused, pending
                    still: list[socket.socket] = []
                    for s in pending:
                        s.setblocking(False)
                        try:
                            data = s.recv(65536)
                        except BlockingIOError:
                            still.append(s)
                            continue
                        ans = Answer(*parse_answer(data), closed=True, elapsed_s=0)
                        err = assert_openai_error(ans, 503)
                        assert err["code"] == "too_many_connections"
                        assert ans.headers["retry-after"] == "1"
                        refused += 1
                    pending = still
                    return refused >= 60 - 39

                wait_until(
                    over_the_cap_refused,
                    timeout_s=3,
                    every_s=0.05,
                    what=lambda: f"{60 - 39} refused; {refused} so far",
                )
                assert refused == 60 - 39, refused
                assert time.monotonic() - t0 < 3
                # The established connection is served on.
                keep.sendall(head("GET", "/healthz"))
                assert keep.recv(65536).startswith(b"HTTP/1.1 200")
                # Idle past idle_timeout_s (2 s): the router closes them; each read waits
                # for that close.
                closed = 0
                for s in idle:
                    s.setblocking(True)
                    s.settimeout(5)
                    try:
                        closed += s.recv(65536) == b""
                    except ConnectionResetError:
                        closed += 1
                assert closed == len(idle), closed
            finally:
                for s in idle:
                    s.close()
                keep.close()
            ok_request(r.port)
            # A head that trickles: 408 after header_timeout_s, connection closed.
            ans = raw_request(r.port, b"GET /healthz HTTP/1.1\r\nHo", pause_s=1.0, rest=b"st: x")
            err = assert_openai_error(ans, 408)
            assert ans.closed
            assert err["code"] == "request_timeout"
            # A body that trickles: 408 after body_timeout_s.
            ans = raw_request(
                r.port,
                head("POST", "/v1/chat/completions", "Content-Length: 100", body=b'{"mo'),
                timeout_s=5,
            )
            assert_openai_error(ans, 408)
            assert ans.elapsed_s < 3
            ok_request(r.port)
            assert r.alive()
            after = before.check()
            text = r.log_text()
            lines = log_lines(text, "refused")
            conn_lines = [x for x in lines if "refused connection" in x]
            assert len(conn_lines) == 60 - 39, conn_lines
            assert len(log_lines(text, REFUSED)[lines0:]) == 2
            no_traceback(text)
        print(f"footprint before {before.rss} KiB/{before.fds} fds, after {after}")


async def post_big(session: aiohttp.ClientSession, url: str, body: bytes) -> int:
    async with session.post(
        url + "/v1/chat/completions",
        data=io.BytesIO(body),
        headers={"Content-Type": "application/json", "Content-Length": str(len(body))},
    ) as resp:
        await resp.read()
        return resp.status


class TestBytesInFlight:
    """Past the byte budget the router answers 503 and does not grow."""

    async def test_past_the_budget_503_and_no_growth(self, tmp_path: Path) -> None:
        """Past the in-flight body budget the router answers 503 and does not grow."""
        mib = 1024 * 1024
        # One address sends them all: the budget as a whole here (its division by
        # address: test_hostile_router_budgets.py).
        with fleet(
            tmp_path,
            max_body_bytes=4 * mib,
            max_inflight_body_bytes=8 * mib,
            body_timeout_s=10.0,
            client_share=1.0,
        ) as (_, r):
            warm(r.url)
            # Large in bytes, small in tokens: the engine ignores a field it does not know.
            pad = "x" * (4 * mib - 300)
            big = json.dumps({**chat_body("big", max_tokens=1), "pad": pad}).encode()
            assert len(big) <= 4 * mib
            before = Footprint(r)

            # Counted as they arrive: three quarters of two bodies are 6 MiB of the 8.
            part = len(big) * 3 // 4

            def partial() -> socket.socket:
                s = socket.create_connection(("127.0.0.1", r.port), timeout=10)
                s.sendall(
                    head(
                        "POST",
                        "/v1/chat/completions",
                        "Content-Type: application/json",
                        f"Content-Length: {len(big)}",
                    )
                    + big[:part]
                )
                return s

            statuses: list[int] = []
            for _round in range(3):
                # Two bodies three quarters in leave no room for a third's declared
                # length: it is refused before its body is read, in well under a second.
                held = [partial(), partial()]
                time.sleep(0.2)
                ans = raw_request(r.port, post_json(big))
                err = assert_openai_error(ans, 503)
                assert err["code"] == "server_busy"
                assert ans.headers["retry-after"] == "1"
                assert ans.elapsed_s < 2
                for s in held:
                    s.sendall(big[part:])
                    data = b""
                    while b"\r\n\r\n" not in data:
                        data += s.recv(65536)
                    statuses.append(int(data.split()[1]))
                    s.close()
                # Ten at once: what fits is served, the rest 503; nothing else.
                async with aiohttp.ClientSession() as session:
                    codes = sorted(
                        await asyncio.gather(*(post_big(session, r.url, big) for _ in range(10)))
                    )
                assert set(codes) <= {200, 503}, codes
                assert 200 in codes, codes
                assert 503 in codes, codes
            assert statuses == [200] * 6, statuses
            ok_request(r.port)
            assert r.alive()
            # The budget bounds what the bodies hold: 8 MiB, decoded once each.
            after = before.check(rss_margin_kib=60_000)
            no_traceback(r.log_text())
        print(f"footprint before {before.rss} KiB/{before.fds} fds, after {after}")


class TestWaitWhenEveryReplicaIsDown:
    """No request waits through more than one probe."""

    async def test_no_request_waits_through_more_than_one_probe(self, tmp_path: Path) -> None:
        """While the only replica's breaker is open, each request is answered by the first
        probe's verdict (cooldown 1.5 s), not after the doubled cooldowns that follow."""
        # The replica fails everything; its breaker opens after one failure.
        with fleet(
            tmp_path,
            hold_timeout_s=30.0,
            breaker={"failure_threshold": 1, "cooldown_s": 1.5, "max_cooldown_s": 12.0},
        ) as (engine, r):
            async with aiohttp.ClientSession() as session:
                async with session.post(
                    engine.url + "/sim/faults", json={"fail_rate": 1.0}
                ) as resp:
                    assert resp.status == 200
                first = await post(session, r.url, chat_body("open it"))
                assert first.status == 500
                opened = time.monotonic()

                async def timed(delay: float) -> tuple[float, float, int, str | None]:
                    await asyncio.sleep(delay)
                    t = time.monotonic()
                    rep = await post(session, r.url, chat_body(f"d{delay}"))
                    return (
                        t - opened,
                        time.monotonic() - opened,
                        rep.status,
                        rep.headers.get("retry-after"),
                    )

                got = await asyncio.wait_for(
                    asyncio.gather(*(timed(d) for d in (0.1, 0.4, 0.8, 1.2))), timeout=20
                )
            for sent, done, status, retry_after in got:
                assert status in (500, 503), got
                if status == 503:
                    assert retry_after is not None
                # Answered by the first probe (1.5 s after opening) plus its own time.
                assert done < 1.5 + 1.5, (sent, done, got)
            assert r.alive()
            no_traceback(r.log_text())


class TestMetricsTokenAndMappedLoopback:
    """The metrics token, and mapped loopback counts as loopback."""

    def test_metrics_needs_its_token_and_mapped_loopback_is_loopback(self, tmp_path: Path) -> None:
        """/metrics needs its token, and IPv4-mapped loopback counts as loopback."""
        if not socket.has_ipv6:
            pytest.skip("no IPv6 on this machine: no dual-stack socket to test")
        try:
            with socket.socket(socket.AF_INET6) as s:
                s.bind(("::", 0))
        except OSError as exc:
            pytest.skip(f"cannot bind [::]: {exc}")
        with sim_engines(tmp_path, [50.0]) as engines:
            conf = base_config(endpoints=endpoint_entries(engines), metrics_token="scrape-secret")
            path = write_config(config_path(tmp_path), conf)
            with start_program(
                ["router", "--config", str(path), "--port", "0", "--host", "::", "--workers", "1"],
                log_dir=tmp_path,
            ) as r:
                base = f"http://127.0.0.1:{r.port}"
                with pytest.raises(urllib.error.HTTPError) as denied:
                    urllib.request.urlopen(base + "/metrics", timeout=5)
                assert denied.value.code == 401
                assert json.loads(denied.value.read())["error"]["code"] == "invalid_metrics_token"
                req = urllib.request.Request(
                    base + "/metrics", headers={"Authorization": "Bearer scrape-secret"}
                )
                with urllib.request.urlopen(req, timeout=5) as resp:
                    assert resp.status == 200
                    assert b"llmgw_" in resp.read()
                # Over the dual-stack socket 127.0.0.1 arrives as ::ffff:127.0.0.1:
                # loopback, so the admin surface (no admin token set) answers.
                with urllib.request.urlopen(base + "/admin/endpoints", timeout=5) as resp:
                    assert resp.status == 200
                    assert json.loads(resp.read())["endpoints"][0]["info"]["models"] == [MODEL]
