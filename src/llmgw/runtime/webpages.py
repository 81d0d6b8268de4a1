"""What a web page in the operator's browser may not ask of a server of ours.

A server that no token guards (a controller without `--token`, a router's admin routes
without `admin_token`, the agent's API) trusts that only local programs reach it. A page
the operator opens is not one, and has two ways in (docs/hardening.md, web pages):

- a write: the browser POSTs `text/plain`, or no body, to any address without a
  preflight. Browsers mark what they send with `Origin` (every cross-site POST and
  DELETE) and `Sec-Fetch-Site`; no program of ours sends either, and the status page
  only reads, so a write carrying one is refused (`write_refusal`).
- a read, by DNS rebinding: the page's own host name is made to resolve to 127.0.0.1,
  which makes the server same-origin to the page, so it reads every answer. The browser
  still sends the page's name in `Host`, so a tokenless server answers only the names it
  has (`OwnNames`): IP literals (a page at an IP is cross-origin to every other IP),
  `localhost` (browsers resolve it themselves), the name it was bound to, and what the
  operator allowed (`allowed_hosts`). A request with a token is never asked: a page
  cannot know the token.

Each program turns a refusal into its own 403 (the router only on its admin routes:
clients reach `/v1` by any name, and that path pays nothing).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass

# Methods that change nothing (OPTIONS: a browser's preflight).
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# `allowed_hosts` entry that turns the Host check off (a tokenless server behind a proxy).
ANY_HOST = "*"
_NAME = re.compile(r"[a-z0-9_]([a-z0-9_.-]*)", re.ASCII | re.IGNORECASE)


def write_refusal(method: str, headers: Mapping[str, str]) -> str | None:
    """Why this request is a write a browser made, or None. `headers`: case-insensitive.

    Any value is refused, same-origin included: a rebound name makes a hostile page
    same-origin. It holds with a token too, which costs nothing: programs never send
    these headers.
    """
    if method in SAFE_METHODS:
        return None
    if "Origin" in headers or "Sec-Fetch-Site" in headers:
        return (
            "a write from a web page is refused (it carries a browser's Origin or "
            "Sec-Fetch-Site); use llmgw ctl or the API"
        )
    return None


def host_name(header: str) -> str:
    """The name a Host header names, as compared: no port, no IPv6 brackets, lower case,
    no trailing dot (`localhost.` is `localhost`). A malformed header comes back whole,
    to match nothing."""
    h = header.strip().lower()
    if h.startswith("["):
        end = h.find("]")
        if end == -1 or (h[end + 1 :] and not h[end + 1 :].startswith(":")):
            return h
        return h[1:end]
    if h.count(":") == 1:
        h = h.partition(":")[0]
    return h.removesuffix(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.split("%", 1)[0])
    except ValueError:
        return False
    return True


def host_problem(name: str) -> str | None:
    """Why `name` cannot be an `allowed_hosts` entry (a bare host name, or `*`), or None."""
    if name == ANY_HOST or _NAME.fullmatch(name):
        return None
    return f"{name[:100]!r}: expected a host name without a port (or {ANY_HOST} for any)"


@dataclass(frozen=True, slots=True, kw_only=True)
class OwnNames:
    """The Host names a server answers without a token.

    `bind`: the address it listens on, when that is a name (None or an IP adds nothing);
    `allowed`: the operator's `allowed_hosts` (`*`: every name).
    """

    bind: str | None = None
    allowed: Collection[str] = ()

    def allows(self, host: str | None) -> bool:
        """Whether a tokenless answer may go to a request with this Host header.

        None or empty passes: browsers always send a Host, an HTTP/1.0 program may not.
        """
        if not host:
            return True
        name = host_name(host)
        if not name or name == "localhost" or _is_ip(name):
            return True
        if self.bind is not None and name == host_name(self.bind):
            return True
        return any(a == ANY_HOST or host_name(a) == name for a in self.allowed)

    def refusal(self, host: str | None) -> str | None:
        """Why a tokenless server does not answer this Host, or None when it does."""
        if self.allows(host):
            return None
        name = host_name(host or "")
        return (
            f"Host {name[:100]!r} is not a name of this server: without a token it answers "
            "IP addresses, localhost, its listen address and its allowed_hosts only (a web "
            "page can point a name of its own at this address)"
        )
