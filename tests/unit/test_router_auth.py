"""Client keys and the admin token."""

from __future__ import annotations

import pytest

from llmgw.router.config import ApiKey
from llmgw.router.request.auth import KeyRing, admin_allowed, bearer, hash_key
from llmgw.runtime.netaddr import is_loopback


class TestBearer:
    """Parsing the bearer token."""

    @pytest.mark.parametrize(
        ("header", "expected"),
        [
            ("Bearer abc", "abc"),
            ("bearer abc ", "abc"),
            ("Basic abc", None),
            ("Bearer ", None),
            ("", None),
            (None, None),
        ],
    )
    def test_parse(self, header: str | None, expected: str | None) -> None:
        """Only a non-empty Bearer token is a token."""
        assert expected == bearer(header)


class TestKeyRing:
    """Client keys accepted and refused by the key ring."""

    def test_configured_key_is_accepted(self) -> None:
        """A key whose SHA-256 is configured is accepted and named."""
        ring = KeyRing([ApiKey(name="alice", sha256=hash_key("k-1"))])
        assert ring.enabled
        tenant = ring.check("Bearer k-1")
        assert tenant is not None
        assert tenant.name == "alice"

    def test_wrong_or_missing_key_is_refused(self) -> None:
        """A wrong key, another scheme, or no header is refused."""
        ring = KeyRing([ApiKey(name="alice", sha256=hash_key("k-1"))])
        assert [ring.check(h) for h in ("Bearer k-2", "Basic k-1", None)] == [None] * 3

    def test_uppercase_digest_matches(self) -> None:
        """Digests are compared case-insensitively."""
        ring = KeyRing([ApiKey(name="a", sha256=hash_key("x").upper())])
        tenant = ring.check("Bearer x")
        assert tenant is not None
        assert tenant.name == "a"

    def test_no_keys_means_disabled(self) -> None:
        """An empty ring is disabled (the proxy is open)."""
        assert not KeyRing().enabled


class TestAdmin:
    """Who may use the admin endpoints."""

    def test_token_required_when_configured(self) -> None:
        """With a token, only that bearer opens admin, from anywhere."""
        assert admin_allowed(token="t", authorization="Bearer t", remote="10.0.0.1")
        assert not admin_allowed(token="t", authorization="Bearer u", remote="127.0.0.1")
        assert not admin_allowed(token="t", authorization=None, remote="127.0.0.1")

    def test_loopback_only_without_token(self) -> None:
        """Without a token, loopback callers only."""
        assert admin_allowed(token=None, authorization=None, remote="127.0.0.1")
        assert admin_allowed(token=None, authorization=None, remote="::1")
        assert not admin_allowed(token=None, authorization=None, remote="192.168.1.4")
        assert not admin_allowed(token=None, authorization=None, remote=None)

    @pytest.mark.parametrize(
        ("remote", "expected"),
        [
            ("127.0.0.5", True),
            ("::1", True),
            ("::ffff:127.0.0.1", True),
            ("::ffff:10.0.0.1", False),
            ("10.0.0.1", False),
            ("fe80::1%eth0", False),
            ("garbage", False),
            (None, False),
        ],
    )
    def test_is_loopback(self, remote: str, expected: bool) -> None:
        """Loopback is 127/8 and ::1; unparsable addresses are not loopback."""
        assert expected == is_loopback(remote)


class TestHeadersThatAreNotText:
    """aiohttp hands header bytes that are not UTF-8 on as surrogate escapes: a wrong
    key, never an exception (a 500 anyone could cause without a key)."""

    BAD = "Bearer \udcff\udcfe"

    def test_a_client_key(self) -> None:
        """A malformed Authorization header matches no client key."""
        ring = KeyRing([ApiKey(name="a", sha256=hash_key("k"))])
        assert ring.check(self.BAD) is None

    def test_the_admin_token(self) -> None:
        """A malformed Authorization header is not the admin token."""
        assert not admin_allowed(token="t", authorization=self.BAD, remote="10.0.0.1")
