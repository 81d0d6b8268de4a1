"""Loaded into vLLM by the agent: every route but the open probes needs the engine's key.

vLLM's own `--api-key` (VLLM_API_KEY) guards only paths under /v1, /v2,
/inference and /cohere; the development routes that sleep mode needs
(`/sleep`, `/wake_up`, `/is_sleeping`, with VLLM_SERVER_DEV_MODE=1) and the
others dev mode adds would answer anyone who reaches the port. The agent
starts a sleep-mode vLLM with `--middleware llmgw_vllm_guard.Guard` and this
folder on PYTHONPATH, so those routes take the same key as the rest
(docs/security.md). Plain ASGI, standard library only: it runs inside vLLM's
interpreter, where llmgw is not installed.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

# What a prober may read without the key, as vLLM leaves it open.
OPEN = frozenset({"/health", "/ping", "/metrics", "/version", "/load"})
BODY = b'{"error":"Unauthorized"}'


def _digests(env: MutableMapping[str, str] | None = None) -> tuple[bytes, ...]:
    key = (os.environ if env is None else env).get("VLLM_API_KEY", "")
    return (hashlib.sha256(key.encode()).digest(),) if key else ()


class Guard:
    """ASGI middleware: 401 for a request without `Authorization: Bearer <key>`."""

    def __init__(self, app: App, *, env: MutableMapping[str, str] | None = None) -> None:
        self.app = app
        self._digests = _digests(env)

    def allows(self, authorization: bytes | None) -> bool:
        if not authorization:
            return False
        scheme, _, param = authorization.decode("latin-1").partition(" ")
        if scheme.lower() != "bearer":
            return False
        got = hashlib.sha256(param.encode("latin-1")).digest()
        ok = False
        for d in self._digests:
            ok |= secrets.compare_digest(got, d)
        return ok

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope.get("type") == "http"
            and scope.get("method") != "OPTIONS"
            and self._digests
            and scope.get("path") not in OPEN
        ):
            headers = dict(scope.get("headers") or ())
            if not self.allows(headers.get(b"authorization")):
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"content-type", b"application/json")],
                    }
                )
                await send({"type": "http.response.body", "body": BODY})
                return
        await self.app(scope, receive, send)
