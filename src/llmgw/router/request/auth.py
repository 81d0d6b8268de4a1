"""Client API keys and the admin token. Pure: headers in, verdicts out.

Keys live in the config, or come from the controller with the endpoint list, as
SHA-256 hex digests, so neither holds a usable secret; a presented key is hashed
and looked up. An expired key is refused like an unknown one. The admin token is
a separate secret: a client key never opens the admin surface.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from llmgw.router.request.tenants import Tenant
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock
from llmgw.runtime.netaddr import is_loopback
from llmgw.wire.keys import ClientKey


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
    """The client keys in force (the file's and the controller's); empty means /v1/* is open."""

    __slots__ = ("_by_digest", "_clock", "enabled")

    def __init__(
        self,
        keys: Iterable[ClientKey] = (),
        *,
        required: bool = False,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._by_digest = {k.sha256.lower(): Tenant(k) for k in keys}
        self._clock = clock
        # A plain attribute, not a property: read on every request, from compiled
        # code, where a property of this (interpreted) class is a Python call.
        # `required`: a key is needed even with none in force (the controller's last
        # key was revoked: that must not open /v1/* to everyone).
        self.enabled = required or bool(self._by_digest)

    def check(self, authorization: str | None) -> Tenant | None:
        """The key when the header carries one in force (known, not expired), else None."""
        token = bearer(authorization)
        if token is None:
            return None
        # A dict lookup on the digest leaks nothing useful: an attacker who can time
        # it learns about the hash of their own guess, not about a stored key.
        return self._current(hash_key(token))

    def in_force(self, tenant: Tenant) -> bool:
        """Whether a new request with `tenant`'s key would be let in now: asked of a
        request that waited (held, queued) after it was admitted, since a revoke or an
        expiry during its wait must not let it reach an engine."""
        return not self.enabled or self._current(tenant.key.sha256.lower()) is not None

    def allows(self, tenant: Tenant, model: str) -> bool:
        """Whether `tenant`'s key, as it is in force now, may use `model`: asked, after
        `in_force`, of a request that waited, since a reload (or the controller's list)
        may have narrowed the key's `models` (the same hash) during its wait."""
        now = self._current(tenant.key.sha256.lower()) if self.enabled else None
        return now is None or now.models is None or model in now.models

    def _current(self, digest: str) -> Tenant | None:
        """The key whose digest is `digest` when it is in force (known, not expired)."""
        tenant = self._by_digest.get(digest)
        expires_at = None if tenant is None else tenant.expires_at
        if expires_at is not None and self._clock.wall() >= expires_at:
            return None
        return tenant


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
