"""One client cannot take the router's shared budgets, and every refusal is an answer.

Attackers connect from 127.0.0.2, other clients from 127.0.0.3 (both loopback, so
the router sees two addresses). Real processes only (a sim-engine, a router),
bounded in count and time.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.testing import Program
from llmgw.testing.wait import wait_until
from tests.integration.hostile import Answer as RawAnswer
from tests.integration.hostile import assert_openai_error, no_traceback, parse_answer
from tests.integration.router_fixtures import (
    MODEL,
    base_config,
    chat_body,
    endpoint_entries,
    router,
    sim_engines,
)

pytestmark = pytest.mark.timeout(120)

ATTACKER = "127.0.0.2"
OTHER = "127.0.0.3"
MIB = 1024 * 1024


@contextlib.contextmanager
def fleet(tmp_path: Path, **cfg: Any) -> Iterator[Program]:
    with sim_engines(tmp_path, [200.0]) as engines:
        conf = base_config(endpoints=endpoint_entries(engines), **cfg)
        with router(tmp_path, conf) as r:
            yield r


def connect(port: int, source: str, *, timeout_s: float = 15.0) -> socket.socket:
    return socket.create_connection(
        ("127.0.0.1", port), timeout=timeout_s, source_address=(source, 0)
    )


def post_head(length: int, model: str = MODEL) -> bytes:
    return (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def read_answer(s: socket.socket) -> RawAnswer:
    """Read until the whole answer is in or the server closes; a reset is a failure."""
    out = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        out += chunk
        if b"\r\n\r\n" in out:
            _, headers, body = parse_answer(out)
            if len(body) >= int(headers.get("content-length", "0")):
                break
    status, headers, body = parse_answer(out)
    return RawAnswer(status, headers, body, closed=False, elapsed_s=0)


def served_on(s: socket.socket) -> socket.socket:
    """`s` once the router has taken it (a keep-alive GET /healthz answered on it)."""
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert read_answer(s).status == 200
    return s


def wait_held(r: Program, model: str, n: int, timeout_s: float = 10.0) -> None:
    """Until the router holds `n` requests for `model` (its llmgw_router_held gauge)."""
    want = f'llmgw_router_held{{model="{model}"}} {float(n)}'

    def held() -> bool:
        with urllib.request.urlopen(r.url + "/metrics", timeout=5) as resp:
            return want in resp.read().decode()

    wait_until(held, timeout_s=timeout_s, what=f"{n} requests for {model} held")


def chat(port: int, source: str, text: str, *, model: str = MODEL, pad: int = 0) -> RawAnswer:
    doc = chat_body(text, max_tokens=2, model=model)
    if pad:
        doc["pad"] = "x" * pad
    body = json.dumps(doc).encode()
    with connect(port, source) as s:
        s.sendall(post_head(len(body), model) + body)
        return read_answer(s)


class TestSlowUploadsFromOneAddress:
    """Slow uploads from one address stop no one else."""

    def test_eighty_slow_uploads_stop_no_one_else(self, tmp_path: Path) -> None:
        """80 uploads that declare 8 MiB and send a byte (the issue's attack, under a
        64 MiB budget that eight of them used to fill): others are served meanwhile,
        the attacker's own normal requests too, and each slow upload reads its 408."""
        with fleet(
            tmp_path,
            max_inflight_body_bytes=64 * MIB,
            header_timeout_s=2.0,
            body_timeout_s=30.0,
        ) as r:
            slow: list[socket.socket] = []
            try:
                for _ in range(80):
                    s = connect(r.port, ATTACKER)
                    s.sendall(post_head(8 * MIB) + b"{")
                    slow.append(s)
                t0 = time.monotonic()
                served = [chat(r.port, OTHER, f"other {i}").status for i in range(10)]
                mine = [chat(r.port, ATTACKER, f"mine {i}").status for i in range(3)]
                assert served == [200] * 10
                assert mine == [200] * 3
                # Below min_body_bytes_per_s once header_timeout_s has passed: 408 each,
                # read whole, well before body_timeout_s.
                codes = []
                for s in slow:
                    ans = read_answer(s)
                    codes.append(assert_openai_error(ans, 408)["code"])
                assert codes == ["request_timeout"] * 80
                assert time.monotonic() - t0 < 15
            finally:
                for s in slow:
                    s.close()
            assert r.alive()
            no_traceback(r.log_text())

    def test_tricklers_read_their_408_not_a_reset(self, tmp_path: Path) -> None:
        """20 clients trickle a byte every 0.2 s for 5 s and read only after: each reads
        its 408 (refused at 2 s), not a reset, and an honest upload at 16 KiB/s from
        another address is served meanwhile."""
        with fleet(tmp_path, header_timeout_s=2.0, body_timeout_s=30.0) as r:
            results: list[int | str] = []
            lock = threading.Lock()

            def trickle() -> None:
                try:
                    with connect(r.port, ATTACKER) as s:
                        s.sendall(post_head(100_000) + b"{")
                        with contextlib.suppress(OSError):
                            for _ in range(25):
                                time.sleep(0.2)
                                s.sendall(b" ")
                        got: int | str = read_answer(s).status
                except OSError as exc:
                    got = type(exc).__name__
                with lock:
                    results.append(got)

            threads = [threading.Thread(target=trickle) for _ in range(20)]
            for t in threads:
                t.start()
            try:
                # An honest slow client: 64 KiB at 16 KiB/s, on the same router.
                doc = chat_body("slow but honest", max_tokens=2)
                doc["pad"] = "x" * (64 * 1024)
                body = json.dumps(doc).encode()
                with connect(r.port, OTHER) as s:
                    s.sendall(post_head(len(body)))
                    for i in range(0, len(body), 4096):
                        s.sendall(body[i : i + 4096])
                        time.sleep(0.25)
                    assert read_answer(s).status == 200
            finally:
                for t in threads:
                    t.join(timeout=30)
            assert results == [408] * 20, results
            assert r.alive()
            no_traceback(r.log_text())


