"""HTTP routes of client keys: `/admin/keys` (docs/tenants.md).

The admin token creates and revokes; the read-only token lists, in pages by name
(pages.py; the list never holds a key or its hash, and shows each limited key's
shares across routers).
Routers read hashes and limits with the endpoint list, never here. Errors leave
through routes._errors like every other route's.
"""

from __future__ import annotations

from aiohttp import web

from llmgw.controller.api import pages
from llmgw.controller.api.decode import decode
from llmgw.controller.api.routes import SERVICES, json_response
from llmgw.controller.errors import InvalidRequest
from llmgw.controller.fleet.keys import key_view
from llmgw.wire.keys import KeyCreate, KeyRevoked
from llmgw.wire.names import label_problem


async def list_keys(request: web.Request) -> web.Response:
    """A page of live keys by name (pages.py); a revoked key's tombstone is never shown."""
    s = request.app[SERVICES]
    at = pages.cursor(request, pages.KEY_NAMES)
    keys = s.fleet.state.keys
    shown, more = pages.page(sorted(keys), at, keep=lambda n: keys[n].live)
    # Each limited key's shares as this controller last leased them (a standby, or a
    # controller just started, has leased none yet: the list shows none).
    leased = s.leases.by_key()
    views = [key_view(keys[n], leased.get(keys[n].key.sha256.lower())) for n in shown]
    return json_response(views, headers=pages.next_link(request, shown, at, more=more))


async def create_key(request: web.Request) -> web.Response:
    req = decode(await request.read(), KeyCreate, what="key request")
    created = await request.app[SERVICES].create_key(req)
    return json_response(created, status=201)


async def revoke_key(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    why = label_problem(name)
    if why is not None:
        raise InvalidRequest(f"key name: {why}", param="name")
    if await request.read():
        raise InvalidRequest("revoke request: takes no body", param="body")
    await request.app[SERVICES].revoke_key(name)
    return json_response(KeyRevoked(revoked=name))


def routes() -> list[web.RouteDef]:
    return [
        web.get("/admin/keys", list_keys),
        web.post("/admin/keys", create_key),
        web.delete("/admin/keys/{name}", revoke_key),
    ]
