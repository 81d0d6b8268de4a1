"""The status page (docs/status-page.md): static files, and one read-only data route.

`GET /status` is the page, `GET /status/static/{file}` its script and style,
shipped in the package (controller/status/) and served as they are: no build
step, no CDN, nothing fetched from elsewhere. They hold no data and need no
token. The page polls `GET /admin/status` with the token the operator gave it
(admin or read-only): the summary `ctl status --json` prints, plus nodes,
models, replicas and recent events as compact rows, all from one
api/fleetview.py pass so the page and `ctl status` agree.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import msgspec
from aiohttp import web

from llmgw.controller.api.fleetview import fleet_view
from llmgw.controller.api.metrics import CONTENT_TYPE, ControllerMetrics
from llmgw.controller.api.services import Services

_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
EVENTS_SHOWN = 50
_encoder = msgspec.json.Encoder()


def _file(name: str) -> bytes:
    return resources.files("llmgw.controller").joinpath("status", name).read_bytes()


class StatusFiles:
    """The page's files, read from the package once."""

    def __init__(self) -> None:
        self.files = {n: _file(n) for n in ("index.html", "status.js", "status.css")}

    def response(self, name: str) -> web.Response:
        body = self.files.get(name)
        if body is None:
            raise web.HTTPNotFound()
        ctype = _TYPES[name[name.rfind(".") :]]
        return web.Response(
            body=body,
            content_type=ctype,
            charset="utf-8",
            headers={
                "Cache-Control": "no-cache",
                # Only our own files; nothing inline, nothing from elsewhere. And never
                # inside another site's frame: the page holds the operator's token, and a
                # framing page could overlay it and have the operator click through
                # (frame-ancestors; X-Frame-Options for browsers without CSP level 2).
                "Content-Security-Policy": (
                    "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"
                ),
                "X-Frame-Options": "DENY",
                "X-Content-Type-Options": "nosniff",
            },
        )


async def status_data(s: Services) -> dict[str, Any]:
    v = fleet_view(s)
    found = await s.events(model=None, replica=None, node=None, limit=EVENTS_SHOWN)
    nodes = [
        [
            n.name,
            n.state,
            "/".join(n.classes),
            "+".join(n.fabrics),
            n.gpu_total,
            n.gpu_total - n.gpu_free - len(n.unhealthy),
            n.gpu_free,
            len(n.unhealthy),
            None if n.last_heartbeat is None else round(v.now - n.last_heartbeat, 1),
        ]
        for n in sorted(v.nodes, key=lambda n: n.name)
    ]
    models = [
        [
            m.name,
            m.ready,
            m.total,
            m.desired,
            m.min,
            m.max,
            m.unplaceable_reason,
            v.waiting.get(m.name, 0),
        ]
        for m in sorted(v.models, key=lambda m: m.name)
    ]
    replicas = [
        [
            r.id,
            r.model,
            r.state,
            ",".join(sorted({sh.node for sh in r.shards})),
            r.idle_seconds,
            r.restarts,
            r.reason,
        ]
        for r in sorted(v.replicas, key=lambda r: r.id)
    ]
    events = [[e.at, e.kind, e.subject_id, e.model, e.message] for e in found]
    return {
        "now": v.now,
        "leading": v.leading,
        "summary": msgspec.to_builtins(v.summary),
        "waiting": v.waiting,
        "nodes": nodes,
        "models": models,
        "replicas": replicas,
        "events": events,
    }


def encode(doc: object) -> bytes:
    return _encoder.encode(doc)


__all__ = ["CONTENT_TYPE", "ControllerMetrics", "StatusFiles", "encode", "status_data"]
