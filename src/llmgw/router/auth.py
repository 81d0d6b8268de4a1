"""Client API keys and the admin token. Pure: headers in, verdicts out.

Keys live in the config as SHA-256 hex digests, so the file never holds a
usable secret; a presented key is hashed and looked up. The admin token is a
separate secret: a client key never opens the admin surface.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from llmgw.router.config import ApiKey
from llmgw.runtime.netaddr import is_loopback


def hash_key(key: str) -> str:
    """The hex digest stored in `api_keys[].sha256` for `key`.

    surrogateescape: a presented key holding bytes that are not UTF-8 (aiohttp passes
    them on as surrogate escapes) hashes to a wrong key, never raises (a 500)."""
    return hashlib.sha256(_raw(key)).hexdigest()


def _raw(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def bearer(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = token.strip()
    return token or None


class KeyRing:
    """The configured client keys; empty means /v1/* is open."""

    __slots__ = ("_by_digest", "enabled")

    def __init__(self, keys: Iterable[ApiKey] = ()) -> None:
        self._by_digest = {k.sha256.lower(): k.name for k in keys}
        # A plain attribute, not a property: read on every request, from compiled
        # code, where a property of this (interpreted) class is a Python call.
        self.enabled = bool(self._by_digest)

    def check(self, authorization: str | None) -> str | None:
        """The key's name when the header carries a configured key, else None."""
        token = bearer(authorization)
        if token is None:
            return None
        # A dict lookup on the digest leaks nothing useful: an attacker who can time
        # it learns about the hash of their own guess, not about a stored key.
        return self._by_digest.get(hash_key(token))


def bearer_matches(token: str, authorization: str | None) -> bool:
    """Whether the header carries exactly `token` as its bearer (compared in constant time)."""
    presented = bearer(authorization)
    if presented is None:
        return False
    return hmac.compare_digest(_raw(presented), _raw(token))


def admin_allowed(*, token: str | None, authorization: str | None, remote: str | None) -> bool:
    """With a token: the bearer must match it. Without one: loopback callers only."""
    if token is None:
        return is_loopback(remote)
    return bearer_matches(token, authorization)