class TestBodyBytesPerAddress:
    """One address holding bodies leaves room for others."""

    def test_one_address_holding_bodies_leaves_room_for_others(self, tmp_path: Path) -> None:
        """Bodies held by waiting requests count until they end: one address holding its
        half (2 of 4 MiB) gets 503 for more, while another address is served."""
        with fleet(
            tmp_path,
            models=["late"],
            hold_timeout_s=8.0,
            max_body_bytes=MIB,
            max_inflight_body_bytes=4 * MIB,
        ) as r:
            pad = MIB - 400
            held: list[socket.socket] = []
            try:
                for i in range(2):
                    doc = chat_body(f"held {i}", max_tokens=2, model="late")
                    doc["pad"] = "x" * pad
                    body = json.dumps(doc).encode()
                    s = connect(r.port, ATTACKER)
                    s.sendall(post_head(len(body), "late") + body)
                    held.append(s)
                wait_held(r, "late", 2)
                ans = chat(r.port, ATTACKER, "one more", pad=pad)
                err = assert_openai_error(ans, 503)
                assert err["code"] == "server_busy"
                assert "client address" in err["message"]
                assert chat(r.port, OTHER, "someone else", pad=pad).status == 200
            finally:
                for s in held:
                    s.close()
            assert r.alive()
            no_traceback(r.log_text())


class TestConnectionsPerAddress:
    """Past its share an address reads a 503 and others are served."""

    def test_past_the_share_a_readable_503_and_others_served(self, tmp_path: Path) -> None:
        """max_client_connections 20, share 0.5: the attacker's 11th to 30th connections,
        each sending its request at once, read a 503 (not a reset); another address is
        served while the attacker's ten stay open."""
        with fleet(tmp_path, max_client_connections=20, idle_timeout_s=30.0) as r:
            kept: list[socket.socket] = []
            try:
                for _ in range(10):
                    kept.append(served_on(connect(r.port, ATTACKER)))
                body = json.dumps(chat_body("past the share", max_tokens=2)).encode()
                codes = []
                for _ in range(20):
                    with connect(r.port, ATTACKER) as s:
                        with contextlib.suppress(OSError):
                            s.sendall(post_head(len(body)) + body)
                        ans = read_answer(s)
                        codes.append(assert_openai_error(ans, 503)["code"])
                assert codes == ["too_many_connections"] * 20
                assert [chat(r.port, OTHER, f"o{i}").status for i in range(5)] == [200] * 5
            finally:
                for s in kept:
                    s.close()
            assert r.alive()
            no_traceback(r.log_text())


