"""The retired choice of the proxy's upstream client, and the fast client's pure parts."""

from __future__ import annotations

import logging
from types import MappingProxyType
from typing import Any

import pytest

from llmgw.router.config import check_retired_env, parse
from llmgw.router.errors import RouterConfigError
from llmgw.router.upstream.fast import _fields
from llmgw.router.upstream.fastconn import Headers, Pool


class TestUpstreamClientRetired:
    """`upstream_client` and $LLMGW_ROUTER_UPSTREAM are retired: one client relays."""

    def test_aiohttp_in_the_file_is_refused_clearly(self) -> None:
        """`upstream_client: aiohttp` cannot be honoured: an error naming the setting."""
        with pytest.raises(RouterConfigError, match=r"upstream_client: 'aiohttp': retired"):
            parse("upstream_client: aiohttp")

    def test_any_other_value_in_the_file_is_refused(self) -> None:
        """An unknown client name in the file is refused at parse time."""
        with pytest.raises(RouterConfigError, match="upstream_client"):
            parse("upstream_client: curl")

    def test_fast_in_the_file_is_accepted_with_a_warning(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """`upstream_client: fast` is what the router does anyway: a warning, no error."""
        with caplog.at_level(logging.WARNING, logger="llmgw.router.config"):
            parse("upstream_client: fast")
        assert "retired setting" in caplog.text

    def test_aiohttp_in_the_environment_is_refused_clearly(self) -> None:
        """LLMGW_ROUTER_UPSTREAM=aiohttp is an error naming the variable."""
        with pytest.raises(RouterConfigError, match="LLMGW_ROUTER_UPSTREAM: 'aiohttp'"):
            check_retired_env({"LLMGW_ROUTER_UPSTREAM": "aiohttp"})

    def test_fast_or_nothing_in_the_environment_passes(self) -> None:
        """LLMGW_ROUTER_UPSTREAM unset, empty or `fast` stops nothing."""
        for env in ({}, {"LLMGW_ROUTER_UPSTREAM": ""}, {"LLMGW_ROUTER_UPSTREAM": "fast"}):
            check_retired_env(env)


class TestStreamIdleTimeout:
    """The stream idle bound's default and validation."""

    def test_stream_idle_timeout(self) -> None:
        """The idle bound defaults to 120 s and must be positive."""
        assert parse("{}").stream_idle_timeout_s == 120.0
        with pytest.raises(RouterConfigError, match="stream_idle_timeout_s"):
            parse("stream_idle_timeout_s: 0")


class TestHeaders:
    """Header lookup ignores case."""

    def test_case_insensitive_lookup(self) -> None:
        """Any spelling of a name finds the header; a missing one gives the default."""
        h = Headers([(b"Content-Type", b"text/event-stream"), (b"x-request-id", b"r1")])
        assert h.get("content-type") == "text/event-stream"
        assert h["X-Request-ID"] == "r1"
        assert h.get("missing", "d") == "d"
        assert "CONTENT-TYPE" in h
        assert list(h) == ["Content-Type", "x-request-id"]


class TestRequestHead:
    """Request heads the fast client writes."""

    def test_fields_end_the_head_with_the_length(self) -> None:
        """Header lines in order, then Content-Length and the blank line."""
        out = _fields({"Content-Type": "application/json", "x-request-id": "r1"}, 12)
        assert out == (
            b"Content-Type: application/json\r\nx-request-id: r1\r\nContent-Length: 12\r\n\r\n"
        )

    @pytest.mark.parametrize("value", ["a\r\nX-Evil: 1", "a\nb", "a\rb"])
    def test_line_breaks_are_refused(self, value: str) -> None:
        """A value (or name) that would end its line early never becomes part of a
        head, from a plain dict (the proxy's) or any other mapping."""
        for headers in ({"x-request-id": value}, {value: "x"}):
            with pytest.raises(ValueError, match="line break"):
                _fields(headers, 0)
            with pytest.raises(ValueError, match="line break"):
                _fields(MappingProxyType(headers), 0)

    def test_a_dict_and_another_mapping_give_the_same_lines(self) -> None:
        """A dict and another mapping give the same lines."""
        headers = {"Content-Type": "application/json", "x-request-id": "r\xe9"}
        want = "Content-Type: application/json\r\nx-request-id: r\xe9\r\nContent-Length: 7\r\n\r\n"
        assert _fields(headers, 7) == want.encode()
        assert _fields(MappingProxyType(headers), 7) == want.encode()


class FakeTransport:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


class FakeConn:
    def __init__(self) -> None:
        self.transport = FakeTransport()
        self.idle_since = 0.0
        self.lost = False


def pool_with(*idle_since: float, keepalive_s: float = 4.0) -> tuple[Pool, list[Any]]:
    pool = Pool(keepalive_s)
    conns = [FakeConn() for _ in idle_since]
    for c, t in zip(conns, idle_since, strict=True):
        pool.put(c, t)  # type: ignore[arg-type]
    return pool, conns


class TestPool:
    """The fast client's connection pool."""

    def test_most_recent_first(self) -> None:
        """The connection used last is taken first (the warmest)."""
        pool, conns = pool_with(1.0, 2.0)
        assert pool.take(3.0) is conns[1]

    def test_expired_connections_are_closed_on_take(self) -> None:
        """A connection idle for the keep-alive bound is closed, not handed out."""
        pool, conns = pool_with(0.0)
        assert pool.take(4.0) is None
        assert conns[0].transport.closed

    def test_closing_connection_is_skipped(self) -> None:
        """A connection whose transport is already closing is not handed out."""
        pool, conns = pool_with(1.0, 1.5)
        conns[1].transport.closed = True
        assert pool.take(2.0) is conns[0]

    def test_expire_closes_only_the_old(self) -> None:
        """The sweep closes connections idle past the bound and keeps the rest in order."""
        pool, conns = pool_with(0.0, 3.0, 4.0)
        assert pool.expire(5.0) == 1
        assert pool.idle == conns[1:]
        assert conns[0].transport.closed

    def test_discard_is_idempotent(self) -> None:
        """A connection lost while idle leaves the pool; discarding twice is harmless."""
        pool, conns = pool_with(1.0)
        pool.discard(conns[0])
        pool.discard(conns[0])
        assert pool.idle == []
