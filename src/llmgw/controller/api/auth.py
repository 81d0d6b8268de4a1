"""Who may call what: the admin, read-only, metrics and scoped tokens.

The admin token may do anything; the read-only token may GET what READ_PATHS
and READ_PREFIXES name but engine logs (admin_only_get); the metrics token may GET
/metrics; an agent's token may only heartbeat (a node's token only as that node)
and the router's token may only read endpoints and post usage. A valid token in the
wrong place is 403 (Forbidden), a missing or wrong one 401 (TokenRejected). Tokens
are compared in constant time. A write from a web page (a browser's `Origin` or `Sec-Fetch-Site`) is
403 whatever its token (`refuse_web_writes`); without a token, so is a request whose
`Host` is not one of the controller's names (`refuse_foreign_host`: DNS rebinding).
"""

from __future__ import annotations

import hmac

from aiohttp import web

from llmgw.controller.config import ControllerConfig
from llmgw.controller.errors import Forbidden, TokenRejected
from llmgw.runtime.webpages import OwnNames, write_refusal

# Routes a client may call without the token: liveness, the API's own description, and
# the status page's static files (no data in them; the page fetches its data with a token).
OPEN_PATHS = frozenset({"/healthz", "/openapi.json", "/status", "/status/"})
OPEN_PREFIXES = ("/status/static/",)
# What the read-only token may GET (a read token on anything else is 403).
READ_PATHS = frozenset(
    {
        "/metrics",
        "/admin/summary",
        "/admin/status",
        "/admin/events",
        "/admin/keys",
        "/admin/usage",
    }
)
READ_PREFIXES = ("/admin/nodes", "/admin/models", "/admin/replicas")
# What the read token may not GET all the same: engine logs may hold prompts and what an
# engine was given (api/logs.py); admin token only.
ADMIN_ONLY_GETS = ("logs",)


def admin_only_get(path: str) -> bool:
    """True for a GET under a READ_PREFIXES the read token may not make
    (`/admin/replicas/{id}/logs`)."""
    parts = path.split("/")
    # "", "admin", "replicas", ID, "logs"
    return len(parts) == 5 and parts[1:3] == ["admin", "replicas"] and parts[4] in ADMIN_ONLY_GETS


# What the router token may call (method, path).
ROUTER_ROUTES = frozenset({("GET", "/v1/endpoints"), ("POST", "/v1/usage")})


def heartbeat_node(request: web.Request) -> str | None:
    """The node of a heartbeat route, or None for any other route."""
    parts = request.path.split("/")
    # "", "v1", "agents", NODE, "heartbeat"
    if request.method == "POST" and len(parts) == 5 and parts[1:3] == ["v1", "agents"]:
        return parts[3] if parts[4] == "heartbeat" else None
    return None


def scoped_token_allows(request: web.Request, given: bytes, cfg: ControllerConfig) -> bool:
    """True if a scoped token allows this request; Forbidden if it is one, but not here."""

    def same(token: str | None) -> bool:
        return token is not None and hmac.compare_digest(given, f"Bearer {token}".encode())

    node = heartbeat_node(request)
    if same(cfg.agent_token):
        if node is not None:
            return True
        raise Forbidden(f"the agent token may only heartbeat, not {request.method} {request.path}")
    for name, tok in cfg.node_tokens.items():
        if same(tok):
            if node == name:
                return True
            raise Forbidden(
                f"the token of node {name!r} may only heartbeat as {name!r}, "
                f"not {request.method} {request.path}"
            )
    if same(cfg.router_token):
        if (request.method, request.path) in ROUTER_ROUTES:
            return True
        raise Forbidden(
            "the router token may only read /v1/endpoints and post /v1/usage, "
            f"not {request.method} {request.path}"
        )
    return False


def refuse_web_writes(request: web.Request) -> None:
    """Forbidden for a write a browser made, whatever its token (runtime/webpages.py):
    a page on any site could apply a spec (what runs on the GPU nodes) or drain a node."""
    why = write_refusal(request.method, request.headers)
    if why is not None:
        raise Forbidden(f"{request.method} {request.path}: {why}")


def refuse_foreign_host(request: web.Request, names: OwnNames) -> None:
    """Forbidden for a tokenless request to a name that is not the controller's: a page
    that pointed its own name at 127.0.0.1 would read the fleet, keys' hashes, events."""
    why = names.refusal(request.headers.get("Host"))
    if why is not None:
        raise Forbidden(why)


def authorize(
    request: web.Request,
    token: str | None,
    read_token: str | None,
    metrics_token: str | None = None,
    *,
    scoped: ControllerConfig | None = None,
    names: OwnNames | None = None,
) -> None:
    """The admin token may do anything; the read token may GET what READ_PATHS name;
    the metrics token may GET /metrics, which then needs a token even without `token`.

    `names`: the Host names a tokenless controller answers (None: any; the caller's
    choice in unit tests of tokens). A controller with a token answers its open routes
    by any name: they carry no fleet data, and probes and proxies use names."""
    refuse_web_writes(request)
    path = request.path
    # aiohttp passes header bytes that are not UTF-8 on as surrogate escapes: back to
    # the bytes sent (a wrong token), never a UnicodeEncodeError (a 500 anyone can cause).
    given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
    if path == "/metrics" and metrics_token is not None:
        if hmac.compare_digest(given, f"Bearer {metrics_token}".encode()):
            return
        if token is None:
            raise TokenRejected(
                "/metrics needs the metrics token" if given else "a bearer token is required"
            )
    if token is None:
        if names is not None:
            refuse_foreign_host(request, names)
        return
    if path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
        return
    if hmac.compare_digest(given, f"Bearer {token}".encode()):
        return
    if metrics_token is not None and hmac.compare_digest(given, f"Bearer {metrics_token}".encode()):
        # A valid token in the wrong place, as the other scoped tokens answer.
        raise Forbidden(f"the metrics token may only GET /metrics, not {request.method} {path}")
    if read_token is not None and hmac.compare_digest(given, f"Bearer {read_token}".encode()):
        readable = path in READ_PATHS or path.startswith(READ_PREFIXES)
        if request.method in ("GET", "HEAD") and readable and not admin_only_get(path):
            return
        raise Forbidden(f"the read-only token may not {request.method} {path}")
    if scoped is not None and scoped_token_allows(request, given, scoped):
        return
    raise TokenRejected("missing or wrong bearer token" if given else "a bearer token is required")