class TestPastTheCap:
    """Clients past the connection cap read the 503."""

    def test_clients_that_send_at_once_read_the_503(self, tmp_path: Path) -> None:
        """With the cap's ten connections held, twenty clients each send a 1 MiB request
        as soon as they connect and only then read: every one reads the 503, none a
        reset or a broken pipe."""
        with fleet(
            tmp_path,
            max_client_connections=10,
            client_share=1.0,
            idle_timeout_s=30.0,
        ) as r:
            kept = [served_on(connect(r.port, OTHER)) for _ in range(10)]
            try:
                doc = chat_body("past the cap", max_tokens=2)
                doc["pad"] = "x" * MIB
                body = json.dumps(doc).encode()
                got: list[int | str] = []
                for _ in range(20):
                    try:
                        with connect(r.port, ATTACKER) as s:
                            s.sendall(post_head(len(body)) + body)
                            got.append(read_answer(s).status)
                    except OSError as exc:
                        got.append(type(exc).__name__)
                assert got == [503] * 20, got
            finally:
                for s in kept:
                    s.close()
            assert chat(r.port, OTHER, "after").status == 200
            assert r.alive()
            no_traceback(r.log_text())


class TestHeldPerAddress:
    """One address cannot fill the hold queue."""

    def test_one_address_cannot_fill_the_hold_queue(self, tmp_path: Path) -> None:
        """max_held 4, share 0.5: with two of the attacker's requests held for a model
        nobody serves, its third is refused at once, and another address's is held."""
        with fleet(tmp_path, models=["late"], hold_timeout_s=4.0, max_held=4) as r:
            body = json.dumps(chat_body("waiting", max_tokens=2, model="late")).encode()
            held = [connect(r.port, ATTACKER) for _ in range(2)]
            try:
                for s in held:
                    s.sendall(post_head(len(body), "late") + body)
                wait_held(r, "late", 2)
                t0 = time.monotonic()
                ans = chat(r.port, ATTACKER, "a third", model="late")
                err = assert_openai_error(ans, 503)
                assert "from this client address" in err["message"]
                assert time.monotonic() - t0 < 1.0
                # Another address is held (then answered at the hold's end, not at once).
                t0 = time.monotonic()
                ans = chat(r.port, OTHER, "someone else", model="late")
                assert_openai_error(ans, 503)
                assert time.monotonic() - t0 > 2.0
                assert "from this client address" not in ans.body.decode()
            finally:
                for s in held:
                    s.close()
            assert r.alive()
            no_traceback(r.log_text())


class TestRefusedHeads:
    """A head past the limit reads its 400."""

    def test_a_head_past_the_limit_reads_its_400(self, tmp_path: Path) -> None:
        """Five clients each send an 8 MiB head (past 8190 x 130 bytes) in one go and only
        then read: each reads the 400 in OpenAI's shape, none a reset."""
        with fleet(tmp_path) as r:
            line = b"X-Pad: " + b"a" * 8000 + b"\r\n"
            head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + line * 1048
            got: list[int | str] = []
            for _ in range(5):
                try:
                    with connect(r.port, ATTACKER) as s:
                        s.sendall(head)
                        got.append(assert_openai_error(read_answer(s), 400)["code"])
                except OSError as exc:
                    got.append(type(exc).__name__)
            assert got == ["bad_http_request"] * 5, got
            assert r.alive()
            no_traceback(r.log_text())
