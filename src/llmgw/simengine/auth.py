"""`--api-key`: every route but `/health`, `/metrics` and `/version` needs the key.

vLLM (`vllm/entrypoints/openai/api_server.py`, AuthenticationMiddleware) takes
its keys from `--api-key` (one or more) or the `VLLM_API_KEY` environment
variable. With a key set, a request (any method but OPTIONS) must carry
`Authorization: Bearer <one of the keys>` (the scheme is matched
case-insensitively); otherwise the answer is 401 with the body
`{"error": "Unauthorized"}`. The comparison is of SHA-256 digests with
`secrets.compare_digest`, so its time does not depend on how much of a wrong
key was right.

Stricter than vLLM, which checks only paths under `/v1`: here every route the
engine serves needs the key except the three documented open ones, so the
dev-mode routes (`/reset_prefix_cache`, `/sleep`, `/wake_up`, `/is_sleeping`)
and the loopback-only `/sim/` routes are not open to every local user of a
node. A path the engine does not serve stays a 404 with or without the key.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Mapping, Sequence

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

ENV_VAR = "VLLM_API_KEY"
# What a probe or a scrape reaches without the key (docs/security.md).
OPEN_PATHS = frozenset({"/health", "/metrics", "/version"})
UNAUTHORIZED_BODY = b'{"error":"Unauthorized"}'


def keys_from(flag: Sequence[str] | None, env: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """The keys in force: the flag's, else the environment's; () when none (open)."""
    if flag:
        return tuple(flag)
    value = env.get(ENV_VAR)
    return (value,) if value else ()


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


class KeyCheck:
    def __init__(self, keys: Sequence[str]) -> None:
        self._digests = tuple(_digest(k) for k in keys)

    def allows(self, authorization: str | None) -> bool:
        if not authorization:
            return False
        scheme, _, param = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return False
        got = _digest(param)
        ok = False
        for d in self._digests:
            ok |= secrets.compare_digest(got, d)
        return ok


def middleware(keys: Sequence[str]) -> Middleware:
    check = KeyCheck(keys)

    @web.middleware
    async def require_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        if (
            request.method != "OPTIONS"
            and request.path not in OPEN_PATHS
            # No route (404, 405): nothing to guard, and the answer says nothing.
            and request.match_info.http_exception is None
            and not check.allows(request.headers.get("Authorization"))
        ):
            return web.Response(status=401, body=UNAUTHORIZED_BODY, content_type="application/json")
        return await handler(request)

    return require_key
